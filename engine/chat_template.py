"""Turn a conversation into prompt token ids with the model's own chat template.

Three promises, because the prefix store matches prompts by token ids, not by text:

* **Prefix stability.** The prompt of turn k is a token-prefix of the prompt of turn k+1,
  so the KV computed for turn k is reused. The template is rendered once with a
  sentinel in place of every message's content; the text between assistant messages is
  tokenized in one piece, and an assistant message that was generated contributes the
  exact token ids that were generated, never a re-tokenization of its text.
* **User text is text.** Content is tokenized with special-token parsing only if that
  yields the same ids as parsing it as plain text; otherwise it is tokenized on its own
  as plain text, so typing ``<|im_start|>`` can never produce a control token.
* **The GGUF's template.** ``tokenizer.chat_template`` is rendered in a sandboxed Jinja
  environment (as llama-cpp-python's ``Jinja2ChatFormatter`` does); models without one
  get ChatML.

The template is data from a downloaded file, so rendering is bounded (:class:`RenderGuard`):
``range()`` yields at most :data:`MAX_RANGE` items, ``*``, ``+``, ``%``, ``**`` and ``~``
refuse results over :data:`MAX_OUTPUT_CHARS` (integers over :data:`MAX_INT_BITS` bits),
filters refuse integer arguments over :data:`MAX_RANGE` and results over the size cap, the
output stops at :data:`MAX_OUTPUT_CHARS`, and a time budget (:data:`RENDER_TIME_LIMIT_S`)
is checked at every call, attribute and item access made by the template and, through a
line tracer limited to the template's own compiled code, on every line it runs (so an
empty nested loop is bounded too). A breach raises :class:`TemplateLimitError`.

A model whose template is missing, blank, or leaves out the user's message gets ChatML
with a reason in :attr:`PromptBuilder.note`; since ChatML's markers are plain text to such
a model's tokenizer, :meth:`PromptBuilder.stop_matcher` then stops the reply at the first
marker, before it is shown or saved.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.runtime import str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import ModelLoadError, TemplateError

RENDER_TIME_LIMIT_S = 2.0  # real templates render a long chat in milliseconds
MAX_OUTPUT_CHARS = 8 * 1024 * 1024  # far above any context window's worth of text (~4 chars/token)
MAX_RANGE = 100_000  # jinja2.sandbox.MAX_RANGE: items one range() call may yield
MAX_INT_BITS = 65_536  # `a * b` and `a ** b` on integers: bigger results are refused (time, memory)
CHATML_STOP_STRINGS = ("<|im_end|>", "<|im_start|>")
_ADVICE = "The template in the model file is broken or hostile: use another model file."


class TemplateLimitError(TemplateError):
    """Rendering the chat template ran past a time or size limit (the template is hostile
    or broken). ``str()`` names the limit."""


class TemplateLoadError(ModelLoadError, TemplateError):
    """The model's chat template cannot be used at all (a syntax error, or it cannot render
    a single user message within the limits): the model does not load."""


class PromptFormat(StrEnum):
    """Where the prompt format comes from (shown in model info and ``--json``)."""

    MODEL_TEMPLATE = "model template"  # the GGUF's tokenizer.chat_template
    CHATML_FALLBACK = "ChatML fallback"  # no usable template: ChatML with stop strings

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SENTINEL = "\ue000bw{}\ue001"  # private-use code points: never in a template's own text
_SENTINEL_RE = re.compile("\ue000b([wr])(\\d+)\ue001")  # w: a message's content, r: its reasoning
_REASONING_SENTINEL = "\ue000br{}\ue001"
REASONING_FIELDS = ("reasoning_content", "thinking")
"""Keys an earlier assistant turn's reasoning is passed in: Qwen3-style templates (and
DeepSeek's API) read ``reasoning_content``, gpt-oss's reads ``thinking``. A template that
reads neither never sees the reasoning."""


def _message_dict(m: ChatMessage, content: str, reasoning: str | None = None) -> dict:
    """A message as the template sees it: the reasoning of an assistant reply in the
    keys of :data:`REASONING_FIELDS` (only when it has one)."""
    d = {"role": m.role, "content": content}
    if m.role == "assistant" and m.reasoning is not None:
        for key in REASONING_FIELDS:
            d[key] = m.reasoning if reasoning is None else reasoning
    return d


@dataclass(frozen=True)
class ChatMessage:
    """One message of the prompt. ``token_ids`` are the generated ids of an assistant reply;
    ``reasoning`` its thinking when a reasoning model wrote one (None: none), ``content``
    then being the answer alone (see :meth:`PromptBuilder.build`)."""

    role: str
    content: str
    token_ids: Sequence[int] | None = None
    reasoning: str | None = None

    def to_dict(self) -> dict:
        """The form the engine process receives (``engine.worker``)."""
        ids = [int(t) for t in self.token_ids] if self.token_ids is not None else None
        return {"role": self.role, "content": self.content, "token_ids": ids, "reasoning": self.reasoning}


def conversation_messages(system_prompt: str, path) -> list[ChatMessage]:
    """The engine's view of a conversation path (records with role, content, token_ids,
    such as ``storage.chats.Message``): the system prompt first when it is not blank, then
    the user and assistant messages, assistant ones with the ids that were generated."""
    out = [ChatMessage("system", system_prompt)] if system_prompt.strip() else []
    out += [ChatMessage(m.role, m.content, m.token_ids if m.role == "assistant" else None,
                        getattr(m, "reasoning", None) if m.role == "assistant" else None)
            for m in path if m.role in ("user", "assistant")]
    return out


Tokenize = Callable[[str, bool], list[int]]  # (text, parse_special) -> ids, no BOS


# -- bounded rendering -------------------------------------------------------------------


class RenderGuard:
    """The time budget of one render, checked from inside it. ``check()`` raises
    :class:`TemplateLimitError` once ``limit_s`` seconds have passed since ``start()``."""

    __slots__ = ("deadline", "limit_s", "_n")

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.deadline = time.monotonic() + limit_s
        self._n = 0

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(
                f"The model's chat template took more than {self.limit_s:g} s to render and was "
                "stopped. The template in the model file is broken or hostile: use another model file.")

    def tick(self) -> None:
        """``check()`` every 64th call (the line tracer calls this on every template line)."""
        self._n += 1
        if not self._n & 63:
            self.check()


_active = threading.local()  # .guard: the RenderGuard of the render running on this thread

_TEMPLATE_FILENAME = "<chat template>"


def _guard() -> RenderGuard | None:
    return getattr(_active, "guard", None)


def _too_big(n: int, what: str) -> TemplateLimitError:
    return TemplateLimitError(
        f"The model's chat template tried to build {what} of {n:,} characters (the limit is "
        f"{MAX_OUTPUT_CHARS:,}) and was stopped. The template in the model file is broken or "
        "hostile: use another model file.")


def _check_size(value, what: str = "a value"):
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > MAX_OUTPUT_CHARS:
        raise _too_big(len(value), what)
    return value


def _bounded_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateLimitError(
            f"The model's chat template asked for range() of {len(rng):,} items (the limit is "
            f"{MAX_RANGE:,}) and was stopped. " + _ADVICE)
    return rng


_FORMAT_NUMBER = re.compile(r"\d{6,}")  # a width or precision of 100,000 or more in a format spec


def _check_args(name: str, args, kwargs) -> None:
    """Refuse the arguments that make a string function build a huge result: an integer
    over MAX_RANGE (a width, a count, a precision), a format string with such a number
    in it, or a replacement that would multiply a string past the size cap."""
    values = (*args, *kwargs.values())
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_RANGE:
            raise TemplateLimitError(
                f"The model's chat template passed {v:,} to '{name}' (the limit is {MAX_RANGE:,}) "
                "and was stopped. " + _ADVICE)
    if name in ("format", "format_map", "%"):
        for v in values:
            if isinstance(v, str) and any(int(m) > MAX_RANGE for m in _FORMAT_NUMBER.findall(v)):
                raise TemplateLimitError(
                    f"The model's chat template used a format width over {MAX_RANGE:,} and was "
                    "stopped. " + _ADVICE)
    if name == "replace":
        strs = [v for v in values if isinstance(v, str)]
        if len(strs) >= 3:
            text, old, new = strs[-3:]
            count = text.count(old) if old else len(text) + 1
            if len(text) + count * len(new) > MAX_OUTPUT_CHARS:
                raise _too_big(len(text) + count * len(new), "a replaced string")


def _guard_filter(func):
    """Wrap a Jinja filter: arguments are checked by :func:`_check_args` before the call,
    the result against MAX_OUTPUT_CHARS after it."""
    name = func.__name__.removeprefix("do_")

    @functools.wraps(func)  # keeps jinja_pass_arg (pass_context & co.)
    def wrapper(*args, **kwargs):
        _check_args(name, args, kwargs)
        g = _guard()
        if g is not None:
            g.check()
        return _check_size(func(*args, **kwargs), f"a '{name}' result")

    return wrapper


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b`` (string concatenation) to a size-checked join."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox (no attribute of Python internals, no mutation of lists
    and dicts) plus the limits in the module docstring. Render only through
    :func:`render_bounded`, which installs the time budget."""

    intercepted_binops = frozenset(["*", "+", "%", "**"])
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.globals["range"] = _bounded_range
        self.filters = {name: _guard_filter(f) for name, f in self.filters.items()}

    def call_binop(self, context, operator, left, right):
        if operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
            bits = (left.bit_length() * abs(right) if operator == "**"
                    else left.bit_length() + right.bit_length())
            if bits > MAX_INT_BITS:
                raise TemplateLimitError(
                    f"The model's chat template computed a number of about {bits:,} bits (the limit "
                    f"is {MAX_INT_BITS:,}) and was stopped. " + _ADVICE)
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_OUTPUT_CHARS:
                raise _too_big(len(seq) * n, "a repeated sequence")
        if operator == "%" and isinstance(left, str):
            _check_args("%", (left, *(right if isinstance(right, tuple) else (right,))), {})
        if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if len(left) + len(right) > MAX_OUTPUT_CHARS:
                raise _too_big(len(left) + len(right), "a string")
        g = _guard()
        if g is not None:
            g.check()
        return _check_size(super().call_binop(context, operator, left, right), "a string")

    def bounded_concat(self, parts) -> str:
        total = 0
        for p in parts:
            total += len(p) if isinstance(p, str) else 0
        if total > MAX_OUTPUT_CHARS:
            raise _too_big(total, "a string")
        return _check_size(str_join(parts), "a string")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's signature
        g = _guard()
        if g is not None:
            g.check()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        if isinstance(getattr(method, "__self__", None), (str, bytes, list, tuple, dict)):
            _check_args(getattr(method, "__name__", "?"), (method.__self__, *args), kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a string")

    def getattr(self, obj, attribute):
        g = _guard()
        if g is not None:
            g.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        g = _guard()
        if g is not None:
            g.tick()
        return super().getitem(obj, argument)


def _line_tracer(guard: RenderGuard):
    """A ``sys.settrace`` function that traces only the template's compiled code (its
    frames carry :data:`_TEMPLATE_FILENAME`) and checks the budget on its lines."""

    def local(frame, event, arg):
        guard.tick()
        return local

    def global_(frame, event, arg):
        if frame.f_code.co_filename == _TEMPLATE_FILENAME:
            guard.tick()
            return local
        return None

    return global_


def render_bounded(template: jinja2.Template, limit_s: float = RENDER_TIME_LIMIT_S, **context) -> str:
    """Render ``template`` (compiled by a :class:`BoundedSandbox`) within ``limit_s``
    seconds and :data:`MAX_OUTPUT_CHARS` characters of output.

    Raises:
        TemplateLimitError: a limit was reached (the render is abandoned).
        Anything the template raises (the caller turns it into :class:`TemplateError`).
    """
    guard = RenderGuard(limit_s)
    outer = getattr(_active, "guard", None)
    _active.guard = guard
    previous = sys.gettrace()
    sys.settrace(_line_tracer(guard))
    try:
        out: list[str] = []
        size = 0
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _too_big(size, "a prompt")
            out.append(chunk)
        return "".join(out)
    except RecursionError as exc:
        raise TemplateLimitError(
            "The model's chat template recursed too deeply and was stopped. " + _ADVICE
        ) from exc
    finally:
        sys.settrace(previous)
        _active.guard = outer


def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in a :class:`BoundedSandbox`.

    Raises:
        TemplateLoadError: a syntax error (the message gives its line), or constant
            folding at compile time ran into a limit.
    """
    env = BoundedSandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str):
        raise TemplateError(f"The model's chat template refused these messages: {message}")

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:100])
    try:
        code = env.compile(source, filename=_TEMPLATE_FILENAME)
        return env.template_class.from_code(env, code, env.make_globals(None))
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateLoadError(
            f"The model's chat template has a syntax error (line {exc.lineno}: {exc.message}), so the "
            "model cannot be used for chat. Use another model file.") from exc
    except TemplateLimitError as exc:
        raise TemplateLoadError(str(exc)) from exc
    except (jinja2.TemplateError, ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        raise TemplateLoadError(f"The model's chat template cannot be compiled ({exc}). Use another model file.") from exc


def template_from_metadata(metadata: dict, read_raw: Callable[[str], bytes | None]) -> tuple[str | None, str]:
    """``(template text or None, why it is None)`` from a model's GGUF metadata.

    llama-cpp-python (``Llama.__init__``, ``_internals.LlamaModel.metadata``) decodes every
    metadata string as UTF-8 and, if one fails, replaces the whole metadata with ``{}``.
    Then the template is read again on its own with ``read_raw(key)`` (the raw bytes,
    e.g. through ``llama_model_meta_val_str``); if that is not UTF-8 either, the reason
    says so, so the ChatML fallback is stated rather than silent.
    """
    key = "tokenizer.chat_template"
    text = metadata.get(key)
    if text is not None or metadata:
        return text, ""
    raw = read_raw(key)
    if raw is None:
        return None, ("The model file has no chat template (and some of its metadata is not valid UTF-8 "
                      "text, so llama-cpp-python could not read any of it)")
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, "The model's chat template is not valid UTF-8 text, so it cannot be used"


class _InertChatFormatter:
    """Stands in for llama-cpp-python's ``Jinja2ChatFormatter`` while a model loads."""

    def __init__(self, *args, **kwargs):
        pass

    def to_chat_handler(self):
        def handler(*args, **kwargs):
            raise TemplateError("Branchwise renders chat templates itself (engine.chat_template).")

        return handler


def disable_library_chat_templates() -> None:
    """Keep llama-cpp-python from compiling the GGUF's chat templates, for this process.

    ``Llama.__init__`` (llama_cpp/llama.py) compiles every ``tokenizer.chat_template*``
    string of the GGUF with ``llama_chat_format.Jinja2ChatFormatter``, in a sandbox with no
    limits; jinja2 folds constant expressions at compile time, so a template holding
    ``{{ 3 ** 10000000000 }}`` or ``{{ 'x' * 10**10 }}`` would hang the load or exhaust
    memory before Branchwise sees it, and a syntax error would escape as a raw
    ``TemplateSyntaxError``. Branchwise never uses llama-cpp-python's chat handlers
    (prompts are built by :class:`PromptBuilder`, bounded), so an inert stand-in replaces
    the formatter: ``Llama.create_chat_completion`` is unusable in a process that calls
    this (``engine.model`` does, at import). Calling it again is harmless."""
    from llama_cpp import llama_chat_format  # noqa: PLC0415 - only the engine process needs it

    llama_chat_format.Jinja2ChatFormatter = _InertChatFormatter


# -- stop strings ------------------------------------------------------------------------


class StopMatcher:
    """Ends a streamed reply at the first stop string, before any of it is shown.

    Feed each token's text delta to :meth:`feed`; it returns the text that is safe to
    show now, holding back a tail that could be the start of a stop string. Once
    :attr:`hit` is True the reply ends; :attr:`text` is everything before the stop string
    and :meth:`cut_ids` the token ids that spell exactly that. At the end of a reply
    without a hit, :meth:`flush` releases the held-back tail.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._raw = ""
        self._shown = 0
        self._ends: list[int] = []  # len(raw text) after each token
        self.hit = False
        self.stop_at: int | None = None

    def feed(self, delta: str) -> str:
        self._raw += delta
        self._ends.append(len(self._raw))
        if self.hit:
            return ""
        raw = self._raw
        search_from = max(self._shown - max(map(len, self.stops)), 0)
        found = [i for i in (raw.find(s, search_from) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self.stop_at = min(found)
            out = raw[self._shown : self.stop_at]
            self._shown = self.stop_at
            return out
        hold = 0  # the longest tail of raw that is a proper prefix of a stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(raw)), hold, -1):
                if raw.endswith(s[:k]):
                    hold = k
                    break
        safe = max(len(raw) - hold, self._shown)
        out = raw[self._shown : safe]
        self._shown = safe
        return out

    def flush(self) -> str:
        """The held-back tail (at the end of a reply that met no stop string)."""
        if self.hit:
            return ""
        out = self._raw[self._shown :]
        self._shown = len(self._raw)
        return out

    @property
    def text(self) -> str:
        return self._raw[: self._shown]

    def cut_ids(self, ids: Sequence[int], tokenize: Tokenize) -> tuple[list[int], int]:
        """``(ids, n_evaluated_kept)`` after a hit: the whole tokens that end before the
        stop string, plus the plain-text tokens of the part of a token cut through, so the
        ids spell :attr:`text` exactly. ``n_evaluated_kept`` is the count of original ids kept."""
        assert self.stop_at is not None
        n = bisect.bisect_right(self._ends, self.stop_at)
        start = self._ends[n - 1] if n else 0
        rest = self._raw[start : self.stop_at]
        return list(ids[:n]) + (tokenize(rest, False) if rest else []), n


# -- prompts ----------------------------------------------------------------------------


TOKEN_CACHE_CHARS = 4_000_000
"""Most characters of text whose token ids :class:`TokenCache` keeps (a few MB of ids)."""


class TokenCache:
    """``tokenize`` that keeps the ids of recent long texts.

    A prompt is built again for every request, context count, tree figure and keystroke
    prewarm, and all of it but the newest message is the same text as the time before:
    :meth:`PromptBuilder.build` tokenizes it in segments (template text and plain message
    content up to each assistant reply), so every segment but the last is a hit. Texts
    under 256 characters are not kept (tokenizing them costs about what a lookup does);
    the rest are kept least-recently-used first up to :data:`TOKEN_CACHE_CHARS`.
    Thread-safe; the ids are those ``tokenize`` returned, so a hit changes nothing.
    """

    def __init__(self, tokenize: Tokenize, max_chars: int = TOKEN_CACHE_CHARS):
        self._tokenize = tokenize
        self._max_chars = max_chars
        self._entries: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __call__(self, text: str, parse_special: bool) -> list[int]:
        if len(text) < 256 or len(text) > self._max_chars:
            return self._tokenize(text, parse_special)
        key = (text, parse_special)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return list(hit)
        ids = self._tokenize(text, parse_special)
        with self._lock:
            self.misses += 1
            if key not in self._entries:
                self._entries[key] = tuple(ids)
                self._chars += len(text)
                while self._chars > self._max_chars:
                    (old, _), _ids = self._entries.popitem(last=False)
                    self._chars -= len(old)
        return ids


class PromptBuilder:
    """Builds prompt token ids for a list of :class:`ChatMessage`.

    Args:
        template: Jinja chat template text (None or blank for ChatML).
        tokenize: ``tokenize(text, parse_special) -> ids`` without BOS.
        bos_token / eos_token: the texts the template may reference.
        bos_id: prepended when ``add_bos`` and the rendered text does not begin with BOS.
        missing_reason: why ``template`` is None, when it is known (shown in :attr:`note`).

    Attributes:
        format: a :class:`PromptFormat`.
        note: "" with the model's own template, else a sentence saying which format is
            used instead and why (for model info, the status bar and ``--json``).
        stop_strings: texts that end a reply (ChatML's markers with the fallback).

    Raises:
        TemplateLoadError: the template has a syntax error, or cannot render one user
            message within the limits.
    """

    def __init__(
        self,
        template: str | None,
        tokenize: Tokenize,
        *,
        bos_token: str = "",
        eos_token: str = "",
        bos_id: int | None = None,
        add_bos: bool = False,
        missing_reason: str = "",
    ):
        self._tokenize = TokenCache(tokenize)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id, self.add_bos = bos_id, add_bos
        self.format = PromptFormat.MODEL_TEMPLATE
        self.note = ""
        self.stop_strings: tuple[str, ...] = ()
        if template is None or not template.strip():
            why = missing_reason or ("The model file has no chat template" if template is None
                                     else "The model's chat template is blank")
            self._use_chatml(why)
            return
        self._template = compile_template(template)
        probe = "Hello \u2013 what is 2+2?"
        try:
            text = self._render([{"role": "user", "content": probe}], True)
        except TemplateLimitError as exc:
            raise TemplateLoadError(str(exc)) from exc
        except TemplateError:
            return  # refuses a lone user message (some templates want a system one): judged per request
        if probe not in text:
            self._use_chatml("The model's chat template leaves out the user's message")

    def _use_chatml(self, why: str) -> None:
        self._template = compile_template(CHATML_TEMPLATE)
        self.format = PromptFormat.CHATML_FALLBACK
        self.stop_strings = CHATML_STOP_STRINGS
        self.note = (f"{why}, so Branchwise uses the ChatML prompt format and ends each reply at "
                     "ChatML's <|im_end|> marker. Replies may be poor: this may be a base model, "
                     "not one tuned for chat.")

    def stop_matcher(self) -> StopMatcher | None:
        """A fresh :class:`StopMatcher` for one reply, or None when the model's own
        template ends its turns (with an end-of-generation token)."""
        return StopMatcher(self.stop_strings) if self.stop_strings else None

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The template's text for ``messages`` (for display and debugging)."""
        return self._render([_message_dict(m, m.content) for m in messages], add_generation_prompt)

    def _render(self, msgs: list[dict], add_generation_prompt: bool) -> str:
        try:
            return render_bounded(
                self._template,
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja2 errors and template-side type errors
            raise TemplateError(f"The model's chat template failed: {exc}") from exc

    def build(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids for ``messages``, ending with the assistant's turn header.

        An assistant reply with ``reasoning`` (not None) goes to the template with the
        answer as ``content`` and the reasoning in :data:`REASONING_FIELDS`; whatever the
        template keeps of the two is tokenized as text (the reply's generated ids hold
        the thinking, which most templates drop from earlier turns)."""
        placeholders = [_message_dict(m, _SENTINEL.format(i), _REASONING_SENTINEL.format(i))
                        for i, m in enumerate(messages)]
        text = self._render(placeholders, add_generation_prompt)
        found = [int(i) for kind, i in _SENTINEL_RE.findall(text) if kind == "w"]
        if found != list(range(len(messages))):
            # The template transforms or reorders content; render it for real. Prefix
            # stability may suffer, correctness does not.
            return self._with_bos(self._fallback(messages, add_generation_prompt))

        ids: list[int] = []
        pending: list[str] = []

        def flush():
            if pending:
                ids.extend(self._tokenize("".join(pending), True))
                pending.clear()

        pos = 0
        for match in _SENTINEL_RE.finditer(text):
            pending.append(text[pos : match.start()])
            pos = match.end()
            m = messages[int(match.group(2))]
            content = m.content if match.group(1) == "w" else (m.reasoning or "")
            if m.role == "assistant" and m.token_ids is not None and m.reasoning is None:
                flush()
                ids.extend(int(t) for t in m.token_ids)
            elif self._is_plain(content):
                pending.append(content)
            else:
                flush()
                ids.extend(self._tokenize(content, False))
        pending.append(text[pos:])
        flush()
        return self._with_bos(ids)

    def _is_plain(self, content: str) -> bool:
        """True when parsing special tokens in ``content`` changes nothing."""
        return "<" not in content and "[" not in content or (
            self._tokenize(content, True) == self._tokenize(content, False)
        )

    def _fallback(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> list[int]:
        if not all(self._is_plain(m.content) and self._is_plain(m.reasoning or "") for m in messages):
            raise TemplateError(
                "This model's chat template cannot safely include text that looks like "
                "control tokens. Remove them from the message."
            )
        msgs = [_message_dict(m, m.content) for m in messages]
        return self._tokenize(self._render(msgs, add_generation_prompt), True)

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            return [self.bos_id, *ids]
        return ids
