"""The CLI's argument types, its parser class and the option groups commands share
(:func:`common_options`, :func:`engine_options`, :func:`add_remote_arguments`): a value out
of range is one line on stderr and exit code 2 before anything is loaded."""

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


def common_options() -> Parser:
    """The options every command that reads the data folder takes, as an argparse parent:
    ``--data-dir``, ``--json``, ``--quiet``."""
    common = Parser(add_help=False)
    common.add_argument("--data-dir", help="where chats and the KV cache live (default: the user data folder; env BRANCHWISE_DATA_DIR)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    common.add_argument("--quiet", action="store_true", help="no progress bars on the terminal")
    return common


def engine_options() -> Parser:
    """The options of a command that loads a model (``chat``, ``regenerate``, ``serve``), as
    an argparse parent: the model, the context, the prefix store and the sampling."""
    engine = Parser(add_help=False)
    engine.add_argument("--model", help="a GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    engine.add_argument("--ctx-size", type=ctx_size, default=8192, help="context window in tokens (default 8192)")
    engine.add_argument("--threads", type=int, default=0, help="CPU threads (default: the physical core count less one, at least 1)")
    engine.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16", help="KV cache precision")
    engine.add_argument("--flash-attn", action="store_true",
                        help="use flash attention (faster prefill; replies after a restore may then differ "
                             "in rare cases from uncached ones; always on with --kv-type q8_0)")
    engine.add_argument("--cache-budget", type=parse_size, default=None,
                        help="most bytes the prefix store keeps, e.g. 2G (env BRANCHWISE_CACHE_BUDGET)")
    engine.add_argument("--no-cache", action="store_true", help="neither read nor write the prefix store")
    engine.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                        help="llama.cpp's CPU weight repacking: auto (off when llama.cpp has AMX kernels, "
                             "which crash on some CPUs), on or off (env BRANCHWISE_REPACK overrides)")
    engine.add_argument("--max-tokens", type=positive, help="most tokens in the reply")
    engine.add_argument("--temperature", type=non_negative, help="0 or more; 0 is deterministic")
    engine.add_argument("--seed", type=int, help="sampling seed")
    engine.add_argument("--top-p", type=float, help="nucleus sampling threshold")
    engine.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    engine.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top probability")
    engine.add_argument("--repeat-penalty", type=float, help="penalty for recently generated tokens (1 = none)")
    return engine
