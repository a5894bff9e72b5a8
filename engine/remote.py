"""A remote engine: the same ``generate`` as :class:`engine.core.Engine`, answered by an
OpenAI-compatible server (llama.cpp ``llama-server``, vLLM, SGLang, Ollama's ``/v1``,
LM Studio, ``branchwise serve``).

This is the only code in Branchwise that opens a network connection, and only to the
URL the user typed: no proxy from the environment (``trust_env=False``), no redirects
followed. The request is ``POST {base}/chat/completions`` with ``stream: true`` (the
OpenAI API reference, "Create chat completion"); the reply arrives as server-sent
events, one ``chat.completion.chunk`` per ``data:`` line, ending with ``data: [DONE]``.
``stream_options: {"include_usage": true}`` asks for a last chunk with ``usage``, and
``usage.prompt_tokens_details.cached_tokens`` (OpenAI's field; vLLM, llama-server and
``branchwise serve`` fill it) becomes ``stats.restored_tokens``; llama-server's
``timings`` object (``cache_n``, ``prompt_n``, ``prompt_ms``: tools/server/server.cpp)
is read when there is no usage. A server that reports neither leaves those stats 0 with
``stats.reported`` False.

Only the portable OpenAI sampling fields are sent (temperature, top_p, max_tokens,
seed); top_k, min_p and the repeat penalty are the server's own settings.

Bounds, so a hostile or broken server cannot grow the client or hold it forever: one
line (one event) of at most ``MAX_LINE_BYTES``; ``max_tokens`` counted here, one token
a text chunk (and ``MAX_CHARS_PER_TOKEN`` characters each), ending the request with
finish reason "length" when the server does not stop; ``timeout_s`` without progress
(``:`` keep-alives are no progress) and ``deadline_s`` for the whole reply; an error
answer's body read up to 64 KiB. A redirect, an HTML page and a chunk of the wrong shape
each get their own sentence.

Failures raise :class:`RemoteEngineError` with one sentence naming the server and
what to do; a connection lost mid-reply carries the text received so far in
``partial`` (the caller keeps it, marked stopped).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from engine.chat_template import ChatMessage
from engine.chat_engine import GenerationResult, GenerationStats, ProgressFn, TokenFn
from engine.errors import EngineError
from engine.settings import SamplingParams
from engine.tool_calls import as_text

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # between two chunks: a CPU server prefilling a long prompt is slow
DEADLINE_S = 3600.0  # one whole reply, keep-alives or not
MAX_LINE_BYTES = 1024 * 1024  # one SSE line (one event): real chunks are a few hundred bytes
MAX_CHARS_PER_TOKEN = 256  # text allowed per --max-tokens token (no vocabulary has longer tokens)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


class RemoteEngineError(EngineError):
    """The server could not be reached or refused the request.

    ``status`` is the HTTP status (None for connection failures); ``partial`` is the
    reply text received before the connection was lost ("" if none).
    """

    def __init__(self, message: str, status: int | None = None, partial: str = ""):
        super().__init__(message)
        self.status, self.partial = status, partial


@dataclass
class RemoteStats(GenerationStats):
    """:class:`GenerationStats` as reported by a server. ``restored_tokens`` is the
    server's ``cached_tokens``; ``ttft_ms`` and ``decode_tokens_per_s`` are measured
    here (network included); ``reported`` is False when the server sent no usage."""

    server: str = ""
    model: str = ""
    reported: bool = False


def chat_completions_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/v1/chat/completions``;
    ``.../v1`` -> ``.../v1/chat/completions``; a full ``.../chat/completions`` is kept.

    Raises:
        RemoteEngineError: not an http(s) URL.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteEngineError(f"--engine-url must be an http:// or https:// URL such as "
                                f"http://127.0.0.1:8080/v1, not {clean(url)!r}.")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path = (path or "/v1") + "/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def clean(text: str, limit: int = 300) -> str:
    """Server-supplied text for one terminal line: control and bidi characters removed, cut short."""
    text = _CONTROL.sub(" ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RemoteEngine:
    """Generate replies on an OpenAI-compatible server.

    Args:
        url: the server's base URL (``http://host:8000/v1``) or its chat-completions URL.
        api_key: sent as ``Authorization: Bearer KEY`` when given.
        model: the model name to request; None asks ``GET {base}/models`` for the first.
        timeout_s: longest wait for the connection, and without progress (``:``
            keep-alives are no progress).
        deadline_s: longest time for one whole reply.
    """

    is_remote = True  # engine.chat_engine.ChatEngine

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, *,
                 timeout_s: float = READ_TIMEOUT_S, deadline_s: float = DEADLINE_S,
                 transport: httpx.BaseTransport | None = None):
        self.url = chat_completions_url(url)
        self.base = self.url.removesuffix("/chat/completions")
        self.host = urlsplit(self.url).netloc
        self._model_name = model
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            headers=headers, trust_env=False, follow_redirects=False, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
        )
        self.timeout_s, self.deadline_s = timeout_s, deadline_s
        self._lock = threading.Lock()

    # -- the ChatEngine surface (engine/chat_engine.py) ----------------------------------

    def snapshot(self, stats=None) -> int:
        """Nothing to store: the server keeps its own cache."""
        return 0

    def reset_context(self) -> None:
        pass

    def close(self) -> None:
        self._client.close()

    def model_name(self) -> str:
        """The model name to request (asks the server once when none was given).

        Raises:
            RemoteEngineError: the server cannot be reached or lists no model.
        """
        if self._model_name:
            return self._model_name
        with self._errors():
            r = self._client.get(self.base + "/models")
        if r.status_code >= 300:
            raise self._status_error(r)
        try:
            self._model_name = as_text(str(r.json()["data"][0]["id"]))
        except (ValueError, KeyError, IndexError, TypeError):
            raise RemoteEngineError(f"The server at {self.host} did not list its models at {self.base}/models; "
                                    "pass --engine-model NAME.") from None
        return self._model_name

    def generate(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams | None = None,
        *,
        use_cache: bool = True,
        on_token: TokenFn | None = None,
        on_progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        snapshot: bool = True,
        on_reasoning: TokenFn | None = None,
        thinking_budget: int | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        parallel_tool_calls: bool | None = None,
    ) -> GenerationResult:
        """Stream the reply to ``messages`` from the server.

        ``tools``, ``tool_choice`` and ``parallel_tool_calls`` are sent as given (OpenAI's
        fields), and messages' ``tool_calls``, ``tool_call_id`` and ``name`` with them; the
        server's ``tool_calls`` deltas are joined by index into ``result.tool_calls``
        (OpenAI's objects, ids, names and argument text as the server sent them; the
        server's template and parser made them).

        Reasoning that the server sends apart (``reasoning_content``, as llama-server,
        vLLM and DeepSeek's API do, or ``reasoning``) goes to ``on_reasoning(delta, -1)``
        and ``result.reasoning``; earlier replies' reasoning is sent back in
        ``reasoning_content``. ``thinking_budget`` is the Engine's; servers take none here.

        ``use_cache`` and ``snapshot`` are accepted for the Engine's signature; the
        server decides about its own cache. ``on_token(delta, -1)`` gets each text piece
        (token ids are not sent by these servers). ``result.token_ids`` is None.

        Raises:
            RemoteEngineError: connection refused or lost, timeout, 401, 429, a 4xx/5xx
                answer (its message is in the error); ``partial`` holds any text received.
        """
        sp = sampling or SamplingParams()
        with self._lock:
            model = self.model_name()
            body = {
                "model": model,
                "messages": [_wire_message(m) for m in messages],
                "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": sp.temperature,
                "top_p": sp.top_p,
                "max_tokens": sp.max_tokens,
            }
            if sp.seed is not None:
                body["seed"] = sp.seed
            for key, value in (("tools", tools), ("tool_choice", tool_choice), ("parallel_tool_calls", parallel_tool_calls)):
                if value is not None:
                    body[key] = value
            calls = _ToolCallDeltas(self.host, sp.max_tokens * MAX_CHARS_PER_TOKEN)
            stats = RemoteStats(server=self.host, model=model, restore_source="server")
            parts: list[str] = []
            thoughts: list[str] = []  # reasoning_content deltas
            t0 = time.perf_counter()
            t_first = t_last = None
            chunks = 0
            bounds = _StreamBounds(self, sp.max_tokens, parts)
            with self._errors(parts):
                with self._client.stream("POST", self.url, json=body) as r:
                    if r.status_code >= 300:
                        raise self._status_error(r, _read_capped(r) if r.status_code >= 400 else b"")
                    self._check_stream_type(r)
                    if on_progress:
                        on_progress("prefill", 0, 0)
                    ended = False
                    for line in bounds.lines(r):
                        if cancel is not None and cancel.is_set():
                            stats.finish_reason = "cancelled"
                            break
                        if not line.startswith("data:"):
                            bounds.first_line = bounds.first_line or line
                            continue  # ":" keep-alives, "event:", "id:": no progress
                        bounds.events += 1
                        data = line[5:].strip()
                        if data == "[DONE]":
                            ended = True
                            break
                        try:
                            event = json.loads(data)
                        except ValueError:
                            continue
                        if not isinstance(event, dict):
                            continue
                        if "error" in event:
                            raise RemoteEngineError(self._server_says(event, r.status_code), r.status_code,
                                                    "".join(parts))
                        self._read_usage(event, stats)
                        calls.read(event)
                        over = False  # more text than --max-tokens allows: the server ignores it
                        for delta, thought, finish in self._choices(event, parts):
                            if thought:
                                thoughts.append(thought)
                                if on_reasoning:
                                    on_reasoning(thought, -1)
                            if delta and bounds.reached_max_tokens(chunks):
                                over = True
                                break
                            if delta:
                                now = time.perf_counter()
                                if t_first is None:
                                    t_first = now
                                    stats.ttft_ms = (now - t0) * 1000
                                t_last = now
                                chunks += 1
                                parts.append(delta)
                                bounds.progress(len(delta))
                                if on_token:
                                    on_token(delta, -1)
                            if finish:
                                stats.finish_reason = _finish(finish)
                                bounds.progress(0)
                        if over:  # counted here: a server that ignores max_tokens is cut at the next chunk
                            stats.finish_reason = "length"  # (one that honours it still sends its usage)
                            ended = True
                            break
                    else:
                        ended = bool(stats.finish_reason)
                    if not ended and stats.finish_reason != "cancelled":  # the stream ended without [DONE]
                        if not bounds.events and bounds.first_line.lstrip().startswith("<"):
                            raise self._html_error(r.status_code)
                        raise RemoteEngineError(
                            f"The server at {self.host} closed the connection mid-reply"
                            + ("; the partial reply is kept, marked stopped." if parts else "."),
                            None, "".join(parts))
            if not stats.generated_tokens:
                stats.generated_tokens = chunks
            if t_first is not None and t_last is not None and stats.generated_tokens > 1 and t_last > t_first:
                stats.decode_tokens_per_s = (stats.generated_tokens - 1) / (t_last - t_first)
            if stats.reported and stats.prompt_tokens:
                stats.prefilled_tokens = max(stats.prompt_tokens - stats.restored_tokens, 0)
            stats.finish_reason = stats.finish_reason or "stop"
            return GenerationResult("".join(parts), None, stats, [],  # type: ignore[arg-type]
                                    "".join(thoughts) if thoughts else None, calls.joined())

    # -- helpers -------------------------------------------------------------------------

    def _choices(self, event: dict, parts: list[str]):
        """``(delta text, reasoning text, finish_reason)`` of each choice of a chunk; the
        reasoning is ``reasoning_content`` (DeepSeek, vLLM, llama-server) or ``reasoning``.

        Raises:
            RemoteEngineError: ``choices`` or a choice is not the shape OpenAI's chunk has.
        """
        choices = event.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise self._malformed(f"'choices' is {_kind(choices)}, not a list", parts)
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._malformed(f"a choice is {_kind(choice)}, not an object", parts)
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise self._malformed(f"'delta' is {_kind(delta)}, not an object", parts)
            content = (delta or {}).get("content")
            if content is not None and not isinstance(content, str):
                raise self._malformed(f"'content' is {_kind(content)}, not a string", parts)
            thought = (delta or {}).get("reasoning_content") or (delta or {}).get("reasoning")
            # A lone surrogate (JSON "\ud800") is no character and UTF-8 cannot hold it: U+FFFD
            # here, or saving, printing and the JSON answer fail after the reply streamed.
            yield (as_text(content or ""), as_text(thought) if isinstance(thought, str) else "",
                   choice.get("finish_reason"))

    def _malformed(self, what: str, parts: list[str] | None) -> RemoteEngineError:
        partial = "".join(parts or [])
        kept = "; the partial reply is kept, marked stopped" if partial else ""
        return RemoteEngineError(f"The server at {self.host} sent an event that is not an OpenAI chat-completion "
                                 f"chunk ({what}){kept}.", None, partial)

    def _check_stream_type(self, r: httpx.Response) -> None:
        """Refuse a 2xx answer that is a web page (a login portal, a proxy, the wrong URL)."""
        kind = r.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind in ("text/html", "application/xhtml+xml"):
            raise self._html_error(r.status_code)

    def _html_error(self, status: int) -> RemoteEngineError:
        return RemoteEngineError(f"The server at {self.host} answered with an HTML page, not an OpenAI-compatible "
                                 f"stream: is --engine-url right? It usually ends in /v1 ({clean(self.url)}).",
                                 status)

    @staticmethod
    def _read_usage(event: dict, stats: RemoteStats) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            stats.reported = True
            stats.prompt_tokens = _int(usage.get("prompt_tokens"), stats.prompt_tokens)
            stats.generated_tokens = _int(usage.get("completion_tokens"), stats.generated_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                stats.restored_tokens = _int(details.get("cached_tokens"), stats.restored_tokens)
        timings = event.get("timings")
        if isinstance(timings, dict):  # llama-server (and branchwise serve)
            stats.reported = True
            cached = _int(timings.get("cache_n"), -1)
            prompt_n = _int(timings.get("prompt_n"), -1)
            if cached >= 0 and not usage:
                stats.restored_tokens = cached
            if prompt_n >= 0:
                stats.prefilled_tokens = prompt_n
                if not stats.prompt_tokens and cached >= 0:
                    stats.prompt_tokens = cached + prompt_n
            ms = timings.get("prompt_ms")
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                stats.prefill_ms = float(ms)

    def _server_says(self, payload, status: int | None) -> str:
        msg = ""
        if isinstance(payload, dict):
            err = payload.get("error")
            if isinstance(err, dict):
                msg = err.get("message") or ""
            elif isinstance(err, str):
                msg = err
            msg = msg or payload.get("message") or payload.get("detail") or ""
        code = f" ({status})" if status else ""
        return f"The server at {self.host} refused the request{code}: {clean(msg) or 'no reason given'}"

    def _status_error(self, r: httpx.Response, body: bytes | None = None) -> RemoteEngineError:
        """The error for ``r``'s status; ``body`` is its (capped) body when ``r`` streams,
        None to read ``r.content``."""
        status = r.status_code
        if 300 <= status < 400:
            where = clean(r.headers.get("location", ""), 200) or "another address"
            return RemoteEngineError(f"The server at {self.host} redirected to {where} ({status}); Branchwise does "
                                     "not follow redirects: pass the address you mean as --engine-url.", status)
        raw = r.content if body is None else body
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = {"error": raw.decode("utf-8", "replace")[:300]}
        if status in (401, 403):
            return RemoteEngineError(f"The server at {self.host} refused the API key ({status}): pass the right "
                                     "one with --engine-key KEY.", status)
        if status == 429:
            wait = r.headers.get("retry-after", "")
            hint = f" in {clean(wait, 20)} s" if wait.strip().isdigit() else " in a moment"
            return RemoteEngineError(f"The server at {self.host} is busy (429); try again{hint}. "
                                     "Your message is kept.", status)
        if status == 404:
            return RemoteEngineError(self._server_says(payload, status) + f" (is {self.url} an OpenAI-compatible "
                                     "endpoint? --engine-url usually ends in /v1)", status)
        return RemoteEngineError(self._server_says(payload, status), status)

    class _Guard:
        def __init__(self, engine: "RemoteEngine", parts: list[str] | None):
            self.engine, self.parts = engine, parts

        def __enter__(self):
            return self

        def __exit__(self, kind, exc, tb):
            if exc is None or not isinstance(exc, httpx.HTTPError):
                return False
            host, partial = self.engine.host, "".join(self.parts or [])
            kept = "; the partial reply is kept, marked stopped" if partial else ""
            if isinstance(exc, httpx.ConnectTimeout):
                text = f"Could not connect to the server at {host} within {CONNECT_TIMEOUT_S:.0f} s."
            elif isinstance(exc, httpx.TimeoutException):
                text = f"The server at {host} sent nothing for {self.engine.timeout_s:.0f} s{kept}."
            elif isinstance(exc, httpx.ConnectError):
                text = (f"Could not connect to the server at {host} ({clean(exc, 120) or 'connection refused'}); "
                        "is it running, and is --engine-url right?")
            elif isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
                text = f"The server at {host} closed the connection mid-reply{kept}."
            else:
                text = f"The request to the server at {host} failed ({clean(exc, 120)}){kept}."
            raise RemoteEngineError(text, None, partial) from exc

    def _errors(self, parts: list[str] | None = None) -> "RemoteEngine._Guard":
        return RemoteEngine._Guard(self, parts)


class _StreamBounds:
    """What one streamed reply may take: lines of at most :data:`MAX_LINE_BYTES` (an
    event is one ``data:`` line), ``max_tokens`` text chunks (each chunk counted as a
    token: a server that ignores ``max_tokens`` is cut here), :data:`MAX_CHARS_PER_TOKEN`
    characters per allowed token, ``timeout_s`` without progress (text, a finish or
    usage; ``:`` keep-alives do not count) and ``deadline_s`` in all."""

    def __init__(self, engine: "RemoteEngine", max_tokens: int, parts: list[str]):
        self.engine, self.max_tokens, self.parts = engine, max(int(max_tokens), 1), parts
        self.started = self.last_progress = time.monotonic()
        self.chars = self.events = 0
        self.first_line = ""  # the first line that is not an event (an HTML page's "<!DOCTYPE html>")

    def progress(self, chars: int) -> None:
        self.last_progress = time.monotonic()
        self.chars += chars
        if self.chars > self.max_tokens * MAX_CHARS_PER_TOKEN:
            self._fail(f"sent more than {self.max_tokens * MAX_CHARS_PER_TOKEN:,} characters for a reply of at most "
                       f"{self.max_tokens:,} tokens (--max-tokens)")

    def reached_max_tokens(self, chunks: int) -> bool:
        return chunks >= self.max_tokens

    def lines(self, r: httpx.Response):
        """The response's lines (without their ending), each checked against the bounds.

        Raises:
            RemoteEngineError: a line over :data:`MAX_LINE_BYTES`, no progress for
                ``timeout_s``, or past the overall deadline.
        """
        buf = bytearray()
        for chunk in r.iter_bytes():
            self._check_time()
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    buf += chunk[start:]
                    break
                buf += chunk[start:nl]
                if len(buf) > MAX_LINE_BYTES:
                    self._line_too_long()
                yield buf.rstrip(b"\r").decode("utf-8", "replace")
                buf.clear()
                start = nl + 1
            if len(buf) > MAX_LINE_BYTES:
                self._line_too_long()
        if buf:
            yield buf.decode("utf-8", "replace")

    def _check_time(self) -> None:
        now, e = time.monotonic(), self.engine
        if now - self.started > e.deadline_s:
            self._fail(f"did not finish the reply within {e.deadline_s:,.0f} s")
        if now - self.last_progress > e.timeout_s:
            self._fail(f"sent nothing but keep-alives for {e.timeout_s:,.0f} s")

    def _line_too_long(self) -> None:
        self._fail(f"sent a line longer than {MAX_LINE_BYTES // 1024 ** 2} MiB (no OpenAI chunk is that large)")

    def _fail(self, what: str) -> None:
        partial = "".join(self.parts)
        kept = "; the partial reply is kept, marked stopped" if partial else ""
        raise RemoteEngineError(f"The server at {self.engine.host} {what}, so the request was ended{kept}.",
                                None, partial)


def _wire_message(m: ChatMessage) -> dict:
    """A message as OpenAI's API takes it (with an earlier reply's reasoning, and tool fields)."""
    out = {"role": m.role, "content": m.content if m.content or not m.tool_calls else None}
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = list(m.tool_calls)
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None and m.role == "tool":
        out["name"] = m.name
    return out


class _ToolCallDeltas:
    """A stream's ``delta.tool_calls`` pieces joined by ``index``: the first carries ``id``,
    ``type`` and ``function.name``, the rest ``function.arguments`` text to append."""

    def __init__(self, host: str, limit: int):
        self.calls: dict[int, dict] = {}
        self.host, self.limit, self.chars = host, limit, 0

    def read(self, event: dict) -> None:
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
            for piece in pieces if isinstance(pieces, list) else []:
                if not isinstance(piece, dict):
                    continue
                index = _int(piece.get("index"), len(self.calls))
                call = self.calls.setdefault(index, {"id": "", "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                fn = piece.get("function") if isinstance(piece.get("function"), dict) else {}
                for key in ("id", "type"):
                    if isinstance(piece.get(key), str) and piece[key]:
                        call[key] = piece[key]
                if isinstance(fn.get("name"), str) and fn["name"]:
                    call["function"]["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    call["function"]["arguments"] += fn["arguments"]
                    self.chars += len(fn["arguments"])
                if self.chars > self.limit or len(self.calls) > 128:
                    raise RemoteEngineError(f"The server at {self.host} sent more tool-call text than --max-tokens "
                                            "allows, so the request was ended.")

    def joined(self) -> list[dict] | None:
        return [self.calls[i] for i in sorted(self.calls)] or None


def _read_capped(r: httpx.Response, limit: int = 64 * 1024) -> bytes:
    """At most ``limit`` bytes of a streamed error answer's body: an error object is small,
    a hostile one need not be."""
    body = bytearray()
    for chunk in r.iter_bytes():
        body += chunk
        if len(body) >= limit:
            break
    return bytes(body[:limit])


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _int(value, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _finish(reason) -> str:
    return {"stop": "stop", "length": "length", "eos": "stop"}.get(str(reason), "stop")
