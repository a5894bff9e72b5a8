"""The engine process: llama.cpp runs in a child process so that a native crash or an
abort inside llama.cpp ends only that process; the window survives, reports the crash
and can start a new one.

The window and this process exchange the typed requests and events of
``engine/events.py`` over a ``multiprocessing`` pipe (spawn context). Requests are
served one at a time, in order, except ``CancelRequest``, which a reader thread applies
at once so that a reply can be stopped while it streams. A ``PrewarmRequest`` (background
work between requests, ``engine/prewarm.py``) stops between batches as soon as any other
request arrives: it is dropped when a newer prewarm or a request that changes the live
context (generate, load, cache) is waiting, and resumed after the others (counts, coverage).
A ``TitleRequest`` (``engine/title.py``) yields the same way, between decode steps, to any
request, and runs again after them; only a load, a cache action or a shutdown ends it. It
also waits while it would cut away live tokens a prewarm prepared (a draft), until the
request that uses them has been served.

Stopping: the window decides. The child ignores SIGINT (a terminal's Ctrl+C reaches the
whole process group; the window closes and sends ``ShutdownRequest``, which waits behind
the request being served, so a finished reply's KV snapshot is written whole). A SIGTERM
to the child itself (a logout, ``pkill``) cancels what runs, lets its snapshot finish and
exits. When the window is gone (the pipe is closed) events are dropped, not raised.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from engine.events import (
    CacheAction,
    CacheEvent,
    CacheRequest,
    CancelRequest,
    CountEvent,
    CountRequest,
    CoverageEvent,
    CoverageRequest,
    DoneEvent,
    ErrorEvent,
    ErrorKind,
    Event,
    GenerateRequest,
    LoadedEvent,
    LoadFailedEvent,
    LoadProgressEvent,
    LoadRequest,
    PrewarmEvent,
    PrewarmRequest,
    ProgressEvent,
    Request,
    ShutdownRequest,
    SnapshotEvent,
    TitleEvent,
    TitleRequest,
    TokenEvent,
    unpack_messages,
)

log = logging.getLogger(__name__)


class EngineProcess:
    """The UI's handle on the engine child process (no Qt here; the app wraps it).

    Args:
        data_dir: the data folder; the child opens ``kvcache.sqlite3`` there.
        log_file: where the child writes its log (tracebacks go there, not to the window).
    """

    def __init__(self, data_dir: Path, log_file: Path | None = None):
        self.data_dir = Path(data_dir)
        self.log_file = log_file
        self._ctx = mp.get_context("spawn")
        self._conn = None
        self._proc = None

    def start(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        self._proc = self._ctx.Process(
            target=_child_main, args=(child, str(self.data_dir), str(self.log_file or "")),
            name="branchwise-engine", daemon=True,
        )
        self._proc.start()
        child.close()
        self._conn = parent

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_alive(self) -> bool:
        return bool(self._proc and self._proc.is_alive())

    @property
    def exitcode(self) -> int | None:
        return self._proc.exitcode if self._proc else None

    def send(self, request: Request) -> None:
        """Send a request. Raises OSError/EOFError (BrokenPipeError) if the child is gone."""
        assert self._conn is not None
        self._conn.send(request)

    @staticmethod
    def pack(request: Request) -> bytes:
        """``request`` pickled as ``send`` would (any thread may do it: a large request, e.g.
        a coverage request of a long conversation, takes long to pickle); see ``send_packed``."""
        return bytes(ForkingPickler.dumps(request))

    def send_packed(self, packed: bytes) -> None:
        """Send a request made by ``pack``. Raises as ``send`` does."""
        assert self._conn is not None
        self._conn.send_bytes(packed)

    def recv(self, timeout: float | None = None) -> Event | None:
        """The next event, or None after ``timeout`` seconds. Raises EOFError when the child died."""
        assert self._conn is not None
        if timeout is not None and not self._conn.poll(timeout):
            return None
        return self._conn.recv()

    def fileno(self) -> int:
        assert self._conn is not None
        return self._conn.fileno()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the child to exit, then kill it if it does not within ``timeout`` seconds."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            try:
                self._conn.send(ShutdownRequest())
            except (OSError, EOFError, ValueError):
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self.close()

    def kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None and not self._proc.is_alive():
            self._proc.close()
            self._proc = None


# -- the child side ----------------------------------------------------------------------


def _child_main(conn, data_dir: str, log_file: str) -> None:
    if log_file:
        logging.basicConfig(
            filename=log_file, level=logging.INFO,
            format="%(asctime)s engine[%(process)d] %(levelname)s %(name)s: %(message)s",
        )
        # A crash in llama.cpp (a signal) leaves every thread's stack in the same log.
        crash_log = open(log_file, "a", encoding="utf-8")  # noqa: SIM115  (open for the process's life)
        faulthandler.enable(file=crash_log, all_threads=True)
    server = _Server(conn, Path(data_dir))
    server.take_signals()
    server.run()


def _tool_text(engine, msg: GenerateRequest, result) -> str | None:
    """With tools, the reply's token ids (``result`` of the local ``engine``) as text with
    control tokens shown, where the calls are read (as ``branchwise serve`` reads them);
    None without tools or with reasoning apart."""
    if not msg.tools or getattr(result, "reasoning", None) is not None or not result.token_ids:
        return None
    from engine.tool_calls import reply_text_with_controls

    return reply_text_with_controls(engine.model, result.token_ids)


def count_event(engine, msg: CountRequest) -> CountEvent:
    """The answer to ``msg`` from a local ``engine.core.Engine``: the prompt's length in tokens
    and the context window (``n_ctx``); with ``draft``, the draft's own tokens; with
    ``per_message``, each message's. A history too long for the chat template to render
    (``HistoryTooLongError``) is answered with its lower bound, over ``n_ctx``, not an error."""
    from engine.chat_template import ChatMessage
    from engine.model import HistoryTooLongError

    messages = unpack_messages(msg.messages)
    n_ctx = engine.llama.n_ctx()
    own = (len(engine.model.tokenize(msg.draft, False)),) if msg.draft is not None else ()
    try:
        if msg.draft is not None:  # the composer's draft: the prompt it would make, and its own tokens
            return CountEvent(msg.id, len(engine.prompt_tokens(messages + [ChatMessage("user", msg.draft)])),
                              n_ctx, own)
        if msg.per_message:  # counted per message; the sum stands for the prompt length
            per = tuple(engine.message_tokens(messages))
            return CountEvent(msg.id, sum(per), n_ctx, per)
        return CountEvent(msg.id, len(engine.prompt_tokens(messages)), n_ctx)
    except HistoryTooLongError as exc:  # too long for the template to render: its lower bound
        return CountEvent(msg.id, max(exc.prompt_tokens, n_ctx + 1), n_ctx, own)


class _Server:
    def __init__(self, conn, data_dir: Path):
        self.conn = conn
        self.data_dir = data_dir
        self.inbox: queue.Queue[Request] = queue.Queue()
        self.cancels: dict[Any, threading.Event] = {}
        self.engine = None
        self.store = None
        self.prewarmer = None  # engine.prewarm.Prewarmer of a local engine
        self.thinking = ""  # the thinking setting of the last reply (SamplingParams.thinking), for prewarms
        self.arrived = threading.Event()  # set by the reader for every request: a prewarm yields
        self.arrived_at: dict[int, float] = {}  # generate request id -> perf_counter when it was read
        self.title_attempts: dict[int, int] = {}  # title request id -> runs so far (engine/title.py)
        self.deferred_titles: list[TitleRequest] = []  # waiting for a request to use what a prewarm prepared
        self._send_lock = threading.Lock()
        self.terminating = False  # a SIGTERM arrived: finish the request being served, then exit
        self.parent_gone = False

    def send(self, event: Event) -> None:
        if self.parent_gone:
            return
        with self._send_lock:
            try:
                self.conn.send(event)
            except (BrokenPipeError, EOFError, ConnectionResetError):  # the window ended: work on, then exit
                self.parent_gone = True
                log.info("the window closed the pipe; %s not delivered", type(event).__name__)

    def take_signals(self) -> None:
        """Ignore SIGINT (the window stops this process) and make SIGTERM a stop that
        lets the request being served end whole (its reply cancelled, its snapshot
        written) before the process exits."""
        def terminate(_signum, _frame):
            self.terminating = True
            for event in list(self.cancels.values()):
                event.set()
            self.arrived.set()  # a prewarm yields
            # not from inside the handler: it may have interrupted a thread holding the queue's lock
            threading.Thread(target=self.inbox.put, args=(ShutdownRequest(),), daemon=True).start()

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, terminate)
        except ValueError:  # not the main thread (tests run the server inline)
            pass

    def _reader(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.inbox.put(ShutdownRequest())
                return
            if isinstance(msg, CancelRequest):
                self.cancels.setdefault(msg.id, threading.Event()).set()
                continue
            if isinstance(msg, GenerateRequest):
                self.arrived_at[msg.id] = time.perf_counter()
            self.inbox.put(msg)
            if not isinstance(msg, TitleRequest):  # a title job is background work: it stops nothing
                self.arrived.set()
            if isinstance(msg, ShutdownRequest):
                return

    def run(self) -> None:
        threading.Thread(target=self._reader, daemon=True, name="engine-reader").start()
        handlers = {LoadRequest: self.op_load, GenerateRequest: self.op_generate, CountRequest: self.op_count,
                    CoverageRequest: self.op_coverage, CacheRequest: self.op_cache,
                    PrewarmRequest: self.op_prewarm, TitleRequest: self.op_title}
        while not self.terminating:
            msg = self.inbox.get()
            if isinstance(msg, ShutdownRequest) or self.terminating:
                break
            try:
                handlers[type(msg)](msg)
            except Exception as exc:  # one bad request must not end the process
                log.error("request %s failed:\n%s", type(msg).__name__, traceback.format_exc())
                self.send(ErrorEvent(getattr(msg, "id", None), ErrorKind.ENGINE,
                                     f"The engine could not do that: {exc}"))
            if self.deferred_titles and not isinstance(msg, TitleRequest):  # they look again
                for title in self.deferred_titles:
                    self.inbox.put(title)
                self.deferred_titles.clear()
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            self.store.close()

    # -- operations ----------------------------------------------------------------------

    def op_load(self, msg: LoadRequest) -> None:
        from engine.core import Engine
        from engine.cpu import CrashVerdict
        from engine.errors import EngineError
        from engine.settings import EngineSettings
        from storage.errors import StorageError
        from storage.paths import KVCACHE_DB
        from storage.prefix_store import DEFAULT_BUDGET_BYTES, PrefixStore

        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.prewarmer = None
        if msg.remote:
            self._load_remote(msg)
            return
        try:
            settings = EngineSettings.from_dict(msg.settings)
            if self.store is None:
                try:
                    self.store = PrefixStore(self.data_dir / KVCACHE_DB, msg.budget_bytes or DEFAULT_BUDGET_BYTES)
                except StorageError as exc:
                    log.warning("running without the prefix store: %s", exc)
            elif msg.budget_bytes:
                self.store.budget_bytes = int(msg.budget_bytes)
            self.engine = Engine(
                msg.path, settings, self.store,
                progress=lambda d, t: self.send(LoadProgressEvent(d, t)),
                crash_verdict=CrashVerdict.applies(self.data_dir),
            )
        except (EngineError, ValueError, OSError) as exc:
            self.send(LoadFailedEvent(str(exc)))
            return
        from engine.prewarm import Prewarmer

        self.prewarmer = Prewarmer(self.engine)
        facts = self.engine.model.facts.to_dict()
        if self.engine.layout is not None:
            facts["kv_bytes_per_token"] = self.engine.layout.bytes_per_token
        self.send(LoadedEvent(facts))

    def _load_remote(self, msg: LoadRequest) -> None:
        """Use an OpenAI-compatible server (``engine.remote``) as the engine: it checks the
        server by asking for its model name (``GET /models`` unless one is given)."""
        from engine.remote import RemoteEngine, RemoteEngineError

        r = msg.remote or {}
        try:
            engine = RemoteEngine(str(r.get("url") or ""), r.get("key") or None, r.get("model") or None)
        except (ValueError, RemoteEngineError) as exc:
            self.send(LoadFailedEvent(f"The engine URL cannot be used: {exc}"))
            return
        try:
            name = engine.model_name()
        except RemoteEngineError as exc:
            engine.close()
            self.send(LoadFailedEvent(str(exc)))
            return
        self.engine = engine
        n_ctx = int((msg.settings or {}).get("n_ctx") or 0)
        self.send(LoadedEvent({"name": name, "path": "", "remote": engine.base, "server": engine.host,
                               "n_ctx": n_ctx, "parameters": 0, "cache_policy": "full"}))

    @property
    def _remote(self) -> bool:
        return self.engine is not None and self.engine.is_remote

    def _require_engine(self, msg) -> bool:
        if self.engine is None:
            self.send(ErrorEvent(msg.id, ErrorKind.NO_MODEL, "No model is loaded. Open a model first."))
            return False
        return True

    def op_generate(self, msg: GenerateRequest) -> None:
        from engine.errors import ContextOverflowError, EngineError, TemplateError
        from engine.settings import SamplingParams

        rid = msg.id
        # how long the request waited behind the one being served (a prewarm batch, a count)
        queued_ms = round((time.perf_counter() - self.arrived_at.pop(rid, time.perf_counter())) * 1000, 2)
        if not self._require_engine(msg):
            return
        cancel = self.cancels.setdefault(rid, threading.Event())
        result = None
        try:
            sampling = SamplingParams.from_dict(msg.sampling)
            self.thinking = sampling.thinking  # the prewarms after this reply render the same way
            result = self.engine.generate(
                (unpack_messages(msg.path) if msg.path else []) + list(msg.messages),
                sampling,
                use_cache=msg.use_cache,
                on_token=lambda text, _tok: text and self.send(TokenEvent(rid, text)),
                on_reasoning=lambda text, _tok: text and self.send(TokenEvent(rid, text, True)),
                on_progress=lambda phase, done, total: self.send(ProgressEvent(rid, phase, done, total)),
                cancel=cancel,
                snapshot=False,
                **({"reply_prefix": list(msg.reply_prefix)} if msg.reply_prefix else {}),
                **self._tool_args(msg),
            )
        except ContextOverflowError as exc:
            self.send(ErrorEvent(rid, ErrorKind.OVERFLOW, str(exc), exc.prompt_tokens, exc.n_ctx))
            return
        except TemplateError as exc:
            self.send(ErrorEvent(rid, ErrorKind.TEMPLATE, str(exc)))
            return
        except EngineError as exc:  # a remote engine: connection refused, 401, 429, a timeout
            if not self._remote:
                raise
            self.send(ErrorEvent(rid, ErrorKind.ENGINE, str(exc)))
            return
        finally:
            self.cancels.pop(rid, None)
            ready = self._account_prewarm(result)
        stats = {**result.stats.to_dict(), **ready, "queued_ms": queued_ms}
        reasoning = getattr(result, "reasoning", None)
        self.send(DoneEvent(rid, result.text, list(result.token_ids), stats, reasoning,
                            None if self._remote else _tool_text(self.engine, msg, result)))
        if msg.use_cache:  # a remote engine stores nothing (0 bytes); the window still expects the event
            self.engine.snapshot(result.stats)
            self.send(SnapshotEvent(rid, round(result.stats.snapshot_ms, 2), result.stats.snapshot_bytes_written))

    def _tool_args(self, msg: GenerateRequest) -> dict:
        """The request's tools for ``generate``: the grammar locally; a remote server is asked
        for a call by ``tool_choice: "required"`` instead (none when there are no tools)."""
        if not msg.tools:
            return {}
        if msg.grammar is None:
            return {"tools": msg.tools}
        return {"tools": msg.tools, "tool_choice": "required"} if self._remote else {"tools": msg.tools,
                                                                                     "grammar": msg.grammar}

    def _account_prewarm(self, result) -> dict:
        """What the prewarms before this request left ready (merged into its stats)."""
        if self.prewarmer is None:
            return {}
        if result is None:
            self.prewarmer.forget()
            return {}
        return self.prewarmer.account(result.stats)

    def op_prewarm(self, msg: PrewarmRequest) -> None:
        """Run a prewarm until done or until another request arrives (see the module doc)."""
        from engine.prewarm import PrewarmResult

        if self.prewarmer is None:
            why = "no model is loaded" if self.engine is None else "a remote engine keeps its own cache"
            self.send(PrewarmEvent(msg.id, PrewarmResult(skipped=why).to_dict()))
            return
        self.arrived.clear()
        kind = "prompt" if msg.draft is None or msg.complete else "draft" if msg.draft else "open"
        result = PrewarmResult(kind, finished=False, skipped="superseded")  # not started: a request waits
        if not self._requests_waiting():
            result = self.prewarmer.run(unpack_messages(msg.messages), msg.draft, msg.complete, cancel=self.arrived,
                                        thinking=self.thinking)
            if result.finished:
                self.send(PrewarmEvent(msg.id, result.to_dict()))
                return
        if self._prewarm_superseded():  # what it computed stays live for the next request
            self.send(PrewarmEvent(msg.id, result.to_dict()))
        else:
            self.inbox.put(msg)  # after the counts and coverage requests waiting now

    def _prewarm_superseded(self) -> bool:
        """Whether a request waiting in the inbox makes a prewarm pointless: a newer prewarm,
        or one that changes the live context."""
        with self.inbox.mutex:
            waiting = list(self.inbox.queue)
        return any(isinstance(m, (PrewarmRequest, GenerateRequest, LoadRequest, CacheRequest, ShutdownRequest))
                   for m in waiting)

    def op_title(self, msg: TitleRequest) -> None:
        """Write a chat title (``engine.title.write_title``) until done, stopping between
        decode steps when any request arrives and running again after it (see the module doc)."""
        from engine.errors import EngineError
        from engine.title import write_title

        attempts = self.title_attempts.pop(msg.id, 0)
        if self.engine is None or self._remote or self.prewarmer is None:
            self.send(TitleEvent(msg.id, "", True, 0, attempts))
            return
        if self._title_superseded():
            self.send(TitleEvent(msg.id, "", False, 0, attempts))
            return
        if self._requests_waiting():  # a request waits: it goes first
            self.title_attempts[msg.id] = attempts
            self.inbox.put(msg)
            return
        messages = unpack_messages(msg.messages)
        if self._title_would_undo_prewarm(messages):  # it runs after the request that uses it
            self.title_attempts[msg.id] = attempts
            self.deferred_titles.append(msg)
            return
        self.arrived.clear()
        attempts += 1
        try:
            result = write_title(self.engine, messages, cancel=self.arrived,
                                 max_tokens=msg.max_tokens,
                                 on_token=lambda _t, _id: self.send(ProgressEvent(msg.id, "title", 1, 1)))
        except EngineError as exc:  # too long for the context, a template error: no title
            log.info("no title: %s", exc)
            self.send(TitleEvent(msg.id, "", True, 0, attempts))
            return
        finally:
            self.prewarmer.forget()  # the live context moved
        if result.finished:
            self.send(TitleEvent(msg.id, result.text, True, result.generated_tokens, attempts))
        elif self._title_superseded():
            self.send(TitleEvent(msg.id, "", False, result.generated_tokens, attempts))
        else:
            self.title_attempts[msg.id] = attempts
            self.inbox.put(msg)  # after the requests that stopped it

    def _title_would_undo_prewarm(self, messages) -> bool:
        """Whether the title job would cut away live tokens a prewarm prepared (a draft's:
        the title's prompt is the chat's and shares the path and the next user header)."""
        from engine.errors import EngineError
        from engine.live_context import common_prefix
        from engine.title import title_messages

        if not self.prewarmer.prepared:
            return False
        try:
            target = self.engine.prompt_tokens(title_messages(messages))
        except EngineError:
            return False  # the run says why
        live = self.engine.live
        return common_prefix(live.ids(), target) < live.n_tokens

    def _requests_waiting(self) -> bool:
        """Whether a request other than a title job waits in the inbox (title jobs wait for
        everything, prewarms included, and never make anything else wait)."""
        with self.inbox.mutex:
            return any(not isinstance(m, TitleRequest) for m in self.inbox.queue)

    def _title_superseded(self) -> bool:
        with self.inbox.mutex:
            waiting = list(self.inbox.queue)
        return any(isinstance(m, (LoadRequest, CacheRequest, ShutdownRequest)) for m in waiting)

    def op_count(self, msg: CountRequest) -> None:
        if not self._require_engine(msg):
            return
        if self._remote:  # the server's tokenizer is not here: the context figure stays unknown (0)
            self.send(CountEvent(msg.id, 0, 0))
            return
        self.send(count_event(self.engine, msg))

    def op_coverage(self, msg: CoverageRequest) -> None:
        if not self._require_engine(msg):
            return
        if self._remote:  # the server keeps its own cache: nothing here is stored
            self.send(CoverageEvent(msg.id, [(0, 0) for _ in msg.paths]))
            return
        results = [tuple(int(x) for x in self.engine.cached_tokens(list(p))) for p in msg.paths]
        self.send(CoverageEvent(msg.id, results))

    def op_cache(self, msg: CacheRequest) -> None:
        verify, dropped = None, 0
        if msg.action == CacheAction.CLEAR:
            if self.store is not None:
                self.store.clear()
            if self.engine is not None and not self._remote:
                self.engine.reset_context()
            if self.prewarmer is not None:
                self.prewarmer.forget()
        elif msg.action == CacheAction.VERIFY and self.store is not None:
            verify = self.store.verify().__dict__
        elif msg.action == CacheAction.SET_BUDGET and self.store is not None and msg.budget_bytes:
            self.store.budget_bytes = int(msg.budget_bytes)
            self.store.evict()
        elif msg.action == CacheAction.FORGET:
            dropped = self._forget(msg)
        stats = self.store.stats() if self.store is not None else {}
        self.send(CacheEvent(msg.id, stats, verify, dropped))

    def _forget(self, msg: CacheRequest) -> int:
        """Delete and forget (``engine.forget.delete_and_forget``) with the loaded model's
        tokenizer (no model: the rows only). Returns the KV blocks dropped."""
        from pathlib import Path

        from engine.forget import delete_and_forget
        from storage.chats import ChatStore
        from storage.errors import NotFoundError

        build = self.engine.model.prompts.build if self.engine is not None else None
        with ChatStore(Path(msg.chats_path)) as chats:
            try:
                return delete_and_forget(chats, self.store, int(msg.conversation_id), build)
            except NotFoundError:
                return 0
