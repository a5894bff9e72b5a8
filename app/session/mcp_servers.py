"""MCP servers for the window's tool loop, through the official ``mcp`` SDK (issue #28, item 4).

* A server is a stdio command (``command`` + ``args`` + ``env``) or a streamable HTTP
  ``url``: :class:`McpServerConfig`, read from the ``mcp.json`` shape Claude Desktop,
  LM Studio and Cursor use (``{"mcpServers": {name: {"command", "args", "env"} | {"url"}}}``)
  by :func:`servers_from_mcp_json`.
* :class:`McpHub` runs one asyncio loop on a daemon thread of its own; every operation
  returns a ``concurrent.futures.Future`` at once, so the UI thread never waits on a
  server. Cancelling the future (Stop) cancels the call.
* Each operation opens its own connection (a stdio server is started, initialized, asked,
  and ended), so a server that hung or died in one call cannot wedge the next one; the
  price is the server's start-up per call.
* Bounds: a call gets :data:`CALL_TIMEOUT_S` (30 s) after the connection is up, the
  connection :data:`CONNECT_TIMEOUT_S` (30 s). A result enters the prompt cut to
  :data:`MAX_RESULT_BYTES` (32 KB of UTF-8), with a note saying so. A server that hangs,
  dies or cannot start is named in the :class:`ToolOutcome` error, which is the text the
  model gets back.

Tool results are hostile text: they are returned as plain strings, bounded, never parsed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from dataclasses import dataclass, field

__all__ = ["CALL_TIMEOUT_S", "CONNECT_TIMEOUT_S", "MAX_RESULT_BYTES", "McpHub", "McpServerConfig", "McpTool",
           "ToolOutcome", "bounded_text", "servers_from_mcp_json"]

CALL_TIMEOUT_S = 30.0
"""Seconds a tool call may take once its server is connected."""
CONNECT_TIMEOUT_S = 30.0
"""Seconds a server may take to start and answer ``initialize``."""
MAX_RESULT_BYTES = 32 * 1024
"""Bytes of UTF-8 of a tool's result that enter the prompt; the rest is cut, with a note."""


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server: a stdio ``command`` (with ``args``, ``env``) or an HTTP ``url``.

    ``disabled_tools`` are the tool names switched off in Settings (the rest are offered)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    disabled_tools: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """The command line or URL, for Settings and the approval dialog."""
        return self.url or " ".join([self.command, *self.args])

    def to_dict(self) -> dict:
        """The settings.json form (the ``mcp.json`` entry plus ``disabled_tools``)."""
        out: dict = {"url": self.url} if self.url else {"command": self.command, "args": list(self.args),
                                                         "env": dict(self.env)}
        if self.disabled_tools:
            out["disabled_tools"] = list(self.disabled_tools)
        return out

    @classmethod
    def from_dict(cls, name: str, entry: dict) -> McpServerConfig:
        """One ``mcpServers`` entry.

        Raises:
            ValueError: the entry has neither a string ``command`` nor a string ``url``, or
                ``args``/``env`` are not a list of strings / an object of strings.
        """
        if not isinstance(entry, dict):
            raise ValueError(f"The MCP server '{name}' is not an object.")
        url, command = entry.get("url") or entry.get("serverUrl") or "", entry.get("command") or ""
        if not isinstance(url, str) or not isinstance(command, str) or not (url or command):
            raise ValueError(f"The MCP server '{name}' needs a \"command\" or a \"url\".")
        args, env = entry.get("args") or [], entry.get("env") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"The \"args\" of the MCP server '{name}' must be a list of strings.")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"The \"env\" of the MCP server '{name}' must be an object of strings.")
        off = entry.get("disabled_tools") or []
        return cls(str(name), command, tuple(args), {str(k): v for k, v in env.items()}, url,
                   tuple(str(t) for t in off if isinstance(t, str)))


def servers_from_mcp_json(data) -> list[McpServerConfig]:
    """The servers of an ``mcp.json`` document (already parsed JSON), in its order.

    Raises:
        ValueError: no ``mcpServers`` object, or an entry that is not a server (the
            sentence names it).
    """
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError("The file has no \"mcpServers\" object (the mcp.json shape).")
    return [McpServerConfig.from_dict(name, entry) for name, entry in servers.items()]


