"""The one way the window runs work off the UI thread: ``Workers.start`` (after superqt's
``thread_worker`` and Anki's ``QueryOp``).

A task is a function run on a daemon thread of its own. ``fn(task)`` may call
``task.report(value)`` (each value delivered to ``progress`` on the UI thread, in order;
a task that reads a stream reports every item) and should stop soon after
``task.cancelled`` (a ``threading.Event``) is set. What it returns goes to
``success(result)``, what it raises to ``failure(exception)``, both on the UI thread;
without ``failure`` the one error path logs the exception with its traceback.

Shutdown: ``Workers.shutdown(timeout_s)`` (the window's close) cancels every task, waits
for all of them within one bound, and drops whatever they would still deliver, so no
callback runs on a window that has closed. A task still running after the bound is
logged by name; its thread is a daemon and ends with the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)

SHUTDOWN_S = 30.0
"""How long the window's close waits for its tasks, all together (seconds). A chat
reader's job (a 10,000-message branch laid out in a quarter of a second), a cancelled
import (it rolls back the file being read) and a scrub of deleted text end well within it."""

_PROGRESS, _SUCCEEDED, _FAILED = range(3)


class Task(QObject):
    """``fn(task)`` on a daemon thread named ``name``; create it on the UI thread.

    Signals (UI thread): ``progressed(value)`` for each ``report``, then ``succeeded(result)``
    or ``failed(exception)``, then ``finished()``. Nothing is emitted after ``drop()``."""

    progressed = Signal(object)
    succeeded = Signal(object)
    failed = Signal(object)
    finished = Signal()
    _relay = Signal(int, object)  # emitted on the worker thread: queued to this object's thread

    def __init__(self, fn: Callable[["Task"], Any], name: str, parent: QObject | None = None):
        super().__init__(parent)
        self.name = name
        self.cancelled = threading.Event()
        self._fn = fn
        self._dropped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._relay.connect(self._on_relay)

    def start(self) -> "Task":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """True while ``fn`` runs (or before ``start``)."""
        return self._thread.is_alive() or self._thread.ident is None

    def report(self, value: object) -> None:
        """From ``fn``: deliver ``value`` to ``progressed`` on the UI thread."""
        self._emit(_PROGRESS, value)

    def cancel(self) -> None:
        """Ask ``fn`` to stop (sets ``cancelled``); what it delivers still arrives."""
        self.cancelled.set()

    def drop(self) -> None:
        """Cancel and deliver nothing more (the receiver is going away)."""
        self._dropped = True
        self.cancelled.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for ``fn`` to return, at most ``timeout_s`` seconds (None: no bound); True when
        it has. Call it from the UI thread: what it delivers arrives after, as events."""
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            result = self._fn(self)
        except Exception as exc:  # noqa: BLE001 - a worker thread: delivered, never raised into Qt
            self._emit(_FAILED, exc)
        else:
            self._emit(_SUCCEEDED, result)

    def _emit(self, kind: int, value: object) -> None:
        if self._dropped:
            return
        try:
            self._relay.emit(kind, value)
        except RuntimeError:  # the Qt object is gone (its window was deleted): nobody to tell
            self._dropped = True

    def _on_relay(self, kind: int, value: object) -> None:
        if self._dropped:
            return
        if kind == _PROGRESS:
            self.progressed.emit(value)
            return
        (self.succeeded if kind == _SUCCEEDED else self.failed).emit(value)
        self.finished.emit()


def log_failure(name: str, exc: BaseException) -> None:
    """The error path of a task started without ``failure``: a warning with the traceback."""
    log.warning("background task %s failed: %s", name, exc, exc_info=exc)


class Workers(QObject):
    """The tasks of one window. ``start`` runs one; ``shutdown`` ends them all (see the
    module docstring). ``closed`` is True after ``shutdown``: ``start`` then refuses."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._tasks: set[Task] = set()
        self.closed = False

    def start(self, fn: Callable[[Task], Any], *, name: str, success: Callable[[Any], None] | None = None,
              failure: Callable[[Exception], None] | None = None,
              progress: Callable[[Any], None] | None = None) -> Task | None:
        """Run ``fn(task)`` on a new daemon thread named ``name``; ``success``, ``failure`` and
        ``progress`` are called on the UI thread. Returns the task (None once closed)."""
        if self.closed:
            return None
        task = Task(fn, name, self)
        if progress is not None:
            task.progressed.connect(progress)
        if success is not None:
            task.succeeded.connect(success)
        task.failed.connect(failure if failure is not None else (lambda exc: log_failure(name, exc)))
        task.finished.connect(lambda: self._tasks.discard(task))
        self._tasks.add(task)
        return task.start()

    @property
    def running(self) -> list[str]:
        """The names of the tasks still running."""
        return sorted(t.name for t in self._tasks if t.alive)

    def shutdown(self, timeout_s: float = SHUTDOWN_S) -> list[str]:
        """Cancel every task, drop what it would deliver, and wait for all within
        ``timeout_s`` seconds in total; returns the names of those still running (logged)."""
        self.closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.drop()
        deadline = time.monotonic() + timeout_s
        for task in tasks:
            task.wait(max(0.0, deadline - time.monotonic()))
        self._tasks.clear()
        alive = sorted(t.name for t in tasks if t.alive)
        if alive:
            log.warning("still running %.0f s after the window closed: %s", timeout_s, ", ".join(alive))
        return alive


def run_detached(fn: Callable[[], Any], name: str) -> threading.Thread:
    """``fn()`` on a daemon thread that no window waits for and that delivers nothing (work
    for the whole process, such as compiling lexers ahead); an exception goes to the same
    error path as a task's (``log_failure``). Returns the thread (join it to wait)."""
    def run() -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a worker thread: logged, never raised
            log_failure(name, exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
