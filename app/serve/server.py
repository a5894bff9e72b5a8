"""``branchwise serve``: the engine and its prefix store behind an OpenAI-compatible API.

Routes: ``POST /v1/chat/completions`` (streaming as server-sent events, and not) and
``GET /v1/models``, on Starlette + uvicorn. One :class:`ApiServer` owns one engine:

* **One request at a time, in order.** Requests wait in a bounded FIFO queue and one
  worker thread serves them; when the queue is full the client gets 429 with a
  ``Retry-After`` header (seconds, estimated from the recent request durations).
* **Every request goes through the prefix store** (``Engine.generate`` with
  ``use_cache``): a client that resends a long history gets it restored, also after a
  restart. ``usage.prompt_tokens_details.cached_tokens`` is the number of prompt tokens
  restored instead of prefilled. Replies the server generated are resent by clients as
  text; :mod:`app.serve.replies` maps them back to the ids that were generated, so the
  prompt stays a token-prefix of what is stored.
* **A client that disconnects cancels its request**, queued or running.
* **Loopback only, unless there is a key.** It binds 127.0.0.1 by default; any other
  address needs an API key, and then every route checks ``Authorization: Bearer KEY``.
* **No cross-site requests** (:mod:`app.serve.guard`): a foreign ``Host``, an ``Origin``
  not configured, or a POST body that is not ``application/json`` gets a 403.
* **Errors are OpenAI error objects with a 4xx status**: bad JSON, unknown fields,
  wrong types, prompts over the context window, bodies over 8 MiB. An unexpected
  failure is a 500 with a one-line message; the traceback goes to the log only.

Served conversations are not written to chats.sqlite3: the client owns its history
(it resends it with every request) and Branchwise's chat list stays the user's own.

``branchwise serve`` calls :meth:`ApiServer.serve_forever`. The window does not run this
class itself: Server → Start API server starts ``branchwise serve --json`` as a ``QProcess``
child with its own engine (app/window/flows/server_controller.py). :meth:`ApiServer.start` runs
uvicorn on a thread of the calling process instead (the tests use it) and
:meth:`ApiServer.stop` ends it; :attr:`ApiServer.state` is a :class:`ServerState` and
``on_state`` reports every change (from a server thread).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import queue
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.serve import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_QUEUE, ServeError, protocol
from app.serve.guard import CrossSiteGuard
from app.serve.prompt_bound import refuse_far_over
from app.serve.protocol import ApiError, ChatRequest, StopScanner
from app.serve.replies import ReplyMemory
from app.serve.tool_turn import ToolTurn
from engine.chat_template import ChatMessage
from engine.errors import ContextOverflowError, EngineError, TemplateError
from engine.process_exit import RepeatFilter
from engine.settings import SamplingParams
from engine.tool_grammar import GrammarError

log = logging.getLogger(__name__)


class ServerState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"  # the client went away before or while it ran


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class _Job:
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancel: threading.Event = field(default_factory=threading.Event)
    state: JobState = JobState.QUEUED

    def emit(self, kind: str, value=None) -> None:
        """Hand an event to the request's coroutine (called on the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancel.set()

    def reasoning(self, delta: str, _tok: int) -> None:
        """A piece of a reasoning model's thinking (streamed as ``reasoning_content`` deltas)."""
        self.emit("reasoning", delta)


_DELTA_FIELD = {"token": "content", "reasoning": "reasoning_content"}  # a stream delta's field per event kind


def _drop_bind_errors(record: logging.LogRecord) -> bool:
    """uvicorn logs a failed bind as its own "ERROR: [Errno 98] ..." line; ApiServer raises
    ServeError with one line of its own instead, so that record goes to the debug log only."""
    if isinstance(record.msg, OSError):
        log.debug("uvicorn could not listen: %s", record.msg)
        return False
    return True


