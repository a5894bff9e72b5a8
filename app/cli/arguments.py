"""The CLI's argument types: each flag's text is parsed and checked against the bound
in engine/limits.py (the same bounds ``branchwise serve`` applies to request fields), so
a value out of range is one line and exit code 2 before anything is loaded."""

from __future__ import annotations

import argparse
import math

from engine import limits


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"branchwise: {message} (see '{self.prog} --help')\n")


def _whole(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _checked(fn, value):
    try:
        return fn(value)
    except limits.LimitError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


def parse_size(text: str) -> int:
    """A byte size like ``500000``, ``200M``, ``1.5G`` (powers of 1024), at most
    :data:`engine.limits.MAX_BUDGET_BYTES`.

    Raises:
        argparse.ArgumentTypeError: not a size, not positive, infinite or too large.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}.get(t[-1:], 1)
    try:
        number = float(t[:-1] if mult > 1 else t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 500M or 2G)") from None
    if not math.isfinite(number) or number * mult > limits.MAX_BUDGET_BYTES:
        raise argparse.ArgumentTypeError(f"the size must be at most 1 EiB, not {text!r}")
    value = int(number * mult)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the size must be positive, not {text!r}")
    return value


def positive(text: str) -> int:
    """A whole number of at least 1 (and at most 2^63 - 1)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return _checked(lambda v: limits.check("value", v, limits.Bound(1, limits.INT64_MAX, integer=True)), value)


def row_id(text: str) -> int:
    """A conversation or message id: 1 to 2^63 - 1 (SQLite's INTEGER)."""
    return _checked(lambda v: limits.check_id(v), _whole(text))


def ctx_size(text: str) -> int:
    """``--ctx-size``: 256 to 16,777,216 tokens (the model's own bound is checked at load)."""
    return _checked(limits.check_ctx_size, _whole(text))


def threads(text: str) -> int:
    """``--threads``: 0 (automatic) to the logical core count x 4."""
    return _checked(limits.check_threads, _whole(text))


def port(text: str) -> int:
    """``--port``: 0 (a free one) to 65535."""
    return _checked(lambda v: limits.check("port", v, limits.Bound(0, limits.MAX_PORT, integer=True)), _whole(text))


def queue_size(text: str) -> int:
    """``--queue-size``: 1 to :data:`engine.limits.MAX_QUEUE`."""
    return _checked(lambda v: limits.check("queue", v, limits.Bound(1, limits.MAX_QUEUE, integer=True)),
                    _whole(text))


def sampling(name: str):
    """The argparse type of the sampling field ``name`` (its bound: engine.limits.SAMPLING)."""
    bound = limits.SAMPLING[name]

    def parse(text: str):
        value = _whole(text) if bound.integer else _number(text)
        return _checked(lambda v: limits.check_sampling(name, v), value)

    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse
