"""The window's handle on the engine child process, as Qt signals.

``engine.worker.EngineProcess`` speaks plain dicts over a pipe. Here a reader
thread waits on that pipe (so the UI thread never does) and hands every event
to the UI thread through one queued signal; ``_dispatch`` then re-emits it as a
typed signal. When the pipe reports end-of-file the child has died, and
``died`` fires with a sentence for the window.
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal, Slot

from engine.worker import EngineProcess

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0


class EngineClient(QObject):
    """Start, talk to, restart and stop the engine process without blocking the UI thread.

    Signals (all delivered on the UI thread):
        load_progress(done, total): bytes of the model file hashed so far.
        loaded(facts): the model is ready; ``facts`` is a ModelFacts dict.
        load_failed(message): the model could not be loaded (a sentence).
        progress(id, phase, done, total): restore/prefill progress in tokens.
        token(id, text): one piece of streamed text.
        done(event): the whole ``done`` event (text, token_ids, stats).
        error(event): the ``error`` event (kind, message, ...).
        event(event): every event, for the rarer ones (count, coverage, cache, snapshot).
        died(message): the engine process ended without being asked to.
    """

    load_progress = Signal(int, int)
    loaded = Signal(dict)
    load_failed = Signal(str)
    progress = Signal(int, str, int, int)
    token = Signal(int, str)
    done = Signal(dict)
    error = Signal(dict)
    event = Signal(dict)
    died = Signal(str)

    _incoming = Signal(object)

    def __init__(self, data_dir: Path, log_file: Path | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.data_dir = Path(data_dir)
        self.log_file = log_file
        self._proc: EngineProcess | None = None
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._dead_reported = False
        self._incoming.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)

    # -- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the child process and its reader thread (returns at once)."""
        self.stop()
        self._stopping.clear()
        self._dead_reported = False
        self._proc = EngineProcess(self.data_dir, self.log_file)
        self._proc.start()
        proc = self._proc
        self._reader = threading.Thread(target=self._read_loop, args=(proc,),
                                        name="engine-events", daemon=True)
        self._reader.start()
        log.info("engine process started, pid %s", proc.pid)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, cancel_id: int | None = None) -> None:
        """Ask the engine to finish (cancelling ``cancel_id`` first) and wait for it to exit.

        Waits at most ``STOP_TIMEOUT_S`` seconds before killing the child. Events that
        arrive meanwhile are dropped: the caller has already saved what it needs.
        """
        proc, reader = self._proc, self._reader
        if proc is None:
            return
        self._stopping.set()
        for request in ([{"op": "cancel", "id": cancel_id}] if cancel_id is not None else []) + [
            {"op": "shutdown"}
        ]:
            try:
                proc.send(request)
            except (OSError, EOFError, ValueError, AssertionError):
                break
        if reader is not None:
            reader.join(STOP_TIMEOUT_S)  # the reader ends at end-of-file, i.e. when the child exits
            if reader.is_alive():
                proc.kill()
                reader.join(2)
        proc.stop(timeout=2)
        self._proc = None
        self._reader = None

    # -- requests ------------------------------------------------------------------------

    def new_id(self) -> int:
        return next(self._ids)

    def send(self, request: dict) -> bool:
        """Send a request; returns False (and reports ``died``) if the engine is gone."""
        if self._proc is None:
            self._report_death("The engine is not running.")
            return False
        try:
            self._proc.send(request)
            return True
        except (OSError, EOFError, ValueError) as exc:
            log.warning("send %s failed: %s", request.get("op"), exc)
            self._report_death(self._death_message())
            return False

    def load(self, path: str, settings: dict, budget_bytes: int) -> bool:
        return self.send({"op": "load", "path": path, "settings": settings, "budget_bytes": budget_bytes})

    def generate(self, messages: list[dict], sampling: dict, use_cache: bool = True) -> int | None:
        """Start a reply; returns its request id (None if the engine is gone)."""
        rid = self.new_id()
        ok = self.send({"op": "generate", "id": rid, "messages": messages,
                        "sampling": sampling, "use_cache": use_cache})
        return rid if ok else None

    def cancel(self, rid: int) -> None:
        self.send({"op": "cancel", "id": rid})

    def request(self, op: str, **fields) -> int | None:
        """Send ``op`` (count, coverage, cache_stats, cache_clear, set_budget...); returns its id."""
        rid = self.new_id()
        return rid if self.send({"op": op, "id": rid, **fields}) else None

    # -- the reader thread ---------------------------------------------------------------

    def _read_loop(self, proc: EngineProcess) -> None:
        while True:
            try:
                event = proc.recv(timeout=0.25)
            except (EOFError, OSError, ValueError, AssertionError):
                if not self._stopping.is_set():
                    self._incoming.emit({"event": "_died"})
                return
            if event is None:
                continue
            if not self._stopping.is_set():
                self._incoming.emit(event)

    def _death_message(self) -> str:
        code = self._proc.exitcode if self._proc is not None else None
        how = f" (exit code {code})" if code not in (None, 0) else ""
        return (f"The engine process stopped unexpectedly{how}. Your conversations are safe; "
                "restart the engine to continue.")

    def _report_death(self, message: str) -> None:
        if not self._dead_reported:
            self._dead_reported = True
            self.died.emit(message)

    @Slot(object)
    def _dispatch(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "_died":
            message = self._death_message()
            if self._proc is not None:
                self._proc.kill()  # reap it so that no child process is left behind
                message = self._death_message()
                self._proc.close()
                self._proc = None
            if self._reader is not None:
                self._reader.join(1)
                self._reader = None
            self._report_death(message)
            return
        if kind == "load_progress":
            self.load_progress.emit(int(event["done"]), int(event["total"]))
        elif kind == "loaded":
            self.loaded.emit(event["facts"])
        elif kind == "load_failed":
            self.load_failed.emit(event["message"])
        elif kind == "progress":
            self.progress.emit(int(event.get("id") or 0), event["phase"], int(event["done"]),
                               int(event["total"]))
        elif kind == "token":
            self.token.emit(int(event.get("id") or 0), event["text"])
        elif kind == "done":
            self.done.emit(event)
        elif kind == "error":
            self.error.emit(event)
        self.event.emit(event)
