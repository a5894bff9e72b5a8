"""An MCP test server over stdio, written with the official SDK (``mcp.server.mcpserver``,
FastMCP's name in mcp 2): ``echo`` answers its text, ``sleep`` sleeps ``seconds`` (past the
client's timeout in the tests), ``big`` returns ``megabytes`` MB of text, ``crash`` ends the
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
def sleep(seconds: float) -> str:
    """Sleep for some seconds, then answer."""
    time.sleep(seconds)
    return "awake"


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
