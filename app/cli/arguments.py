"""The CLI's argument types, its parser class and the option groups commands share
(:func:`common_options`, :func:`engine_options`, :func:`add_remote_arguments`). Each flag's
text is parsed and checked against the bound in engine/limits.py (the same bounds
``branchwise serve`` applies to request fields), so a value out of range is one line on
stderr and exit code 2 before anything is loaded."""

from __future__ import annotations

import argparse
import math

from app.cli import reasoning_view
from engine import limits


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), not a usage block;
    when the command line asks for ``--json`` (:attr:`json_errors`, set by ``main``), stdout
    also holds one object ``{"error": words, "saved": null}``, as for every other failure."""

    json_errors = False

    def error(self, message: str):
        words = f"{message} (see '{self.prog} --help')"
        if Parser.json_errors:
            import json
            import sys

            print(json.dumps({"error": words, "saved": None}, ensure_ascii=False))
            sys.stdout.flush()
        self.exit(2, f"branchwise: {words}\n")


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


def speculative(text: str) -> str:
    """``--speculative``: none, lookup or draft:PATH (engine.speculative_setting.parse).

    Raises:
        argparse.ArgumentTypeError: any other text.
    """
    from engine.speculative_setting import parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_remote_arguments(parser) -> None:
    """``--engine-url/--engine-key/--engine-model`` for ``chat`` and ``regenerate``."""
    parser.add_argument("--engine-url", metavar="URL",
                        help="send the request to this OpenAI-compatible server (e.g. http://gpu-box:8000/v1) "
                             "instead of the local model; the conversation stays here. A chat connects to "
                             "nothing else (only 'branchwise models' contacts the model hub, when asked)")
    parser.add_argument("--engine-key", metavar="KEY", help="API key for --engine-url (env BRANCHWISE_ENGINE_KEY)")
    parser.add_argument("--engine-model", metavar="NAME",
                        help="model name to request from --engine-url (default: the first it lists)")


DATA_DIR_HELP = ("where chats and the KV cache live (default: the user data folder; env BRANCHWISE_DATA_DIR): a new "
                 "or empty folder, or one holding Branchwise's databases; a folder of other files is refused (use a "
                 "Branchwise subfolder of it)")


def common_options() -> Parser:
    """The options every command that reads the data folder takes, as an argparse parent:
    ``--data-dir``, ``--json``, ``--quiet``."""
    common = Parser(add_help=False)
    common.add_argument("--data-dir", help=DATA_DIR_HELP)
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    common.add_argument("--quiet", action="store_true", help="no progress bars on the terminal")
    return common


def engine_options() -> Parser:
    """The options of a command that loads a model (``chat``, ``regenerate``, ``serve``), as
    an argparse parent: the model, the context, the prefix store and the sampling."""
    from engine.settings import EngineSettings  # no llama_cpp: only the defaults

    defaults = EngineSettings()
    engine = Parser(add_help=False)
    engine.add_argument("--model", help="a GGUF model file, or the name of a model downloaded with "
                                        "'branchwise models' (default: the embedded SmolLM2-135M-Instruct)")
    engine.add_argument("--ctx-size", type=ctx_size, default=8192,
                        help="context window in tokens (default 8192; at most 4 times what the model was trained "
                             "for, and what this machine's memory holds)")
    engine.add_argument("--threads", type=threads, default=0,
                        help="CPU threads (default: the physical core count less one, at least 1; at most 4 "
                             "per core)")
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
    engine.add_argument("--speculative", type=speculative, default=defaults.speculative, metavar="none|lookup|draft:PATH",
                        help="speculative decoding: drafts verified in one batch; lookup drafts from the "
                             "conversation itself, draft:PATH with a small model of the same vocabulary "
                             f"(default {defaults.speculative}: at temperature 0 a speculative reply can differ "
                             "from a plain one in a near tie)")
    engine.add_argument("--max-tokens", type=sampling("max_tokens"), help="most tokens in the reply (1 to 1048576)")
    engine.add_argument("--temperature", type=sampling("temperature"), help="0 to 2; 0 is deterministic")
    engine.add_argument("--seed", type=sampling("seed"), help="sampling seed (a 64-bit integer)")
    engine.add_argument("--top-p", type=sampling("top_p"), help="nucleus sampling threshold (0 to 1)")
    engine.add_argument("--top-k", type=sampling("top_k"), help="sample among the k most likely tokens (0: all)")
    engine.add_argument("--min-p", type=sampling("min_p"),
                        help="drop tokens below this fraction of the top probability (0 to 1)")
    engine.add_argument("--repeat-penalty", type=sampling("repeat_penalty"),
                        help="penalty for recently generated tokens (1 = none; more than 0, at most 10)")
    reasoning_view.add_arguments(engine)
    return engine
