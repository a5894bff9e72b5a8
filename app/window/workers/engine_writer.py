"""Writing requests to the engine process without waiting on it: ``EngineWriter``.

A request goes to the engine process as bytes over a pipe, and a write waits while the pipe
is full until the engine process reads. A long branch's prompt is half a megabyte
(10,000 messages: 509 KB, sent for the context count and again for the prewarm), several
times what the pipe holds, and the engine process reads it on a thread that competes for
its own GIL with the template rendering of the request before: the UI thread waited 6-40 ms
per write. A small request cannot be written at once either: a write that returned has
only filled the pipe, and the engine process may not have read it (a 16-byte request waited
0.1-0.5 s behind a prompt the engine process was slow to read). So every request is
written by a thread of its own, in order.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from app.window.workers.tasks import Task, Workers

log = logging.getLogger(__name__)

_STOP = object()


class EngineWriter:
    """Writes the pickled requests given to ``send`` with ``write(bytes)`` (the engine process's
    ``send_packed``) on a thread of its own, in the order given: the caller never waits on the
    pipe (when ``workers`` is closed already, ``send`` writes at once).

    ``send`` is for the UI thread. A write that fails on the writer's thread (the engine
    process is gone) calls ``failed(exception)`` on the UI thread, and nothing more is
    written. ``close(timeout_s)`` writes what was given before it, then ends the thread."""

    def __init__(self, write: Callable[[bytes], None], workers: Workers, failed: Callable[[Exception], None]):
        self._write = write
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
        """Hand ``blob`` to the writer's thread (a failure goes to ``failed``). Without a thread
        (``workers`` was closed) it is written now, raising as ``write`` does (OSError,
        EOFError, ValueError)."""
        if self._task is None:
            self._write(blob)
            return
        with self._lock:
            self._waiting += 1
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
