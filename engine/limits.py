"""The bounds of every number a person or a client can give Branchwise, checked before
anything is allocated. ``branchwise chat``/``regenerate``/``serve`` (their flags,
app/cli/arguments.py) and the API server (request fields, app/serve/protocol.py) both use
these, so a value one accepts the other accepts too.

Each check returns the value or raises :class:`LimitError`, whose ``reason`` is the
words after the name ("must be between 0 and 1; got 5"): each front end puts the name
in its own form (``--top-p`` on the command line, ``'top_p'`` in the API).

No llama.cpp here: the context check takes the model's shape as read from the GGUF
header (engine/gguf_meta.py), so a context too large for the model or for this
machine's memory is refused before llama.cpp allocates its KV cache.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

INT64_MAX = (1 << 63) - 1
"""SQLite's INTEGER is a signed 64-bit number: the largest id a row can have."""
MIN_CTX = 256
MAX_CTX = 1 << 24
"""16,777,216 tokens: above every model's trained context (10M for Llama 4 Scout);
refused before the model is even opened."""
CTX_TRAIN_FACTOR = 4
"""A context may exceed the model's trained length (RoPE scaling, as llama.cpp allows
with a warning) by at most this factor; past the trained length replies degrade."""
THREADS_PER_CORE = 4
"""``--threads`` may be at most the logical core count times this."""
MAX_BUDGET_BYTES = 1 << 60
"""1 EiB: the largest prefix-store budget (SQLite and file sizes are 64-bit)."""
MAX_TOKENS = 1 << 20
MAX_PORT = 65535
MAX_QUEUE = 4096


class LimitError(ValueError):
    """A number outside its bound. ``reason`` is the sentence without the name:
    ``str(err)`` is the full sentence, with the name the check was given; ``wrong_type``
    is True when the value is not a number at all."""

    def __init__(self, name: str, reason: str, wrong_type: bool = False):
        self.name, self.reason, self.wrong_type = name, reason, wrong_type
        super().__init__(f"{name} {reason}.")


@dataclass(frozen=True)
class Bound:
    """``lo <= value <= hi`` (``lo < value`` with ``lo_open``); ``integer``: whole numbers only."""

    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False

    def words(self) -> str:
        if self.lo_open:
            return f"must be more than {self.lo:g} and at most {self.hi:g}"
        if self.integer and self.lo == 1:
            return f"must be at least 1 and at most {_num(self.hi)}"
        return f"must be between {_num(self.lo)} and {_num(self.hi)}"


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) and abs(x) >= 10_000 else f"{x:g}" if isinstance(x, float) else str(x)


SAMPLING: dict[str, Bound] = {
    "temperature": Bound(0, 2),
    "top_p": Bound(0, 1),
    "min_p": Bound(0, 1),
    "repeat_penalty": Bound(0, 10, lo_open=True),  # llama.cpp divides positive logits by it
    "top_k": Bound(0, 1 << 20, integer=True),
    "seed": Bound(-(1 << 63), (1 << 64) - 1, integer=True),  # then cut to llama.cpp's 32 bits
    "max_tokens": Bound(1, MAX_TOKENS, integer=True),
}
"""The sampling fields: the same bounds for ``chat --top-p`` and a request's ``top_p``
(OpenAI's ranges for temperature and top_p)."""


def check(name: str, value, bound: Bound, label: str | None = None):
    """``value`` when it is a number (not a bool) within ``bound``.

    Args:
        name: the field, used in the message as ``label`` (default ``name``).

    Raises:
        LimitError: a wrong type, NaN, an infinity, or out of range.
    """
    label = label or name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (bound.integer and not isinstance(value, int)):
        kind = "a whole number" if bound.integer else "a number"
        raise LimitError(label, f"must be {kind}, not {type(value).__name__}", wrong_type=True)
    if isinstance(value, float) and not math.isfinite(value):
        raise LimitError(label, f"must be a finite number; got {value}")
    low_ok = value > bound.lo if bound.lo_open else value >= bound.lo
    if not (low_ok and value <= bound.hi):
        raise LimitError(label, f"{bound.words()}; got {_num(value)}")
    return value


def check_sampling(name: str, value, label: str | None = None):
    """A sampling field (a key of :data:`SAMPLING`) checked against its bound.

    Raises:
        LimitError: see :func:`check`.
    """
    return check(name, value, SAMPLING[name], label)


def check_id(value: int, label: str = "the id") -> int:
    """A conversation or message id: 1 to :data:`INT64_MAX` (SQLite's range).

    Raises:
        LimitError: out of that range.
    """
    return check(label, value, Bound(1, INT64_MAX, integer=True), label)


def max_threads() -> int:
    """The largest thread count accepted: logical cores x :data:`THREADS_PER_CORE`."""
    return (os.cpu_count() or 1) * THREADS_PER_CORE


def check_threads(value: int, label: str = "the thread count") -> int:
    """0 (automatic) or 1 to :func:`max_threads`.

    Raises:
        LimitError: out of that range (llama.cpp crashes on 100,000 threads).
    """
    cap = max_threads()
    if isinstance(value, int) and not isinstance(value, bool) and value > cap:
        raise LimitError(label, f"must be at most {cap} on this machine ({os.cpu_count() or 1} CPU cores x "
                                f"{THREADS_PER_CORE}); got {_num(value)}")
    return check(label, value, Bound(0, cap, integer=True), label)


def check_budget(value: int, label: str = "the cache budget") -> int:
    """A prefix-store budget in bytes: 1 to :data:`MAX_BUDGET_BYTES`.

    Raises:
        LimitError: out of that range.
    """
    return check(label, value, Bound(1, MAX_BUDGET_BYTES, integer=True), label)


def check_ctx_size(value: int, label: str = "the context size") -> int:
    """The model-independent bound of a context size: :data:`MIN_CTX` to :data:`MAX_CTX`.

    Raises:
        LimitError: out of that range.
    """
    return check(label, value, Bound(MIN_CTX, MAX_CTX, integer=True), label)


def context_problem(n_ctx: int, trained: int, kv_bytes_per_token: int, available_bytes: int,
                    model_name: str) -> str:
    """Why a context of ``n_ctx`` tokens cannot be used with this model on this machine,
    or "" when it can.

    Args:
        trained: the model's trained context (tokens; 0 when the file does not say).
        kv_bytes_per_token: KV cache bytes one token takes (0 when unknown).
        available_bytes: memory available now (0 when unknown).
    """
    if trained > 0 and n_ctx > trained * CTX_TRAIN_FACTOR:
        return (f"A context of {n_ctx:,} tokens is too large for {model_name}: it was trained for {trained:,} "
                f"tokens, and Branchwise takes at most {CTX_TRAIN_FACTOR} times that "
                f"({trained * CTX_TRAIN_FACTOR:,}). Choose a smaller context size (--ctx-size).")
    need = n_ctx * kv_bytes_per_token
    if kv_bytes_per_token > 0 and available_bytes > 0 and need > available_bytes:
        fits = available_bytes // kv_bytes_per_token // 1024 * 1024
        return (f"A context of {n_ctx:,} tokens needs {need / 2**30:,.1f} GiB of memory for {model_name}'s KV "
                f"cache ({kv_bytes_per_token:,} bytes per token), but this machine has "
                f"{available_bytes / 2**30:,.1f} GiB available. Choose a smaller context size (--ctx-size)"
                + (f" (at most about {fits:,})." if fits >= MIN_CTX else ", or free some memory."))
    return ""
