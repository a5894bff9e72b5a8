"""One live connection to one MCP server, kept for the window's lifetime (``McpHub``'s part).

A :class:`ServerConnection` is owned by one asyncio task on the hub's loop (the SDK's
context managers, ``stdio_client`` / ``streamable_http_client`` and ``ClientSession``, are
entered and left in that task, as anyio requires). :meth:`ServerConnection.start` spawns
the server (stdio) or connects (HTTP) and answers ``initialize``; then any task of the loop
may send requests on :attr:`ServerConnection.session` until the connection ends:

* :meth:`ServerConnection.close` (the hub closes it, or drops it after a call timed out):
  the SDK's shutdown runs (stdin closed, then the process group ended);
* the server's output ends (its process died): the owner task notices at once (a pump
  between the transport and the session sees the end) and ends the connection, so the next
  call starts the server again instead of writing into a dead pipe.

The stdio server's process (and its process group) is remembered (``processes``) so the
hub can kill it when a shutdown takes longer than its bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import StrEnum

__all__ = ["ConnectionState", "ServerConnection"]

log = logging.getLogger(__name__)


class ConnectionState(StrEnum):
    """Where a connection is in its life."""

    STARTING = "starting"
    READY = "ready"
    ENDED = "ended"  # closed by us, or the server ended (``died``), or it never started (``error``)


def _children() -> dict[int, object]:
    """This process's child processes (psutil ``Process`` objects by pid)."""
    import psutil  # noqa: PLC0415 - only when a stdio server starts

    return {p.pid: p for p in psutil.Process().children()}


class ServerConnection:
    """The connection to ``server`` (an ``McpServerConfig``). ``errlog``: the path stdio
    servers' stderr is appended to; ``connect_timeout_s``: seconds to start and initialize;
    ``spawn_lock``: an ``asyncio.Lock`` the hub's connections share, so the process each one
    spawned is told apart from the others'."""

    def __init__(self, server, errlog: str, connect_timeout_s: float, spawn_lock: asyncio.Lock):
        self.server, self.errlog, self.connect_timeout_s = server, errlog, connect_timeout_s
        self.state = ConnectionState.STARTING
        self.session = None  # mcp.client.session.ClientSession once READY
        self.error: BaseException | None = None  # why it could not start
        self.died = False  # the server ended by itself (not closed by us)
        self.processes: list = []  # psutil Process objects of the stdio server
        self.started_ms = 0.0  # start-up wall time (spawn + initialize)
        self._spawn_lock = spawn_lock
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._closing = False
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        """Start the owner task and wait until the server answered ``initialize``.

        Raises:
            BaseException: what made the start fail (the spawn's ``OSError``, a
                ``TimeoutError`` past ``connect_timeout_s``, a closed connection).
        """
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._own(), name=f"mcp:{self.server.name}")
        await self._ready.wait()
        if self.state is not ConnectionState.READY:
            raise self.error or ConnectionError("the connection closed")

    async def close(self) -> None:
        """End the connection and wait for the SDK's shutdown (the caller bounds the wait)."""
        self._closing = True
        self._stop.set()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self.task)

    @property
    def usable(self) -> bool:
        """True while requests may be sent (READY and its server still running)."""
        return self.state is ConnectionState.READY and not self._stop.is_set()

    async def _own(self) -> None:
        from mcp.client.session import ClientSession  # noqa: PLC0415 - the SDK loads only when a server is used

        t0 = time.perf_counter()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                read = await self._watched(stack, read)
                session = await stack.enter_async_context(ClientSession(read, write))
                async with asyncio.timeout(self.connect_timeout_s):
                    await session.initialize()
                self.session, self.state = session, ConnectionState.READY
                self.started_ms = (time.perf_counter() - t0) * 1000
                self._ready.set()
                log.info("MCP server %r ready in %.0f ms", self.server.name, self.started_ms)
                await self._stop.wait()
                self.died = not self._closing
                if self.died:
                    log.warning("MCP server %r ended by itself", self.server.name)
        except asyncio.CancelledError:
            self.error = self.error or ConnectionError("the connection was cancelled")
        except BaseException as exc:  # noqa: BLE001 - kept for the hub's sentence
            if self.state is ConnectionState.STARTING:
                self.error = exc
            else:
                self.died = self.died or not self._closing
            log.info("MCP server %r: %s", self.server.name, exc)
        finally:
            self.state, self.session = ConnectionState.ENDED, None
            self._stop.set()
            self._ready.set()

    async def _transport(self, stack: contextlib.AsyncExitStack):
        """The transport's (read, write) streams, entered in ``stack``."""
        server = self.server
        if server.url:
            from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

            async with asyncio.timeout(self.connect_timeout_s):
                streams = await stack.enter_async_context(streamable_http_client(server.url))
            return streams[0], streams[1]
        from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: PLC0415

        errlog = stack.enter_context(open(self.errlog, "a", encoding="utf-8"))  # noqa: SIM115
        errlog.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting the MCP server '{server.name}': "
                     f"{server.where}\n")
        errlog.flush()
        params = StdioServerParameters(command=server.command, args=list(server.args), env=dict(server.env) or None)
        async with self._spawn_lock:  # the child that appears meanwhile is this server
            before = _children()
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            self.processes = [p for pid, p in _children().items() if pid not in before]
        return streams[0], streams[1]

    async def _watched(self, stack: contextlib.AsyncExitStack, read):
        """A stream that passes on what ``read`` gives and ends the connection when it ends
        (the server's output closed: it died)."""
        import anyio  # noqa: PLC0415 - with the SDK

        send, receive = anyio.create_memory_object_stream(0)

        async def pump() -> None:
            try:
                async with send:
                    async for item in read:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
            finally:
                self._stop.set()

        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)  # left before the group: the pump must not hold it open
        group.start_soon(pump)
        return receive
