"""The OpenAI chat-completions wire format: validate a request, shape a reply.

The fields are OpenAI's (https://platform.openai.com/docs/api-reference/chat/create);
``top_k``, ``min_p`` and ``repeat_penalty`` are llama.cpp's extensions (llama.cpp
``tools/server/README.md``; llama-cpp-python's ``llama_cpp/server/types.py``), accepted
because llama.cpp clients send them. Everything a client sends is hostile: every field
is checked for type and range here, before anything reaches the engine, and a mistake
becomes an :class:`ApiError`, which the server turns into an OpenAI-style error object
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field

from app.serve import tool_protocol
from app.serve.tool_protocol import ToolRequest
from engine import limits
from engine.chat_template import ChatMessage
from engine.settings import SamplingParams

MAX_BODY_BYTES = 8 * 1024 * 1024  # a request body above this gets 413
MAX_STOP = 4  # OpenAI's limit on stop sequences
ROLES = ("system", "developer", "user", "assistant", "tool")

# Fields a client may send that change nothing here, and the values at which they are
# harmless; any other value is refused rather than silently ignored.
_NEUTRAL = {
    "n": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (False,),
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
}
_IGNORED = ("model", "user", "metadata", "store", "service_tier", "stream_options")
_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # app/serve/tool_protocol.py
_MESSAGE_FIELDS = {"assistant": {"reasoning_content", "tool_calls"}, "tool": {"tool_call_id"}}


class ApiError(Exception):
    """A request the server refuses. ``status`` is the HTTP status (4xx), ``code`` the
    OpenAI error code, ``param`` the offending field (or None)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object (the ``openai`` client reads ``error.message``)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage]
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk carrying usage
    stop: list[str] = field(default_factory=list)
    model: str = ""
    tools: ToolRequest = field(default_factory=ToolRequest)


def _bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _number(body: dict, name: str, bound_name: str | None = None):
    """The field ``name`` checked against its bound in :data:`engine.limits.SAMPLING`
    (the same bound as the CLI flag), or None when absent."""
    value = body.get(name)
    if value is None:
        return None
    try:
        return limits.check_sampling(bound_name or name, value, f"'{name}'")
    except limits.LimitError as exc:
        raise _bad(str(exc), name, "invalid_type" if exc.wrong_type else "invalid_value") from None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ONE_FIELD = re.compile(r"^tools\[\d+\]\.function\.parameters$")  # a JSON schema is named as one field


