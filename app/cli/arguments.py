"""The CLI's argument types and its parser class: a value out of range is one line on
stderr and exit code 2 before anything is loaded."""

from __future__ import annotations

import argparse


def parse_size(text: str) -> int:
    """Parse a byte size like ``500000``, ``200M``, ``1.5G`` (powers of 1024).

    Raises:
        argparse.ArgumentTypeError: not a size, or not positive.
    """
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 500M or 2G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the size must be positive, not {text!r}")
    return value


def positive(text: str) -> int:
    """A whole number of at least 1 (argparse.ArgumentTypeError otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"branchwise: {message} (see '{self.prog} --help')\n")


def non_negative(text: str) -> float:
    """A number of 0 or more, not NaN (argparse.ArgumentTypeError otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def ctx_size(text: str) -> int:
    """``--ctx-size``: a whole number of tokens, at least 256 (argparse.ArgumentTypeError otherwise)."""
    value = positive(text)
    if value < 256:
        raise argparse.ArgumentTypeError("the context size must be at least 256 tokens")
    return value


def add_remote_arguments(parser) -> None:
    """``--engine-url/--engine-key/--engine-model`` for ``chat`` and ``regenerate``."""
    parser.add_argument("--engine-url", metavar="URL",
                        help="send the request to this OpenAI-compatible server (e.g. http://gpu-box:8000/v1) "
                             "instead of the local model; the conversation stays here. The only network "
                             "connection Branchwise makes, and only to this URL")
    parser.add_argument("--engine-key", metavar="KEY", help="API key for --engine-url (env BRANCHWISE_ENGINE_KEY)")
    parser.add_argument("--engine-model", metavar="NAME",
                        help="model name to request from --engine-url (default: the first it lists)")
