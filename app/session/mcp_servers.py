"""MCP servers for the window's tool loop, through the official ``mcp`` SDK (issue #28, item 4).

* A server is a stdio command (``command`` + ``args`` + ``env``) or a streamable HTTP
  ``url``: :class:`McpServerConfig`, read from the ``mcp.json`` shape Claude Desktop,
  LM Studio and Cursor use (``{"mcpServers": {name: {"command", "args", "env"} | {"url"}}}``)
  by :func:`servers_from_mcp_json`.
* :class:`McpHub` runs one asyncio loop on a daemon thread of its own; every operation
  returns a ``concurrent.futures.Future`` at once, so the UI thread never waits on a
  server. Cancelling the future (Stop) cancels the call.
* One connection per server is kept for the hub's life (``app.session.mcp_sessions``):
  a stdio server is started at its first use (on the hub's thread) and every later call
  reuses it (a call costs milliseconds, not the seconds of a Python server's start-up).
  A server that ended by itself is started again, once, at the next call; one whose call
  timed out or failed is dropped (it may be stuck) and started again at the next call;
  a changed command line starts a new one. :meth:`McpHub.close` ends them all within
  :data:`CLOSE_BOUND_S` (2 s), then kills what is left with its process group.
* Bounds: a call gets :data:`CALL_TIMEOUT_S` (30 s) after the connection is up, the
  connection :data:`CONNECT_TIMEOUT_S` (30 s). A result enters the prompt cut to
  :data:`MAX_RESULT_BYTES` (32 KB of UTF-8), with a note saying so. A server that hangs,
  dies or cannot start is named in the :class:`ToolOutcome` error, which is the text the
  model gets back, with the log its stderr goes to.

Tool results are hostile text: they are returned as plain strings, bounded, never parsed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from app.session.mcp_sessions import ConnectionState, ServerConnection

log = logging.getLogger(__name__)

__all__ = ["CALL_TIMEOUT_S", "CLOSE_BOUND_S", "CONNECT_TIMEOUT_S", "MAX_RESULT_BYTES", "McpHub", "McpServerConfig",
           "McpTool", "ToolOutcome", "bounded_text", "servers_from_mcp_json"]

CALL_TIMEOUT_S = 30.0
"""Seconds a tool call may take once its server is connected."""
CONNECT_TIMEOUT_S = 30.0
"""Seconds a server may take to start and answer ``initialize``."""
CLOSE_BOUND_S = 2.0
"""Seconds the servers get to end after their stdin closed, when the hub closes; then killed."""
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
    def launch(self) -> tuple:
        """What starts the server (its name, command line, environment or URL): two configs
        with the same launch share a connection, whatever tools are switched off."""
        return (self.name, self.command, self.args, tuple(sorted(self.env.items())), self.url)

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
    docstring). ``errlog``: the file stdio servers' stderr is appended to (a path; None:
    discarded), named in the sentences about a server that hangs, dies or cannot start."""

    def __init__(self, call_timeout_s: float = CALL_TIMEOUT_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 errlog: str | os.PathLike | None = None):
        self.call_timeout_s, self.connect_timeout_s = call_timeout_s, connect_timeout_s
        self.errlog = str(errlog) if errlog else None
        self._live: dict[str, ServerConnection] = {}  # by server name; only the loop touches it
        self._ending: set[ServerConnection] = set()  # dropped connections whose shutdown runs
        self._lock: asyncio.Lock | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-servers", daemon=True)
        self._thread.start()

    # -- the caller's side (any thread) --------------------------------------------------

    def close(self, bound_s: float = CLOSE_BOUND_S) -> None:
        """Cancel the calls under way, close every connection and stop the loop. A server
        that has not ended ``bound_s`` seconds after its stdin closed is killed (with its
        process group), so this returns within about ``bound_s`` + 1 s. Safe to call twice."""
        if not self._loop.is_running():
            return
        done = asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
        try:
            done.result(bound_s)
        except BaseException:  # noqa: BLE001 - past the bound (or the loop broke): kill what is left
            for p in self.processes():
                _kill_tree(p)
            with contextlib.suppress(BaseException):
                done.result(1.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(1.0)

    def processes(self) -> list:
        """The psutil ``Process`` objects of the stdio servers running now (alive ones)."""
        conns = list(self._live.values()) + list(self._ending)
        return [p for c in conns for p in c.processes if _alive(p)]

    def keep_only(self, servers: list[McpServerConfig]) -> concurrent.futures.Future:
        """End the connections to servers not in ``servers`` (removed or changed in
        Settings): their processes are shut down in the background, as after a timeout.
        A future of the names dropped."""
        return asyncio.run_coroutine_threadsafe(self._keep_only(list(servers)), self._loop)

    def list_tools(self, server: McpServerConfig) -> concurrent.futures.Future:
        """The server's tools: a future of ``list[McpTool]``; it raises ``RuntimeError``
        with a sentence naming the server when it cannot be reached."""
        return asyncio.run_coroutine_threadsafe(self._list(server), self._loop)

    def call_tool(self, server: McpServerConfig, name: str, arguments: dict) -> concurrent.futures.Future:
        """Call ``name`` with ``arguments``: a future of :class:`ToolOutcome` (never raises
        but for cancellation; a hang, a death or a tool error is in ``ToolOutcome.error``)."""
        return asyncio.run_coroutine_threadsafe(self._call(server, name, arguments), self._loop)

    # -- on the loop ---------------------------------------------------------------------

    def _log_note(self, server: McpServerConfig) -> str:
        return f"; see its log {self.errlog}" if self.errlog and not server.url else ""

    async def _connection(self, server: McpServerConfig, what: str) -> ServerConnection:
        """The live connection to ``server``, started at its first use and again (once) when
        its server ended; one for a changed command line replaces the old one.

        Raises:
            RuntimeError: the server cannot start (the sentence names it and its log).
        """
        conn = self._live.get(server.name)
        if conn is not None and (conn.server.launch != server.launch
                                 or not (conn.usable or conn.state is ConnectionState.STARTING)):
            again = conn.died and conn.server.launch == server.launch
            self._drop(conn)
            conn = None
        else:
            again = False
        if conn is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            conn = ServerConnection(server, self.errlog or os.devnull, self.connect_timeout_s, self._lock)
            self._live[server.name] = conn
            if again:
                log.info("MCP server %r ended; starting it again", server.name)
        try:
            await conn.start()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - named for the user
            if self._live.get(server.name) is conn:
                self._live.pop(server.name)
            raise RuntimeError(self._start_failure(server, what, exc, again)) from None
        return conn

    async def _keep_only(self, servers: list[McpServerConfig]) -> list[str]:
        kept = {s.launch for s in servers}
        dropped = [c for c in self._live.values() if c.server.launch not in kept]
        for conn in dropped:
            log.info("MCP server %r is no longer in the settings: ending its connection", conn.server.name)
            self._drop(conn)
        return [c.server.name for c in dropped]

    def _drop(self, conn: ServerConnection) -> None:
        """Forget ``conn`` and close it in the background (``close`` waits for it)."""
        if self._live.get(conn.server.name) is conn:
            self._live.pop(conn.server.name)
        self._ending.add(conn)
        task = self._loop.create_task(conn.close())
        task.add_done_callback(lambda _t, c=conn: self._ending.discard(c))

    async def _close_all(self) -> None:
        current = asyncio.current_task()
        owners = {c.task for c in [*self._live.values(), *self._ending]}
        for task in asyncio.all_tasks():
            if task is not current and task not in owners:
                task.cancel()  # calls and listings under way
        for conn in list(self._live.values()):
            self._drop(conn)
        await asyncio.gather(*(c.close() for c in list(self._ending)), return_exceptions=True)

    def _start_failure(self, server: McpServerConfig, what: str, exc: BaseException, again: bool) -> str:
        leaves = _leaf_errors(exc)
        if any(isinstance(e, TimeoutError) for e in leaves):
            why = f"it did not answer initialize within {self.connect_timeout_s:g} s"
        else:
            why = "; ".join(str(e) or type(e).__name__ for e in leaves)
        head = "it had ended and could not be started again" if again else "it could not start"
        return f"The MCP server '{server.name}' failed during {what}: {head} ({why}){self._log_note(server)}."

    def _failure(self, server: McpServerConfig, what: str, exc: BaseException) -> str:
        leaves = _leaf_errors(exc)
        note = self._log_note(server)
        if any(isinstance(e, TimeoutError) for e in leaves):
            return f"The MCP server '{server.name}' did not answer {what} within {self.call_timeout_s:g} s{note}."
        text = "; ".join(str(e) or type(e).__name__ for e in leaves)
        if "Connection closed" in text or any(isinstance(e, (EOFError, BrokenPipeError, ConnectionError))
                                              for e in leaves):
            return f"The MCP server '{server.name}' ended during {what} (its connection closed){note}."
        return f"The MCP server '{server.name}' failed during {what}: {text}"

    async def _request(self, server: McpServerConfig, what: str, send):
        """``await send(session)`` on the server's live connection within the call bound.
        A connection whose request timed out or failed is dropped (the server may be stuck):
        the next request starts it again.

        Raises:
            RuntimeError: the server could not start, hung, died or failed (the sentence).
        """
        conn = await self._connection(server, what)
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await send(conn.session)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - named for the user below
            self._drop(conn)
            raise RuntimeError(self._failure(server, what, exc)) from None

    async def _list(self, server: McpServerConfig) -> list[McpTool]:
        listed = await self._request(server, "the list of its tools", lambda s: s.list_tools())
        return [McpTool(server.name, t.name, t.description or "", dict(t.input_schema or {})) for t in listed.tools]

    async def _call(self, server: McpServerConfig, name: str, arguments: dict) -> ToolOutcome:
        t0 = time.perf_counter()
        try:
            result = await self._request(server, f"the call to {name}", lambda s: s.call_tool(name, arguments))
        except RuntimeError as exc:
            return ToolOutcome(str(exc), str(exc), (time.perf_counter() - t0) * 1000)
        text, cut = bounded_text(result_text(result))
        ms = (time.perf_counter() - t0) * 1000
        error = f"The tool {name} of '{server.name}' returned an error." if getattr(result, "is_error", False) else None
        return ToolOutcome(text, error, ms, cut)


def _alive(process) -> bool:
    try:
        return process.is_running() and process.status() != "zombie"
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess, AccessDenied: not ours to kill
        return False


def _kill_tree(process) -> None:
    """Kill ``process`` (psutil) and its descendants; what is gone already is skipped."""
    try:
        victims = [*process.children(recursive=True), process]
    except Exception:  # noqa: BLE001 - it ended meanwhile
        return
    for p in victims:
        with contextlib.suppress(Exception):
            p.kill()