class ApiServer:
    """An OpenAI-compatible HTTP server for one engine.

    Args:
        engine: an ``engine.core.Engine`` (or anything with its ``generate``,
            ``snapshot`` and ``model`` surface); the server does not close it.
        model_id: the name ``GET /v1/models`` lists and replies carry.
        host, port: where to listen; port 0 picks a free port (see :attr:`port`).
        api_key: required (Bearer) on every route when set; required for a host that
            is not loopback.
        queue_size: requests that may wait behind the running one before 429.
        reply_memory: see :mod:`app.serve.replies` (None keeps it in memory only).
        sampling: the sampling for fields a request leaves out (default: Branchwise's,
            the same as ``branchwise chat``, so temperature 0 gives the same reply).
        use_cache: False prefills every request in full (no prefix store, no live reuse).
        on_state: ``on_state(ServerState)`` on every change, called from a server thread.
        allowed_hosts, allowed_origins: more ``Host`` names, web origins (app/serve/guard.py).

    Raises:
        ServeError: a non-loopback host without an API key.
    """

    def __init__(self, engine, model_id: str, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 api_key: str | None = None, queue_size: int = DEFAULT_QUEUE,
                 reply_memory: ReplyMemory | None = None, sampling: SamplingParams | None = None,
                 use_cache: bool = True,
                 on_state: Callable[[ServerState], None] | None = None,
                 allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        if not is_loopback(host) and not api_key:
            raise ServeError(
                f"Refusing to listen on {host} without an API key: anyone who can reach this machine "
                "could use it. Pass --api-key KEY (clients send it as 'Authorization: Bearer KEY'), "
                f"or listen on {DEFAULT_HOST}.")
        self.engine, self.model_id, self.host, self.port = engine, model_id, host, port
        self.api_key = api_key or None
        self.queue_size = queue_size
        self.replies = reply_memory or ReplyMemory(None)
        self.on_state = on_state
        self.sampling = sampling or SamplingParams()
        self.use_cache = use_cache
        self.allowed_hosts, self.allowed_origins = list(allowed_hosts), list(allowed_origins)
        self.state = ServerState.STOPPED
        self.error = ""  # why the server FAILED, in words
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._durations: deque[float] = deque(maxlen=16)
        self._worker: threading.Thread | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._model_key = (getattr(engine, "fingerprint", b"") or model_id.encode())
        self.app = self._build_app()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def _set_state(self, state: ServerState) -> None:
        self.state = state
        if self.on_state:
            try:
                self.on_state(state)
            except Exception:  # a listener's bug must not stop the server
                log.exception("on_state listener failed")

    def _make_uvicorn(self) -> uvicorn.Server:
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=3)
        uvicorn_log = logging.getLogger("uvicorn.error")  # configured by Config() above
        if _drop_bind_errors not in uvicorn_log.filters:
            uvicorn_log.addFilter(_drop_bind_errors)
        owner = self
        repeats = RepeatFilter()

        class _Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                # A terminal Ctrl+C arrives twice under `branchwise serve`'s supervisor (from the
                # terminal and passed on by it): one stop, not uvicorn's "force exit".
                if sig == signal.SIGINT and repeats.is_repeat():
                    return
                super().handle_exit(sig, frame)

            async def startup(self, sockets=None):
                await super().startup(sockets)
                if self.started:
                    for srv in self.servers:
                        for sock in srv.sockets:
                            owner.port = sock.getsockname()[1]
                            break
                    owner._set_state(ServerState.RUNNING)
                owner._started.set()

        return _Server(config)

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._work, name="serve-worker", daemon=True)
        self._worker.start()

    def serve_forever(self) -> None:
        """Run on the calling thread until Ctrl-C (uvicorn handles SIGINT/SIGTERM).

        Raises:
            ServeError: the address cannot be bound.
        """
        self._set_state(ServerState.STARTING)
        self._start_worker()
        self._uvicorn = self._make_uvicorn()
        try:
            self._uvicorn.run()
        except SystemExit:  # uvicorn exits on a bind failure after logging it
            pass
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: a normal stop
            pass
        finally:
            self._shutdown_worker()
        if self.state != ServerState.RUNNING:
            self.error = self.error or f"could not listen on {self.host}:{self.port} (is the port in use?)"
            self._set_state(ServerState.FAILED)
            raise ServeError(f"Could not listen on {self.host}:{self.port}: the port may be in use by another "
                             "program, or the address is not this machine's. Choose another port (--port N "
                             "on the command line; Settings → API server in the window).")
        self._set_state(ServerState.STOPPED)

    def start(self, timeout: float = 30.0) -> None:
        """Start listening on a background thread; returns once it listens.

        Raises:
            ServeError: it could not listen (the port is in use, the address is wrong).
        """
        if self.state in (ServerState.STARTING, ServerState.RUNNING):
            return
        self._set_state(ServerState.STARTING)
        self._started.clear()
        self._start_worker()
        self._uvicorn = self._make_uvicorn()

        def run():
            try:
                self._uvicorn.run()
            except SystemExit:
                pass
            except Exception as exc:  # uvicorn's own failure: keep the window alive
                log.exception("the API server stopped")
                self.error = str(exc)
            finally:
                self._started.set()
                if self.state == ServerState.STARTING:
                    self.error = self.error or f"could not listen on {self.host}:{self.port}"
                    self._set_state(ServerState.FAILED)

        self._thread = threading.Thread(target=run, name="serve-http", daemon=True)
        self._thread.start()
        self._started.wait(timeout)
        if self.state != ServerState.RUNNING:
            self._shutdown_worker()
            raise ServeError(f"Could not listen on {self.host}:{self.port}: the port may be in use, "
                             "or the address is not this machine's.")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, cancel the running and queued requests, wait for the threads."""
        if self.state not in (ServerState.RUNNING, ServerState.STARTING):
            return
        self._set_state(ServerState.STOPPING)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._shutdown_worker()
        self._set_state(ServerState.STOPPED)

    def _shutdown_worker(self) -> None:
        while True:  # cancel what waits
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.emit("error", ApiError(503, "The server is shutting down.", type="server_error"))
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(30)
        self._worker = None

    # -- the worker thread -------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancel.is_set():
                job.state = JobState.CANCELLED
                continue
            t = time.monotonic()
            job.state = JobState.RUNNING
            try:
                self._run(job)
            except Exception:
                log.exception("a served request failed")
                job.emit("error", ApiError(500, "The server failed on this request; the details are in its log.",
                                           type="server_error", code="internal_error"))
            finally:
                self._durations.append(time.monotonic() - t)
                if job.state == JobState.RUNNING:
                    job.state = JobState.CANCELLED if job.cancel.is_set() else JobState.DONE

    def _run(self, job: _Job) -> None:
        req = job.request
        scanner = StopScanner(req.stop)
        started = False
        try:
            tools = ToolTurn(self.engine, req.tools, job.emit, scanner, job.cancel)
        except ApiError as exc:
            job.emit("error", exc)
            return

        def on_progress(_phase: str, _done: int, _total: int) -> None:
            nonlocal started
            if not started:  # the prompt fits and is being read: the response may begin
                started = True
                job.emit("started")

        def on_token(delta: str, _tok: int) -> None:
            if tools.stream is not None:
                return tools.on_token(delta)
            safe = scanner.feed(delta)
            if scanner.stopped:
                job.cancel.set()  # a stop sequence: end decoding here
            if safe:
                job.emit("token", safe)

        try:  # a message of megabytes is refused without tokenizing all of it
            refuse_far_over(self.engine, messages := self.replies.resent(self._model_key, req.messages, self.engine.model.detokenize))
            result = self.engine.generate(messages, req.sampling, use_cache=self.use_cache, on_token=on_token,
                                          on_progress=on_progress, cancel=job.cancel, snapshot=False, on_reasoning=job.reasoning,
                                          tools=tools.render_tools, grammar=tools.grammar)
        except ContextOverflowError as exc:
            job.emit("error", _overflow_error(exc))
            return
        except (TemplateError, GrammarError) as exc:  # GrammarError: llama.cpp refused the tools' schemas
            param = "tools" if isinstance(exc, GrammarError) else "messages"
            job.emit("error", ApiError(400, str(exc), param=param, code="invalid_value"))
            return
        except EngineError as exc:
            job.emit("error", ApiError(500, str(exc), type="server_error", code="engine_error"))
            return
        calls = tools.end(result)
        tail = scanner.flush()
        if tail:
            job.emit("token", tail)
        stats = result.stats
        log.info("served: %d prompt tokens (%d restored, %d prefilled), %d generated, finish=%s, TTFT %.0f ms",
                 stats.prompt_tokens, stats.restored_tokens, stats.prefilled_tokens, stats.generated_tokens,
                 "stop-sequence" if scanner.stopped else stats.finish_reason, stats.ttft_ms)
        finish = protocol.TOOL_CALLS if calls else "stop" if scanner.stopped else protocol.FINISH.get(
            stats.finish_reason, "stop")
        text, job.state = scanner.text, JobState.DONE
        job.emit("done", (text, finish, stats, result.reasoning, calls))
        # After the reply is out: store its KV (the client is reading) and its ids.
        if calls:
            tools.remember(self.replies, self._model_key, text, calls, result.token_ids)
        elif not scanner.stopped and result.token_ids and self.engine.model.detokenize(result.token_ids) == text:
            self.replies.remember(self._model_key, text, result.token_ids)
        if self.use_cache:
            self.engine.snapshot(stats)

    # -- HTTP --------------------------------------------------------------------------

    def _build_app(self) -> Starlette:
        async def http_error(_request, exc: HTTPException):
            return JSONResponse(protocol.error_body(exc.detail or "Not found.",
                                                    code="not_found" if exc.status_code == 404 else None),
                                status_code=exc.status_code)

        async def api_error(_request, exc: ApiError):
            return _error_response(exc)

        async def server_error(_request, exc: Exception):
            log.error("unexpected failure in the API server", exc_info=exc)
            return JSONResponse(protocol.error_body("The server failed on this request; the details are in "
                                                    "its log.", type="server_error", code="internal_error"),
                                status_code=500)

        app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self._model, methods=["GET"]),
        ], exception_handlers={HTTPException: http_error, ApiError: api_error, Exception: server_error})
        return _protected(app, self)

    def _model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "branchwise"}

    async def _models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: Request) -> Response:
        if request.path_params["model_id"] != self.model_id:
            raise ApiError(404, f"The model '{request.path_params['model_id']}' is not served here; "
                                f"this server serves '{self.model_id}'.", param="model", code="model_not_found")
        return JSONResponse(self._model_card())

    async def _read_json(self, request: Request):
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > protocol.MAX_BODY_BYTES:
            raise ApiError(413, f"The request body is {int(length):,} bytes; this server takes at most "
                                f"{protocol.MAX_BODY_BYTES:,}.", code="request_too_large")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > protocol.MAX_BODY_BYTES:
                raise ApiError(413, f"The request body is over {protocol.MAX_BODY_BYTES:,} bytes.",
                               code="request_too_large")
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            detail = f" ({exc})" if isinstance(exc, json.JSONDecodeError) else ""
            raise ApiError(400, f"The request body is not valid JSON{detail}.", code="invalid_json") from None

    def _retry_after(self) -> str:
        each = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return str(max(1, math.ceil(each * (self._jobs.qsize() + 1))))

    async def _chat(self, request: Request) -> Response:
        body = await self._read_json(request)
        req = await asyncio.to_thread(protocol.parse_chat_request, body, self.sampling)  # file parts: seconds
        if await request.is_disconnected():  # gone while its body was read or its files extracted: not queued
            return Response(status_code=499)
        loop = asyncio.get_running_loop()
        job = _Job(req, loop, asyncio.Queue())
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise ApiError(429, f"The server is busy: {self.queue_size} requests are already waiting. "
                                "Retry after the number of seconds in the Retry-After header.",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": self._retry_after()}) from None
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            kind, value = await job.events.get()  # "started", or an error, or (cancelled) nothing
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        if kind == "error":
            watcher.cancel()
            raise value
        if req.stream:
            return StreamingResponse(self._sse(job, watcher), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            parts = []
            while True:
                kind, value = await job.events.get()
                if kind == "token":
                    parts.append(value)
                elif kind == "error":
                    raise value
                elif kind == "done":
                    text, finish, stats, reasoning, calls = value
                    return JSONResponse(protocol.completion(protocol.completion_id(), self.model_id, text,
                                                            finish, stats, reasoning, calls))
        finally:
            watcher.cancel()
            if job.state != JobState.DONE:
                job.cancel.set()

    async def _sse(self, job: _Job, watcher: asyncio.Task):
        cid, created, model = protocol.completion_id(), int(time.time()), self.model_id

        def event(obj: dict) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        try:
            yield event(protocol.chunk(cid, model, created, {"role": "assistant", "content": ""}))
            while True:
                kind, value = await job.events.get()
                if kind in ("token", "reasoning"):
                    yield event(protocol.chunk(cid, model, created, {_DELTA_FIELD[kind]: value}))
                elif kind == "tool":  # a tool call's first delta (id, name) or its next arguments
                    yield event(protocol.chunk(cid, model, created, value.to_openai()))
                elif kind == "error":  # after the headers: an error event, as OpenAI's API sends
                    yield event(value.body())
                    return
                elif kind == "done":
                    _text, finish, stats, _reasoning, _calls = value
                    last = protocol.chunk(cid, model, created, {}, finish)
                    last["timings"] = protocol.timings(stats)
                    yield event(last)
                    if job.request.include_usage:
                        yield event({"id": cid, "object": "chat.completion.chunk", "created": created,
                                     "model": model, "choices": [], "usage": protocol.usage(stats)})
                    yield "data: [DONE]\n\n"
                    return
        finally:  # also on a disconnect (the generator is closed or cancelled)
            watcher.cancel()
            if job.state != JobState.DONE:
                job.cancel.set()


async def _watch_disconnect(request: Request, job: _Job) -> None:
    """Cancel ``job`` when the client goes away (queued: it is skipped; running: the
    engine stops at the next token or prefill batch)."""
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel.set()
                job.emit("error", ApiError(499, "The client disconnected.", code="client_disconnected"))
                return
    except (asyncio.CancelledError, RuntimeError, OSError):
        return


def _overflow_error(exc: ContextOverflowError) -> ApiError:
    least = "at least " if getattr(exc, "at_least", False) else ""  # app/serve/prompt_bound.py
    return ApiError(400, f"This request is {least}{exc.prompt_tokens:,} tokens long, but the model's context window "
                         f"holds {exc.n_ctx:,} (with room for at least one reply token).", param="messages",
                    code="context_length_exceeded")


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _protected(app, server: ApiServer):
    """``app`` behind the API key check and, outside that, the cross-site guard
    (:mod:`app.serve.guard`: CORS pre-flights carry no key)."""
    return CrossSiteGuard(_BearerAuth(app, server.api_key), server.host, lambda: server.port,
                          server.allowed_hosts, server.allowed_origins)


class _BearerAuth:
    """ASGI middleware: with a key, every HTTP request needs ``Authorization: Bearer KEY``
    (compared in constant time); otherwise 401 with an OpenAI error object."""

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.api_key:
            headers = dict(scope.get("headers") or [])
            # bytes on both sides: a header arrives as the bytes the client sent (UTF-8 for a
            # non-ASCII key), so it is compared with the key's UTF-8 bytes, in constant time
            given = headers.get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key.encode("utf-8")):
                response = JSONResponse(
                    protocol.error_body("Missing or wrong API key: send 'Authorization: Bearer KEY' with the key "
                                        "the server was started with (--api-key).", code="invalid_api_key"),
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port that was free a moment ago (for tests and the bench)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
