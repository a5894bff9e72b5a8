"""The Jinja sandbox a chat template renders in: bounded in time and size.

A chat template is data from a downloaded file, so rendering is bounded (:class:`RenderGuard`):
``range()`` yields at most :data:`MAX_RANGE` items, ``*``, ``+``, ``%``, ``**`` and ``~``
refuse results over :data:`MAX_OUTPUT_CHARS` (integers over :data:`MAX_INT_BITS` bits),
filters refuse integer arguments over :data:`MAX_RANGE` and results over the size cap, the
output stops at :data:`MAX_OUTPUT_CHARS`, and a time budget (:data:`RENDER_TIME_LIMIT_S`)
is checked at every call, attribute and item access made by the template and, through a
line tracer limited to the template's own compiled code, on every line it runs (so an
empty nested loop is bounded too). A breach raises :class:`TemplateLimitError`.

The prompt formats that use it are in :mod:`engine.chat_template`.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from datetime import datetime

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.runtime import str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import ModelLoadError, TemplateError

RENDER_TIME_LIMIT_S = 2.0  # real templates render a long chat in milliseconds
MAX_OUTPUT_CHARS = 8 * 1024 * 1024  # far above any context window's worth of text (~4 chars/token)
MAX_RANGE = 100_000  # jinja2.sandbox.MAX_RANGE: items one range() call may yield
MAX_INT_BITS = 65_536  # `a * b` and `a ** b` on integers: bigger results are refused (time, memory)
_ADVICE = "The template in the model file is broken or hostile: use another model file."


class TemplateLimitError(TemplateError):
    """Rendering the chat template ran past a time or size limit (the template is hostile
    or broken). ``str()`` names the limit."""


class TemplateLoadError(ModelLoadError, TemplateError):
    """The model's chat template cannot be used at all (a syntax error, or it cannot render
    a single user message within the limits): the model does not load."""


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


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """``tojson`` as Hugging Face ``transformers`` defines it for chat templates (plain
    ``json.dumps``, keys in their order, no HTML escaping): jinja2's own sorts keys and
    returns markup, so ``'"a": ' + x|tojson`` would come out HTML-escaped (a tool schema
    in Mistral's and gpt-oss's templates)."""
    if indent is not None and (not isinstance(indent, int) or abs(indent) > 64):
        indent = 4
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


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
    env.filters["tojson"] = _guard_filter(_tojson)
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
