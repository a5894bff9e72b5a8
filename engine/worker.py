"""The engine process: llama.cpp runs in a child process so that an abort cannot take the
window down with it (DESIGN.md, "The engine process").

The UI talks to it with plain dicts over a ``multiprocessing`` pipe.

Requests (``op``)::

    load        path, settings (EngineSettings dict), budget_bytes
    generate    id, messages [{role, content, token_ids?}], sampling (SamplingParams dict), use_cache
    cancel      id
    count       id, messages                      -> prompt length, for the overflow check
    coverage    id, paths [[messages]]            -> stored/total prompt tokens per path
    cache_stats id | cache_clear id | cache_verify id | set_budget bytes
    shutdown

Events (``event``)::

    load_progress done, total (bytes of the model file hashed)
    loaded        facts (ModelFacts dict)         | load_failed message
    progress      id, phase ("restore" | "prefill"), done, total (tokens)
    token         id, text
    done          id, text, token_ids, stats (GenerationStats dict)
    snapshot      id, snapshot_ms, bytes_written
    error         id, kind ("overflow" | "template" | "engine" | "no_model"), message, [prompt_tokens, n_ctx]
    count         id, prompt_tokens, n_ctx
    coverage      id, results [[stored, total]]
    cache         id, stats, [verify {checked, bad, removed}]
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import queue
import threading
import traceback
from pathlib import Path
from typing import Any

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

    def send(self, request: dict) -> None:
        """Send a request. Raises OSError/EOFError (BrokenPipeError) if the child is gone."""
        assert self._conn is not None
        self._conn.send(request)

    def recv(self, timeout: float | None = None) -> dict | None:
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
                self._conn.send({"op": "shutdown"})
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
    _Server(conn, Path(data_dir)).run()


class _Server:
    def __init__(self, conn, data_dir: Path):
        self.conn = conn
        self.data_dir = data_dir
        self.inbox: queue.Queue[dict] = queue.Queue()
        self.cancels: dict[Any, threading.Event] = {}
        self.engine = None
        self.store = None
        self._send_lock = threading.Lock()

    def send(self, event: dict) -> None:
        with self._send_lock:
            self.conn.send(event)

    def _reader(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.inbox.put({"op": "shutdown"})
                return
            if msg.get("op") == "cancel":
                self.cancels.setdefault(msg.get("id"), threading.Event()).set()
                continue
            self.inbox.put(msg)
            if msg.get("op") == "shutdown":
                return

    def run(self) -> None:
        threading.Thread(target=self._reader, daemon=True, name="engine-reader").start()
        while True:
            msg = self.inbox.get()
            op = msg.get("op")
            if op == "shutdown":
                break
            try:
                getattr(self, f"op_{op}")(msg)
            except Exception as exc:  # one bad request must not end the process
                log.error("request %s failed:\n%s", op, traceback.format_exc())
                self.send({"event": "error", "id": msg.get("id"), "kind": "engine",
                           "message": f"The engine could not do that: {exc}"})
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            self.store.close()

    # -- operations ----------------------------------------------------------------------

    def op_load(self, msg: dict) -> None:
        from engine.core import Engine
        from engine.cpu import CrashVerdict
        from engine.errors import EngineError
        from engine.settings import EngineSettings
        from storage.paths import KVCACHE_DB
        from storage.prefix_store import DEFAULT_BUDGET_BYTES, PrefixStore, StoreError

        if self.engine is not None:
            self.engine.close()
            self.engine = None
        try:
            settings = EngineSettings.from_dict(msg.get("settings"))
            if self.store is None:
                try:
                    self.store = PrefixStore(self.data_dir / KVCACHE_DB,
                                             msg.get("budget_bytes") or DEFAULT_BUDGET_BYTES)
                except StoreError as exc:
                    log.warning("running without the prefix store: %s", exc)
            elif msg.get("budget_bytes"):
                self.store.budget_bytes = int(msg["budget_bytes"])
            self.engine = Engine(
                msg["path"], settings, self.store,
                progress=lambda d, t: self.send({"event": "load_progress", "done": d, "total": t}),
                crash_verdict=CrashVerdict.applies(self.data_dir),
            )
        except (EngineError, ValueError, OSError) as exc:
            self.send({"event": "load_failed", "message": str(exc)})
            return
        facts = self.engine.model.facts.to_dict()
        if self.engine.layout is not None:
            facts["kv_bytes_per_token"] = self.engine.layout.bytes_per_token
        self.send({"event": "loaded", "facts": facts})

    def _require_engine(self, msg: dict) -> bool:
        if self.engine is None:
            self.send({"event": "error", "id": msg.get("id"), "kind": "no_model",
                       "message": "No model is loaded. Open a model first."})
            return False
        return True

    def op_generate(self, msg: dict) -> None:
        from engine.errors import ContextOverflowError, TemplateError
        from engine.settings import SamplingParams

        if not self._require_engine(msg):
            return
        rid = msg.get("id")
        cancel = self.cancels.setdefault(rid, threading.Event())
        try:
            result = self.engine.generate(
                _messages(msg["messages"]),
                SamplingParams.from_dict(msg.get("sampling")),
                use_cache=msg.get("use_cache", True),
                on_token=lambda text, _tok: text and self.send({"event": "token", "id": rid, "text": text}),
                on_progress=lambda phase, done, total: self.send(
                    {"event": "progress", "id": rid, "phase": phase, "done": done, "total": total}),
                cancel=cancel,
                snapshot=False,
            )
        except ContextOverflowError as exc:
            self.send({"event": "error", "id": rid, "kind": "overflow", "message": str(exc),
                       "prompt_tokens": exc.prompt_tokens, "n_ctx": exc.n_ctx})
            return
        except TemplateError as exc:
            self.send({"event": "error", "id": rid, "kind": "template", "message": str(exc)})
            return
        finally:
            self.cancels.pop(rid, None)
        self.send({"event": "done", "id": rid, "text": result.text, "token_ids": result.token_ids,
                   "stats": result.stats.to_dict()})
        if msg.get("use_cache", True):
            self.engine.snapshot(result.stats)
            self.send({"event": "snapshot", "id": rid, "snapshot_ms": round(result.stats.snapshot_ms, 2),
                       "bytes_written": result.stats.snapshot_bytes_written})

    def op_count(self, msg: dict) -> None:
        if not self._require_engine(msg):
            return
        ids = self.engine.prompt_tokens(_messages(msg["messages"]))
        self.send({"event": "count", "id": msg.get("id"), "prompt_tokens": len(ids),
                   "n_ctx": self.engine.llama.n_ctx()})

    def op_coverage(self, msg: dict) -> None:
        if not self._require_engine(msg):
            return
        results = [list(self.engine.cached_tokens(_messages(p))) for p in msg["paths"]]
        self.send({"event": "coverage", "id": msg.get("id"), "results": results})

    def _cache_event(self, msg: dict, **extra) -> None:
        stats = self.store.stats() if self.store is not None else {}
        self.send({"event": "cache", "id": msg.get("id"), "stats": stats, **extra})

    def op_cache_stats(self, msg: dict) -> None:
        self._cache_event(msg)

    def op_cache_clear(self, msg: dict) -> None:
        if self.store is not None:
            self.store.clear()
        if self.engine is not None:
            self.engine.reset_context()
        self._cache_event(msg)

    def op_cache_verify(self, msg: dict) -> None:
        report = self.store.verify() if self.store is not None else None
        self._cache_event(msg, verify=report.__dict__ if report else None)

    def op_set_budget(self, msg: dict) -> None:
        if self.store is not None:
            self.store.budget_bytes = int(msg["bytes"])
            self.store.evict()
        self._cache_event(msg)


def _messages(raw: list[dict]):
    from engine.chat_template import ChatMessage

    return [ChatMessage(m["role"], m["content"], m.get("token_ids")) for m in raw]