@dataclass(frozen=True)
class McpTool:
    """One tool of a server: ``schema`` is its JSON schema for the arguments."""

    server: str
    name: str
    description: str
    schema: dict

    def to_openai(self) -> dict:
        """The OpenAI function object the chat template renders."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.schema or {"type": "object", "properties": {}}}}


@dataclass(frozen=True)
class ToolOutcome:
    """What one call came back with: ``text`` is what the model gets (bounded), ``error``
    the sentence when it failed (None: it ran; a tool's own error result also sets it),
    ``duration_ms`` wall time, ``cut_bytes`` how many bytes of the result were left out."""

    text: str
    error: str | None
    duration_ms: float
    cut_bytes: int = 0


def bounded_text(text: str, limit: int = MAX_RESULT_BYTES) -> tuple[str, int]:
    """``text`` cut to ``limit`` bytes of UTF-8 (at a character boundary) with a note saying
    so; returns (text, bytes left out)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, 0
    kept = data[:limit].decode("utf-8", "ignore")
    cut = len(data) - len(kept.encode("utf-8"))
    return f"{kept}\n[The result was cut to {limit // 1024} KB; {cut} more bytes were left out.]", cut


def result_text(result) -> str:
    """The text of a ``CallToolResult``: text parts joined, other parts named; a lone UTF-16
    surrogate a server sent (JSON's ``"\\ud800"``) becomes U+FFFD (``engine.tool_calls.as_text``)."""
    from engine.tool_calls import as_text

    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{kind} content: {getattr(item, 'mime_type', None) or getattr(item, 'uri', '')}]")
    return as_text("\n".join(parts))


def _leaf_errors(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    stack, out = [exc], []
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        else:
            out.append(e)
    return out


class McpHub:
    """The MCP servers' client side, on an asyncio loop of its own thread (see the module
    docstring). ``errlog``: where stdio servers' stderr goes (a path; None: discarded)."""

    def __init__(self, call_timeout_s: float = CALL_TIMEOUT_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 errlog: str | None = None):
        self.call_timeout_s, self.connect_timeout_s = call_timeout_s, connect_timeout_s
        self._errlog = errlog or os.devnull
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-servers", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop (calls still under way are cancelled with it)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def list_tools(self, server: McpServerConfig) -> concurrent.futures.Future:
        """The server's tools: a future of ``list[McpTool]``; it raises ``RuntimeError``
        with a sentence naming the server when it cannot be reached."""
        return asyncio.run_coroutine_threadsafe(self._list(server), self._loop)

    def call_tool(self, server: McpServerConfig, name: str, arguments: dict) -> concurrent.futures.Future:
        """Call ``name`` with ``arguments``: a future of :class:`ToolOutcome` (never raises
        but for cancellation; a hang, a death or a tool error is in ``ToolOutcome.error``)."""
        return asyncio.run_coroutine_threadsafe(self._call(server, name, arguments), self._loop)

    @contextlib.asynccontextmanager
    async def _session(self, server: McpServerConfig):
        from mcp.client.session import ClientSession  # noqa: PLC0415 - the SDK loads only when a server is used

        async with contextlib.AsyncExitStack() as stack:
            if server.url:
                from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

                streams = await stack.enter_async_context(streamable_http_client(server.url))
            else:
                from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: PLC0415

                errlog = stack.enter_context(open(self._errlog, "a", encoding="utf-8"))  # noqa: SIM115
                params = StdioServerParameters(command=server.command, args=list(server.args),
                                               env=dict(server.env) or None)
                streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            session = await stack.enter_async_context(ClientSession(*streams[:2]))
            async with asyncio.timeout(self.connect_timeout_s):
                await session.initialize()
            yield session

    def _failure(self, server: McpServerConfig, what: str, exc: BaseException) -> str:
        leaves = _leaf_errors(exc)
        if any(isinstance(e, TimeoutError) for e in leaves):
            return f"The MCP server '{server.name}' did not answer {what} within {self.call_timeout_s:g} s."
        text = "; ".join(str(e) or type(e).__name__ for e in leaves)
        if "Connection closed" in text or any(isinstance(e, (EOFError, BrokenPipeError)) for e in leaves):
            return f"The MCP server '{server.name}' ended during {what} (its connection closed)."
        return f"The MCP server '{server.name}' failed during {what}: {text}"

    async def _list(self, server: McpServerConfig) -> list[McpTool]:
        try:
            async with self._session(server) as session:
                async with asyncio.timeout(self.call_timeout_s):
                    listed = await session.list_tools()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - named for the user below
            raise RuntimeError(self._failure(server, "the list of its tools", exc)) from None
        return [McpTool(server.name, t.name, t.description or "", dict(t.input_schema or {})) for t in listed.tools]

    async def _call(self, server: McpServerConfig, name: str, arguments: dict) -> ToolOutcome:
        t0 = time.perf_counter()
        try:
            async with self._session(server) as session:
                async with asyncio.timeout(self.call_timeout_s):
                    result = await session.call_tool(name, arguments)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the model gets the sentence
            error = self._failure(server, f"the call to {name}", exc)
            return ToolOutcome(error, error, (time.perf_counter() - t0) * 1000)
        text, cut = bounded_text(result_text(result))
        ms = (time.perf_counter() - t0) * 1000
        error = f"The tool {name} of '{server.name}' returned an error." if getattr(result, "is_error", False) else None
        return ToolOutcome(text, error, ms, cut)
