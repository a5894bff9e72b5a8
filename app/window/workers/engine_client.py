"""The window's handle on the engine child process, as Qt signals.

``engine.worker.EngineProcess`` speaks the typed requests and events of
``engine/events.py`` over a pipe. Here a reader task (``workers/tasks.py``) waits on that
pipe (so the UI thread never does) and reports every event, which arrives on the UI thread;
a writer (``workers/engine_writer.py``) writes the large requests, so the UI thread never
waits for the engine process to read either.
Each request that expects an answer returns a ``PendingRequest``: a handle whose
signals fire on the UI thread when its events arrive, so no caller keeps request ids.
When the pipe reports end-of-file the child has died, and ``died`` fires with an
``EngineExit`` that says how (``app/window/flows/crash.py`` turns it into words).
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.window.workers.engine_writer import EngineWriter, socket_room
from app.window.workers.tasks import Task, Workers
from engine import events as ev
from engine.chat_template import ChatMessage
from engine.worker import EngineProcess

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0
STOP_HINT_S = 3.0
"""After this long without an answer to Stop the window offers to end the engine at once."""
STOP_WATCHDOG_S = 30.0
"""After this long without an answer to Stop the window ends the engine process and starts
a new one. The engine checks for Stop between prefill batches and between tokens, so a
healthy engine answers within one prefill batch: a cold prefill of 2,050 tokens (four
512-token batches) took 9.6 s on this project's quiet 2-core machine, and single 512-token
batches at 0-4,096 tokens of context took 3.1-22.5 s with four other jobs running on it."""


class PendingRequest(QObject):
    """One request in flight. Signals (UI thread): ``token(text)``, ``reasoning(text)`` (the
    thinking of a reasoning model), ``progress(phase, done,
    total)`` for a reply; ``done(event)`` with the answering event (DoneEvent, CountEvent,
    CoverageEvent, CacheEvent); ``snapshot(SnapshotEvent)`` after a reply's KV was stored;
    ``failed(ErrorEvent)``. ``finished`` is True once nothing more will arrive.
    ``first_token_read_at``: ``time.perf_counter()`` when the reader thread read the first
    token from the pipe (None before), for the send timeline (``transcript/send_timeline.py``)."""

    token = Signal(str)
    reasoning = Signal(str)  # a piece of a reasoning model's thinking (before the answer's tokens)
    progress = Signal(str, int, int)
    done = Signal(object)
    snapshot = Signal(object)
    failed = Signal(object)

    def __init__(self, rid: int, is_reply: bool = False, expects_snapshot: bool = False,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.id = rid
        self.is_reply = is_reply
        self.expects_snapshot = expects_snapshot
        self.finished = False
        self.first_token_read_at: float | None = None

    def _deliver(self, event) -> bool:
        """Emit ``event``; return True when this request has received its last event."""
        if isinstance(event, ev.TokenEvent):
            (self.reasoning if event.reasoning else self.token).emit(event.text)
            return False
        if isinstance(event, ev.ProgressEvent):
            self.progress.emit(str(event.phase), event.done, event.total)
            return False
        if isinstance(event, ev.ErrorEvent):
            self.finished = True
            self.failed.emit(event)
            return True
        if isinstance(event, ev.SnapshotEvent):
            self.finished = True
            self.snapshot.emit(event)
            return True
        self.finished = not (isinstance(event, ev.DoneEvent) and self.expects_snapshot)
        self.done.emit(event)
        return self.finished


class EngineExit:
    """How the engine process ended: ``exitcode`` as ``multiprocessing`` reports it (negative:
    killed by that signal on POSIX; on Windows the process's exit status, e.g. 0xC0000005).
    ``unresponsive``: the window ended it because it did not answer (``kill_unresponsive``)."""

    def __init__(self, exitcode: int | None, during_load: bool, during_first_reply: bool,
                 unresponsive: bool = False):
        self.exitcode = exitcode
        self.during_load = during_load
        self.during_first_reply = during_first_reply
        self.unresponsive = unresponsive


class EngineClient(QObject):
    """Start, talk to, restart and stop the engine process without blocking the UI thread.

    Signals (all delivered on the UI thread):
        load_progress(done, total): bytes of the model file hashed so far.
        loaded(facts): the model is ready; ``facts`` is a ModelFacts dict.
        load_failed(message): the model could not be loaded (a sentence).
        token(id, text): every piece of streamed text of every reply (a public hook for tools).
        event(event): every event (engine/events.py), for tools and tests.
        died(EngineExit): the engine process ended without being asked to.

    ``workers``: where the reader task runs (the window's ``Workers``; None: a pool of its own).
    """

    load_progress = Signal(int, int)
    loaded = Signal(dict)
    load_failed = Signal(str)
    token = Signal(int, str)
    event = Signal(object)
    died = Signal(object)

    def __init__(self, data_dir: Path, log_file: Path | None = None, parent: QObject | None = None,
                 workers: Workers | None = None):
        super().__init__(parent)
        self.data_dir = Path(data_dir)
        self.log_file = log_file
        self._workers = workers if workers is not None else Workers(self)
        self._proc: EngineProcess | None = None
        self._reader: Task | None = None
        self._writer: EngineWriter | None = None
        self._ids = itertools.count(1)
        self._dead_reported = False
        self._unresponsive = False
        self._pending: dict[int, PendingRequest] = {}
        self._loading = False
        self._replies_done = 0  # replies finished by this process (a crash before the first one is telling)

    # -- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the child process and its reader task (returns at once)."""
        self.stop()
        self._dead_reported = False
        self._unresponsive = False
        self._replies_done = 0
        self._proc = EngineProcess(self.data_dir, self.log_file)
        self._proc.start()
        proc = self._proc
        self._reader = self._workers.start(lambda task: self._read_loop(proc, task), name="engine-events",
                                           progress=self._dispatch)
        self._writer = EngineWriter(proc.send_packed, self._workers, lambda _exc: self._write_failed(proc),
                                    room=socket_room(proc.fileno()))
        log.info("engine process started, pid %s", proc.pid)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def kill_unresponsive(self) -> None:
        """End an engine process that stopped answering (the watchdog behind Stop): it is
        killed at once, and ``died`` fires with ``EngineExit.unresponsive`` set."""
        if self._proc is None:
            return
        log.warning("engine process %s did not answer; killing it", self._proc.pid)
        self._unresponsive = True
        self._proc.kill()  # the reader then sees end-of-file and reports the death

    def stop(self, cancel: PendingRequest | None = None) -> None:
        """Ask the engine to finish (cancelling ``cancel`` first) and wait for it to exit.

        Waits at most ``STOP_TIMEOUT_S`` seconds before killing the child. Events that
        arrive meanwhile are dropped: the caller has already saved what it needs.
        """
        proc, reader, writer = self._proc, self._reader, self._writer
        self._drop_pending()
        if proc is None:
            return
        if reader is not None:
            reader.drop()  # events that arrive from now on are not delivered
        requests = ([ev.CancelRequest(cancel.id)] if cancel is not None else []) + [ev.ShutdownRequest()]
        for request in requests:
            try:  # after whatever the writer still holds
                writer.send(EngineProcess.pack(request)) if writer is not None else proc.send(request)
            except (OSError, EOFError, ValueError, AssertionError):
                break
        if writer is not None:
            writer.close(0)  # it ends once those are written (or the write fails: the process is gone)
        if reader is not None and not reader.wait(STOP_TIMEOUT_S):  # it ends at end-of-file: the child exited
            proc.kill()
            reader.wait(2)
        if writer is not None:
            writer.close(2)  # all written, or failing: the child exited or was killed (before the pipe closes)
        proc.stop(timeout=2)
        self._proc = None
        self._reader = None
        self._writer = None

    # -- requests ------------------------------------------------------------------------

    def _send(self, request) -> bool:
        """Send a request (or the bytes of one, from ``_pack``); returns False (and
        reports ``died``) if the engine is gone."""
        if self._proc is None or self._writer is None:
            self._report_death()
            return False
        try:
            self._writer.send(request if isinstance(request, bytes) else EngineProcess.pack(request))
            return True
        except (OSError, EOFError, ValueError) as exc:
            log.warning("send %s failed: %s", type(request).__name__, exc)
            self._report_death()
            return False

    def _track(self, make, is_reply: bool = False, expects_snapshot: bool = False,
               rid: int | None = None) -> PendingRequest | None:
        rid = next(self._ids) if rid is None else rid
        handle = PendingRequest(rid, is_reply, expects_snapshot, self)
        self._pending[rid] = handle
        if not self._send(make(rid)):
            self._pending.pop(rid, None)
            return None
        return handle

    def load(self, path: str, settings: dict, budget_bytes: int, remote: dict | None = None) -> bool:
        """Load a model; answered by ``loaded`` or ``load_failed`` (one load at a time).
        ``remote`` ({"url", "key", "model"}) uses an OpenAI-compatible server instead of ``path``."""
        self._loading = True
        return self._send(ev.LoadRequest(path, settings, budget_bytes, remote))

    def generate(self, messages: list[ChatMessage], sampling: dict, use_cache: bool = True,
                 reply_prefix: list[int] | None = None, tools: list[dict] | None = None,
                 grammar: str | None = None, path: bytes | None = None) -> PendingRequest | None:
        """Start a reply; None if the engine is gone. ``reply_prefix``: the token ids of a
        reply to continue (its prompt goes on from them; the events carry only the new part).
        ``tools`` (OpenAI function objects) go to the chat template, ``grammar`` (GBNF)
        constrains sampling (the tool loop). ``path``: the ``pack_messages`` bytes of the
        messages before ``messages`` (the shown branch, read off the UI thread)."""
        prefix = list(reply_prefix) if reply_prefix else None
        return self._track(lambda rid: ev.GenerateRequest(rid, list(messages), dict(sampling), use_cache,
                                                          reply_prefix=prefix, tools=tools, grammar=grammar, path=path),
                           is_reply=True, expects_snapshot=use_cache)

    def count_draft(self, messages: list[ChatMessage] | bytes, draft: str) -> PendingRequest | None:
        """How many tokens the prompt of ``messages`` (or their ``pack_messages`` bytes) plus
        the user message ``draft`` takes, and the draft alone (``CountEvent.message_tokens[0]``):
        ``done(CountEvent)``; None if the engine is gone."""
        return self._track(lambda rid: ev.CountRequest(rid, messages if isinstance(messages, bytes) else list(messages),
                                                       False, draft))

    def title(self, messages: list[ChatMessage], max_tokens: int = 16) -> PendingRequest | None:
        """A title for the chat ``messages`` written by the model in the background
        (``engine/title.py``): ``progress("title", 1, 1)`` per decoded token, then
        ``done(TitleEvent)``; None if the engine is gone."""
        return self._track(lambda rid: ev.TitleRequest(rid, list(messages), max_tokens))

    def prewarm(self, messages: list[ChatMessage] | bytes, draft: str | None = "",
                complete: bool = False) -> PendingRequest | None:
        """Background work before the next request (``engine/prewarm.py``): bring the live
        context up to ``messages`` (a list, or ``engine.events.pack_messages`` bytes) plus a
        user message ``draft`` (None: ``messages`` is the whole prompt).
        ``done(PrewarmEvent)``; None if the engine is gone."""
        path = messages if isinstance(messages, bytes) else list(messages)
        return self._track(lambda rid: ev.PrewarmRequest(rid, path, draft, complete))

    def cancel(self, handle: PendingRequest) -> None:
        """Stop a reply; it still ends with ``done`` (finish_reason "cancelled")."""
        self._send(ev.CancelRequest(handle.id))

    def count(self, messages: list[ChatMessage] | bytes, per_message: bool = False) -> PendingRequest | None:
        """How many tokens ``messages`` (or their ``pack_messages`` bytes) take as a prompt:
        ``done(CountEvent)``; with ``per_message``, each message's too (``CountEvent.message_tokens``)."""
        return self._track(lambda rid: ev.CountRequest(rid, messages if isinstance(messages, bytes) else list(messages),
                                                       per_message))

    def coverage(self, paths: list[list[ChatMessage]]) -> PendingRequest | None:
        """How many tokens of each path's prompt the prefix store holds: ``done(CoverageEvent)``."""
        return self._track(lambda rid: ev.CoverageRequest(rid, [list(p) for p in paths]))

    # a large request (a long conversation's prompt, the tree's coverage paths) takes long to
    # pickle: a worker thread packs it (any thread may), the UI thread only sends the bytes

    def pack_count(self, messages: list[ChatMessage]) -> tuple[int, bytes]:
        """A ``count`` request made ready on any thread: (its id, its pickled bytes)."""
        return self._pack(lambda rid: ev.CountRequest(rid, list(messages), False))

    def pack_coverage(self, paths: list[list[ChatMessage]]) -> tuple[int, bytes]:
        """A ``coverage`` request made ready on any thread: (its id, its pickled bytes)."""
        return self._pack(lambda rid: ev.CoverageRequest(rid, [list(p) for p in paths]))

    def _pack(self, make) -> tuple[int, bytes]:
        rid = next(self._ids)  # itertools.count: one step is atomic
        return rid, EngineProcess.pack(make(rid))

    def send_packed(self, packed: tuple[int, bytes]) -> PendingRequest | None:
        """Send a request from ``pack_count`` or ``pack_coverage``: answered as ``count`` or
        ``coverage`` is; None if the engine is gone."""
        rid, blob = packed
        return self._track(lambda _rid: blob, rid=rid)

    def cache(self, action: ev.CacheAction, budget_bytes: int | None = None) -> PendingRequest | None:
        """A prefix-store operation: ``done(CacheEvent)``."""
        return self._track(lambda rid: ev.CacheRequest(rid, ev.CacheAction(action), budget_bytes))

    def forget(self, conversation_id: int, chats_path: str) -> PendingRequest | None:
        """Delete ``conversation_id`` from ``chats_path`` and drop the KV blocks no other
        conversation shares, in the engine process: ``done(CacheEvent)`` (``dropped``
        blocks) or ``failed(ErrorEvent)``; None if the engine is gone."""
        return self._track(lambda rid: ev.CacheRequest(rid, ev.CacheAction.FORGET, None,
                                                       int(conversation_id), str(chats_path)))

    # -- the reader task -----------------------------------------------------------------

    @staticmethod
    def _read_loop(proc: EngineProcess, task: Task) -> None:
        """On the reader's thread: report (event, perf_counter when read) for every event, and
        None at end of file (the child is gone), until then or until the task is dropped."""
        while True:
            try:
                event = proc.recv(timeout=0.25)
            except (EOFError, OSError, ValueError, AssertionError):
                task.report(None)  # nothing is delivered once dropped (``stop``)
                return
            if event is not None:
                task.report((event, time.perf_counter()))

    def _write_failed(self, proc: EngineProcess) -> None:
        """The writer could not write to ``proc``: it is gone (reported once, as the reader's
        end of file is)."""
        if proc is self._proc:
            self._report_death()

    def _drop_pending(self) -> None:
        """Forget every request in flight (the process that would answer them is gone)."""
        for handle in self._pending.values():
            handle.finished = True
            handle.deleteLater()
        self._pending.clear()

    def _report_death(self) -> None:
        if self._dead_reported:
            return
        self._dead_reported = True
        code = None
        if self._proc is not None:
            self._proc.kill()  # reap it so that no child process is left behind
            code = self._proc.exitcode
            if self._writer is not None:
                self._writer.close(1)  # its writes fail now; it ends before the pipe is closed
                self._writer = None
            self._proc.close()
            self._proc = None
        if self._reader is not None:
            self._reader.wait(1)
            self._reader = None
        generating = any(h.is_reply for h in self._pending.values())
        exit_info = EngineExit(code, during_load=self._loading,
                               during_first_reply=generating and self._replies_done == 0,
                               unresponsive=self._unresponsive)
        self._drop_pending()
        self._loading = False
        log.warning("engine process ended, exit code %s", code)
        self.died.emit(exit_info)

    def _dispatch(self, item) -> None:
        """``item``: None (end of file: the child is gone) or (event, perf_counter when read)."""
        if item is None:
            self._report_death()
            return
        event, read_at = item
        if isinstance(event, ev.LoadProgressEvent):
            self.load_progress.emit(event.done, event.total)
        elif isinstance(event, ev.LoadedEvent):
            self._loading = False
            self.loaded.emit(event.facts)
        elif isinstance(event, ev.LoadFailedEvent):
            self._loading = False
            self.load_failed.emit(event.message)
        else:
            rid = getattr(event, "id", None)
            if isinstance(event, ev.TokenEvent) and not event.reasoning:
                self.token.emit(event.id, event.text)
            elif isinstance(event, ev.DoneEvent):
                self._replies_done += 1
            handle = self._pending.get(rid) if rid is not None else None
            if handle is not None and handle.first_token_read_at is None and isinstance(event, ev.TokenEvent):
                handle.first_token_read_at = read_at
            if handle is not None and handle._deliver(event):
                self._pending.pop(rid, None)
                handle.deleteLater()  # its last signal has been delivered
            elif handle is None and isinstance(event, ev.ErrorEvent):
                log.warning("engine error with no request: %s", event.message)
        self.event.emit(event)
