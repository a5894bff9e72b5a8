"""Reading ``chats.sqlite3`` off the UI thread: ``ChatReader``.

The UI thread never does work in proportion to a conversation (a 10,000-message branch
takes a quarter of a second to read and lay out). Such work is a *job*: a function of a
``ChatStore`` that runs on one worker thread with a connection of its own (WAL mode: it
sees every committed change, and never waits for the UI thread's lock). The thread is a
task of the window's ``Workers`` (tasks.py): its results come back on the UI thread as the
task's progress, and the window's close waits for it with the others.

Jobs have a *key* ("tree", "search", ...): a newer job with the same key supersedes an
older one, which is skipped if it has not started and whose result is dropped if it has.

The jobs submitted during one turn of the event loop are handed to the worker, in order,
when the loop comes back (a zero timer): the worker's Python never competes for the GIL
with the turn that asked for it (opening a chat draws its transcript first), and jobs
superseded within the turn never start. ``hold(True)`` keeps them a while longer, while
the UI thread draws the first screen of a chat (``TranscriptView.filling_changed``): every
call the UI thread makes into Python waits for the GIL while the worker runs Python, and
the turns that build a bubble took two to three times their CPU time (50-120 ms) while a
10,000-message branch's tree and prompt were read beside them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer

from app.window.workers.tasks import Task, Workers
from storage.chats import ChatStore

log = logging.getLogger(__name__)

_STOP = object()
HOLD_MAX_MS = 500
"""The longest ``hold(True)`` keeps jobs from the worker (milliseconds): then they go anyway."""


class ChatReader(QObject):
    """Runs jobs on a worker thread with its own connection to the database at ``path``.

    ``submit(key, job, done, failed=None)``: ``job(store)`` runs on the worker; ``done(result)``
    (or ``failed(exception)``, else a log line) is called on the UI thread, unless a newer job
    with the same key was submitted meanwhile. The thread (a task of ``workers``) starts with
    the first job; ``close()`` ends it after the job it runs (``Workers.shutdown`` waits for
    that) and it closes its connection."""

    def __init__(self, path: Path, workers: Workers, parent: QObject | None = None):
        super().__init__(parent)
        self.path = Path(path)
        self._workers = workers
        self._jobs: queue.Queue = queue.Queue()
        self._task: Task | None = None
        self._latest: dict[str, int] = {}  # key -> generation of the newest job
        self._callbacks: dict[str, tuple[Callable[[Any], None], Callable[[Exception], None] | None]] = {}
        self._lock = threading.Lock()
        self._held: list[tuple[str, int, Callable[[ChatStore], Any]]] = []  # submitted this turn
        self._release = QTimer(self, singleShot=True, interval=0)
        self._release.timeout.connect(self._hand_over)
        self._holding = False
        self._hold_limit = QTimer(self, singleShot=True, interval=HOLD_MAX_MS)
        self._hold_limit.timeout.connect(lambda: self.hold(False))
        self.closed = False

    def submit(self, key: str, job: Callable[[ChatStore], Any], done: Callable[[Any], None],
               failed: Callable[[Exception], None] | None = None) -> int:
        """Queue ``job`` (call it on the UI thread); the worker gets it when the event loop next
        runs. ``pending(key)`` is True from now. Returns its generation (increasing per key).
        Does nothing once closed."""
        if self.closed:
            return 0
        with self._lock:
            generation = self._latest.get(key, 0) + 1
            self._latest[key] = generation
        self._callbacks[key] = (done, failed)
        if self._task is None:
            self._task = self._workers.start(self._run, name="chat-reader", progress=self._deliver)
            if self._task is None:  # the window is closing
                self._callbacks.pop(key, None)
                return 0
        self._held.append((key, generation, job))
        self._release.start()
        return generation

    @property
    def held(self) -> int:
        """How many jobs are submitted but not yet handed to the worker (this turn's)."""
        return len(self._held)

    @property
    def holding(self) -> bool:
        """True while ``hold(True)`` keeps the submitted jobs from the worker."""
        return self._holding

    def hold(self, on: bool) -> None:
        """Keep the jobs submitted from now on (``on``) from the worker, or hand them over
        when the event loop next runs (not ``on``, or ``HOLD_MAX_MS`` after the hold began).
        A job the worker runs already goes on; superseded jobs are dropped as ever."""
        if on == self._holding:
            return
        self._holding = on
        if on:
            self._hold_limit.start()
            return
        self._hold_limit.stop()
        if self._held:
            self._release.start()

    def _hand_over(self) -> None:
        if self._holding:
            return  # ``hold(False)`` hands them over
        held, self._held = self._held, []
        for key, generation, job in held:
            if self._current(key, generation) and not self.closed:  # not superseded this turn
                self._jobs.put((key, generation, job))

    def pending(self, key: str) -> bool:
        """True while the newest job with ``key`` has not delivered its result."""
        return key in self._callbacks

    def cancel(self, key: str) -> None:
        """Drop the result of any job with ``key`` (queued or running)."""
        with self._lock:
            self._latest[key] = self._latest.get(key, 0) + 1
        self._callbacks.pop(key, None)

    def close(self) -> None:
        """Ask the worker thread to end after the job it runs (closing its connection);
        results not yet delivered are dropped. ``Workers.shutdown`` waits for it."""
        if self.closed:
            return
        self.closed = True
        self._callbacks.clear()
        self._held.clear()
        self._release.stop()
        self._hold_limit.stop()
        if self._task is not None:
            self._task.drop()
            self._jobs.put(_STOP)

    def _current(self, key: str, generation: int) -> bool:
        with self._lock:
            return self._latest.get(key) == generation

    def _run(self, task: Task) -> None:
        store: ChatStore | None = None
        try:
            while (item := self._jobs.get()) is not _STOP:
                key, generation, job = item
                if not self._current(key, generation):
                    continue  # superseded before it started
                try:
                    if store is None:
                        store = ChatStore(self.path)
                    result, ok = job(store), True
                except Exception as exc:  # noqa: BLE001 - a worker thread: reported, never raised
                    result, ok = exc, False
                if self._current(key, generation) and not self.closed:
                    task.report((key, generation, ok, result))
        finally:
            if store is not None:
                store.close()

    def _deliver(self, item: tuple[str, int, bool, object]) -> None:
        key, generation, ok, result = item
        if self.closed or not self._current(key, generation) or key not in self._callbacks:
            return
        done, failed = self._callbacks.pop(key)
        if ok:
            done(result)
        elif failed is not None:
            failed(result)
        else:
            log.warning("reading the chats (%s) failed: %s", key, result)
