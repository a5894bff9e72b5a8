"""Writing requests to the engine process without waiting on it: ``EngineWriter``.

A request goes to the engine process as bytes over a pipe, and a write waits while the pipe
is full until the engine process reads. A long branch's prompt is half a megabyte
(10,000 messages: 509 KB, sent for the context count and again for the prewarm), several
times what the pipe holds, and the engine process reads it on a thread that competes for
its own GIL with the template rendering of the request before: the UI thread waited 6-40 ms
per write. A small request may wait too: a write that returned has only filled the pipe,
and the engine process may not have read it yet. So requests are written by a thread of
their own, in order; only a request that the pipe has room for, with nothing before it
waiting, is written at once (Enter's request then reaches the engine without waiting for
the writer's thread to get the GIL from a busy UI thread). Whether the pipe has room is
known on Linux (``socket_room``): a Unix socket polls as writable only while at most a
quarter of its send buffer holds bytes its reader has not read (measured: writable up to
45 KB queued of a 208 KB buffer; a 64 KB write then returned at once).
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import sys
import threading
from collections.abc import Callable

from app.window.workers.tasks import Task, Workers

log = logging.getLogger(__name__)

_STOP = object()


def socket_room(fd: int) -> Callable[[int], bool] | None:
    """For the socket ``fd`` (the engine pipe, a Unix socket pair on Linux): a test whether a
    write of ``n`` bytes returns at once (``n`` at most a quarter of its send buffer, and the
    socket polls writable). None where that cannot be told (other systems: every request goes
    to the writer's thread)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as probe:  # a duplicate, closed here
            limit = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
    except (OSError, ValueError):
        return None

    def room(n: int) -> bool:
        try:
            return n <= limit and bool(poller.poll(0))
        except (OSError, ValueError):
            return False

    return room


class EngineWriter:
    """Writes the pickled requests given to ``send`` with ``write(bytes)`` (the engine process's
    ``send_packed``) on a thread of its own, in the order given: the caller never waits on the
    pipe. A request for which ``room(len)`` is True (``socket_room``) while nothing waits
    before it is written at once, and so is every request once ``workers`` is closed.

    ``send`` is for the UI thread. A write that fails on the writer's thread (the engine
    process is gone) calls ``failed(exception)`` on the UI thread, and nothing more is
    written. ``close(timeout_s)`` writes what was given before it, then ends the thread."""

    def __init__(self, write: Callable[[bytes], None], workers: Workers, failed: Callable[[Exception], None],
                 room: Callable[[int], bool] | None = None):
        self._write, self._room = write, room
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0  # requests given to the thread and not yet written
        self._broken = False
        self._task: Task | None = workers.start(self._run, name="engine-writer", progress=failed)

    @property
    def waiting(self) -> int:
        """How many requests are given to the writer's thread and not written yet."""
        with self._lock:
            return self._waiting

    def send(self, blob: bytes) -> None:
        """Write ``blob`` now when the pipe has room for it and nothing waits before it, else
        hand it to the writer's thread (a failure there goes to ``failed``). A write made now
        raises as ``write`` does (OSError, EOFError, ValueError)."""
        with self._lock:
            now = self._task is None or (self._waiting == 0 and self._room is not None
                                         and self._room(len(blob) + 8))  # and its length header
            if not now:
                self._waiting += 1
        if now:
            self._write(blob)
        else:
            self._queue.put(blob)

    def close(self, timeout_s: float) -> bool:
        """Let the thread write what it was given, then end; wait at most ``timeout_s`` seconds.
        True when it has ended (a write the engine process never reads keeps it until the
        process is killed: the write then fails)."""
        if self._task is None:
            return True
        self._queue.put(_STOP)
        return self._task.wait(timeout_s)

    def _run(self, task: Task) -> None:
        while not task.cancelled.is_set():
            try:
                blob = self._queue.get(timeout=0.25)
            except queue.Empty:
                continue
            if blob is _STOP:
                return
            try:
                if not self._broken:
                    self._write(blob)
            except (OSError, EOFError, ValueError) as exc:
                self._broken = True  # the process is gone: the rest is not written
                log.warning("writing a request to the engine failed: %s", exc)
                task.report(exc)
            finally:
                with self._lock:
                    self._waiting -= 1