def _child(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def check_text(body) -> None:
    """Refuse a lone UTF-16 surrogate (JSON's ``"\\ud800"`` without its pair decodes to one)
    anywhere in the decoded request ``body``: in any string or object key, at any depth
    (messages, tool names and schemas, ``stop``, file names ...). That is no character: no
    model can be given it and it cannot be written as UTF-8. Iterative (no recursion), one
    regex scan per string: linear in the body's size.

    Raises:
        ApiError: 400 whose ``param`` is the path of the field holding it
            (``messages[0].reasoning_content``, ``stop[1]``; a tool's ``parameters`` as a whole).
    """
    stack = [(body, "", False)]
    while stack:
        value, path, fixed = stack.pop()
        if isinstance(value, str):
            bad = _LONE_SURROGATE.search(value)
            if bad:
                raise _bad(f"{path} holds a lone UTF-16 surrogate (\\u{ord(bad.group()):04x} at character "
                           f"{bad.start()}), which is not text; send valid Unicode (a surrogate pair, or the "
                           "character itself).", path)
        elif isinstance(value, dict):
            items = []
            for key, item in value.items():
                bad = _LONE_SURROGATE.search(key)
                if bad:  # named by its parent: the message must not hold the surrogate itself
                    raise _bad(f"{path or 'The request body'} has a key holding a lone UTF-16 surrogate "
                               f"(\\u{ord(bad.group()):04x}), which is not text; send valid Unicode (a surrogate "
                               "pair, or the character itself).", path or None)
                where = path if fixed else _child(path, key)
                items.append((item, where, fixed or bool(_ONE_FIELD.match(where))))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            stack.extend(reversed([(item, path if fixed else _child(path, i), fixed) for i, item in enumerate(value)]))


def _content(value, where: str) -> str:
    """A message's content: a string, or a list of ``{"type": "text", "text": ...}`` parts and
    ``{"type": "file", "file": {"filename", "file_data"}}`` parts (the files rendered before the text)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts, files = [], []
        for i, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") == "file":  # an attached document
                files.append(_file_part(part, f"{where}.content[{i}]"))
                continue
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}.content[{i}] is a '{kind}' part; this server takes text and file parts only.",
                           f"{where}.content")
            texts.append(part["text"])
        if files:
            from engine.documents.render import render_message

            return render_message("".join(texts), files)
        return "".join(texts)
    raise _bad(f"{where}.content must be a string or a list of text and file parts.", f"{where}.content", "invalid_type")


def _file_part(part: dict, where: str):
    """A ``file`` part's rendered document (``app/serve/file_parts.py``); 400 when it cannot be."""
    from app.serve.file_parts import file_part
    from engine.documents import DocumentError

    try:
        return file_part(part, where)
    except DocumentError as exc:
        raise _bad(str(exc), f"{where}.file", "invalid_file") from None
    except ValueError as exc:
        raise _bad(f"{exc}.", f"{where}.file") from None


def parse_chat_request(body, defaults: SamplingParams | None = None) -> ChatRequest:
    """:func:`_parse_chat_request`, a tool field's mistake (``app.serve.tool_protocol``) as
    the 400 it is.

    Raises:
        ApiError: 400 naming the field at fault (unknown fields included).
    """
    try:
        return _parse_chat_request(body, defaults)
    except tool_protocol.ToolFieldError as exc:
        raise _bad(exc.message, exc.param, exc.code) from None


def _parse_chat_request(body, defaults: SamplingParams | None) -> ChatRequest:
    """Validate a decoded JSON body. Fields the client leaves out take ``defaults``
    (Branchwise's own sampling defaults, the same as ``branchwise chat``).

    Raises:
        ApiError: 400 naming the field at fault (unknown fields included).
    """
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", None, "invalid_type")
    check_text(body)  # the one place every string of the request is checked for lone surrogates
    known = {"messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
             "stream", "top_k", "min_p", "repeat_penalty", *_NEUTRAL, *_IGNORED, *_TOOL_FIELDS}
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise _bad(f"Unrecognized request argument supplied: {', '.join(unknown)}.", unknown[0],
                   "unknown_parameter")
    for name, allowed in _NEUTRAL.items():
        if name in body and body[name] is not None and body[name] not in allowed:
            raise _bad(f"'{name}' = {body[name]!r} is not supported by this server.", name, "unsupported_value")

    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list of {role, content} objects.", "messages",
                   "invalid_type" if raw is not None else "missing_required_parameter")
    messages = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object with 'role' and 'content'.", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}.", f"{where}.role")
        extra = sorted(set(m) - {"role", "content", "name"} - _MESSAGE_FIELDS.get(role, set()))
        if extra:
            raise _bad(f"{where} has fields this server does not take: {', '.join(extra)}.", f"{where}.{extra[0]}",
                       "unknown_parameter")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise _bad(f"{where}.name must be a string.", f"{where}.name", "invalid_type")
        thought = m.get("reasoning_content")  # an earlier reply's thinking (DeepSeek's and llama-server's field)
        if thought is not None and not isinstance(thought, str):
            raise _bad(f"{where}.reasoning_content must be a string.", f"{where}.reasoning_content", "invalid_type")
        if role == "tool":
            messages.append(tool_protocol.tool_message(m, where, _content(m.get("content"), where)))
            continue
        calls = tool_protocol.assistant_calls(m, where) if role == "assistant" else None
        messages.append(ChatMessage("system" if role == "developer" else role, _content(m.get("content"), where),
                                    reasoning=thought, tool_calls=calls))
    if messages[-1].role == "assistant":
        raise _bad("The last message is the assistant's; end with a user message to get a reply.", "messages")

    defaults = defaults or SamplingParams()
    s = defaults.to_dict()
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "top_k", "seed"):
        value = _number(body, name)
        if value is not None:
            s[name] = value
    if s.get("seed") is not None:
        s["seed"] = int(s["seed"]) & 0x7FFFFFFF  # llama.cpp takes a 32-bit seed
    max_tokens = _number(body, "max_completion_tokens", "max_tokens")
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens")
    if max_tokens is not None:
        s["max_tokens"] = max_tokens

    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop) or len(stop) > MAX_STOP:
        raise _bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them.", "stop")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false.", "stream", "invalid_type")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.", "stream_options", "invalid_type")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise _bad("'model' must be a string.", "model", "invalid_type")
    return ChatRequest(messages, SamplingParams.from_dict(s), stream, bool(options.get("include_usage")), stop, model,
                       tool_protocol.parse_tools(body))


class StopScanner:
    """Cuts a streamed reply at the first stop sequence, holding back only the text that
    could still be the start of one (so nothing past a stop is ever sent)."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.text = ""  # everything received
        self.sent = 0  # characters released
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Text that is safe to send now ("" once a stop sequence was seen)."""
        if self.stopped:
            return ""
        self.text += delta
        if not self.stops:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        hits = [i for i in (self.text.find(s, max(0, self.sent - len(s))) for s in self.stops) if i >= 0]
        if hits:
            cut = min(hits)
            self.stopped = True
            self.text = self.text[:cut]
            out, self.sent = self.text[self.sent :], cut
            return out
        hold = 0
        for s in self.stops:  # the longest tail of the text that begins some stop sequence
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        safe = max(len(self.text) - hold, self.sent)
        out, self.sent = self.text[self.sent : safe], safe
        return out

    def flush(self) -> str:
        """The held-back tail at the end of the reply (it was not a stop after all)."""
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}
TOOL_CALLS = "tool_calls"  # the finish reason of a reply that is tool calls


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def usage(stats) -> dict:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` is the number of
    prompt tokens restored (from the prefix store or the live context), not prefilled."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.restored_tokens},
    }


def timings(stats) -> dict:
    """llama.cpp server's ``timings`` object (tools/server/server.cpp), for clients that read it."""
    return {
        "cache_n": stats.restored_tokens,
        "prompt_n": stats.prefilled_tokens,
        "prompt_ms": round(stats.restore_ms + stats.prefill_ms, 2),
        "predicted_n": stats.generated_tokens,
        "predicted_per_second": round(stats.decode_tokens_per_s, 2),
    }


def completion(cid: str, model: str, text: str, finish: str, stats, reasoning: str | None = None,
               tool_calls: list[dict] | None = None) -> dict:
    """A whole chat completion; ``reasoning`` (a reasoning model's thinking) goes in the
    message's ``reasoning_content``, as llama-server, vLLM and DeepSeek's API send it;
    ``tool_calls`` (OpenAI's objects) in ``tool_calls``, with ``content`` null when empty."""
    message = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = text or None
    return {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish,
                     "logprobs": None}],
        "usage": usage(stats), "timings": timings(stats),
    }


def chunk(cid: str, model: str, created: int, delta: dict, finish: str | None = None) -> dict:
    return {
        "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
