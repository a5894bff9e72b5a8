"""An MCP test server over stdio, written with the official SDK (``mcp.server.mcpserver``,
FastMCP's name in mcp 2): ``echo`` answers its text, ``hang`` sleeps ten minutes (past the
client's timeout), ``big`` returns ``megabytes`` MB of text, ``crash`` ends the
server's process mid-call. Run as ``python tests/mcp_test_server.py``."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("branchwise-test")


@server.tool()
def echo(text: str) -> str:
    """Answer the text back."""
    return f"echo: {text}"


@server.tool()
def hang(note: str) -> str:
    """Sleep for ten minutes (past any client timeout), then answer."""
    time.sleep(600)
    return f"awake: {note}"


@server.tool()
def big(megabytes: int) -> str:
    """Return megabytes of text."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
def crash() -> str:
    """End the server's process in the middle of the call."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
