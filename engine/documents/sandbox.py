"""Reading a file to attach, and extracting its text in a child process with limits.

``attach_file(path)`` is the whole path from a file name to a ``Document``: the file is
read here (size checked first, changes while reading detected), hashed (SHA-256), and its
bytes are handed to a spawned child that extracts the text under a time limit and, on
POSIX, an address-space limit (``resource.setrlimit(RLIMIT_AS)``). The child never opens a
file, so nothing it parses can make it read or write anywhere. Whatever happens in the
child (a crash, a loop, a memory blow-up) ends as one sentence (``DocumentError``).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.documents.extract import DocumentError, Extracted
from engine.documents.limits import MAX_FILE_BYTES, MEMORY_LIMIT_BYTES, TIME_LIMIT_S


@dataclass(frozen=True)
class Document:
    """An attached file: its ``name`` (no folders), ``sha256`` (hex of the file's bytes),
    ``size`` in bytes, the ``extracted`` text and, for storing, the ``data`` it came from."""

    name: str
    sha256: str
    size: int
    extracted: Extracted
    data: bytes

    @property
    def pages(self) -> int | None:
        """Page count of a PDF, None for the other kinds."""
        return len(self.extracted.pages) if self.extracted.paged else None


def _mb(n: int) -> str:
    return f"{n / 1024**3:.1f} GB" if n >= 1024**3 else f"{n / 1024**2:.0f} MB"


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, at most MAX_FILE_BYTES.

    Raises:
        DocumentError: missing, not a regular file, unreadable, larger than
            MAX_FILE_BYTES (from its size, before reading), or changed or gone while read.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise DocumentError(f"{p} does not exist (it may have been moved or deleted).") from None
    except OSError as exc:
        raise DocumentError(f"{p} cannot be read: {(exc.strerror or str(exc)).lower()}.") from None
    if not stat.S_ISREG(st.st_mode):
        raise DocumentError(f"{p} is not a regular file, so it cannot be attached.")
    if st.st_size > MAX_FILE_BYTES:
        raise DocumentError(f"{p.name} is {_mb(st.st_size)}, more than Branchwise attaches "
                            f"({_mb(MAX_FILE_BYTES)}); split it or attach a part.")
    try:
        with open(p, "rb") as f:
            before = os.fstat(f.fileno())
            data = f.read(MAX_FILE_BYTES + 1)
            after = os.fstat(f.fileno())
    except FileNotFoundError:
        raise DocumentError(f"{p} vanished while it was being read; attach it again.") from None
    except OSError as exc:
        raise DocumentError(f"{p} cannot be read: {(exc.strerror or str(exc)).lower()}.") from None
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"{p.name} grew past {_mb(MAX_FILE_BYTES)} while it was read, more than "
                            "Branchwise attaches.")
    if (len(data) != after.st_size or before.st_size != after.st_size
            or before.st_mtime_ns != after.st_mtime_ns or after.st_nlink == 0):
        raise DocumentError(f"{p} changed or vanished while it was being read; attach it again.")
    return data


def attach_file(path: str | os.PathLike, password: str | None = None, *,
                time_limit_s: float = TIME_LIMIT_S, memory_limit_bytes: int = MEMORY_LIMIT_BYTES) -> Document:
    """Read and extract ``path`` (see the module docstring). Raises DocumentError."""
    data = read_file(path)
    return attach_bytes(data, Path(path).name, password, time_limit_s=time_limit_s,
                        memory_limit_bytes=memory_limit_bytes)


def attach_bytes(data: bytes, name: str, password: str | None = None, *,
                 time_limit_s: float = TIME_LIMIT_S, memory_limit_bytes: int = MEMORY_LIMIT_BYTES) -> Document:
    """Extract ``data`` (a file's bytes, e.g. an API ``file`` part) named ``name``.

    Raises:
        DocumentError: over MAX_FILE_BYTES, anything ``extract.extract`` refuses, or the
            child ran out of time or memory or died.
    """
    name = Path(name.replace("\\", "/")).name or "attachment"
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"{name} is {_mb(len(data))}, more than Branchwise attaches ({_mb(MAX_FILE_BYTES)}).")
    extracted = extract_in_child(data, name, password, time_limit_s, memory_limit_bytes)
    return Document(name, hashlib.sha256(data).hexdigest(), len(data), extracted, data)


def extract_in_child(data: bytes, name: str, password: str | None, time_limit_s: float,
                     memory_limit_bytes: int) -> Extracted:
    """Run ``extract.extract`` in a spawned child under the limits; its result or its
    DocumentError. Raises DocumentError for a timeout, a memory blow-up or a crash."""
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child_end, data, name, password, memory_limit_bytes),
                       name="branchwise-extract", daemon=True)
    proc.start()
    child_end.close()
    try:
        if not parent_end.poll(time_limit_s):
            raise DocumentError(f"Reading {name} took longer than {time_limit_s:.0f} s, so it was stopped; "
                                "the file may be damaged or too complex.")
        try:
            kind, payload = parent_end.recv()
        except (EOFError, OSError):
            proc.join(5)
            raise DocumentError(f"Reading {name} failed: the reader stopped unexpectedly "
                                f"(exit code {proc.exitcode}); the file may be damaged.") from None
    finally:
        parent_end.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    if kind == "ok":
        return payload
    if kind == "memory":
        raise DocumentError(f"Reading {name} needed more than {_mb(memory_limit_bytes)} of memory, "
                            "so it was stopped; it may be a zip bomb or a damaged file.")
    message, needs_password = payload
    raise DocumentError(message, needs_password=needs_password)


def _child(conn, data: bytes, name: str, password: str | None, memory_limit_bytes: int) -> None:
    """The extraction child: limits first, then extract, then one message on ``conn``."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    except (ImportError, ValueError, OSError):  # Windows has no resource module
        pass
    from engine.documents.extract import extract

    try:
        conn.send(("ok", extract(data, name, password)))
    except DocumentError as exc:
        conn.send(("error", (str(exc), exc.needs_password)))
    except MemoryError:
        del data
        conn.send(("memory", None))
    except Exception as exc:  # noqa: BLE001 - a parser bug on a hostile file is still one sentence
        conn.send(("error", (f"{name} could not be read ({type(exc).__name__}); it may be damaged.", False)))
    finally:
        conn.close()
