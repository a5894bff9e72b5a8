"""Where Branchwise keeps its two databases.

The data folder holds ``chats.sqlite3`` (the conversations: the user's data, never
deleted by Branchwise) and ``kvcache.sqlite3`` (the prefix store: disposable). It is
chosen in this order:

1. the ``--data-dir`` command-line value,
2. the ``BRANCHWISE_DATA_DIR`` environment variable,
3. the per-user data folder from platformdirs, for example
   ``~/.local/share/Branchwise`` on Linux,
   ``~/Library/Application Support/Branchwise`` on macOS,
   ``%LOCALAPPDATA%\\Branchwise`` on Windows.

A folder that already holds other files and none of Branchwise's databases is not
taken: the command line refuses it (naming a ``Branchwise`` subfolder to use instead)
and the window asks first. Whatever folder it is, Branchwise only ever changes, empties
or deletes the files it made there (:data:`OWN_FILES`, :data:`OWN_DIRS`).

Who can read it: the conversations are private, so the folder is made 0700 and
the files Branchwise makes in it 0600 (its folders 0700), as ssh and gpg do with their
folders. :func:`resolve_data_dir` sets the process umask to 077 so every file the
app creates afterwards (the databases and SQLite's ``-wal``/``-shm``/``-journal``
sidecars, which SQLite creates with the mode of the database file,
``settings.json``, ``logs/`` and the rotated log files) starts private, and
tightens what an older install left group- or world-readable. On Windows POSIX
modes mean little (``os.chmod`` only toggles read-only); there Branchwise relies
on the ACLs of the user profile: ``%LOCALAPPDATA%`` is readable only by its owner,
SYSTEM and administrators, and files created in it inherit that ACL.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import platformdirs

from storage.errors import DataDirError, ForeignDataDirError

log = logging.getLogger(__name__)

APP_NAME = "Branchwise"
ENV_VAR = "BRANCHWISE_DATA_DIR"
CHATS_DB = "chats.sqlite3"
"""File name of the conversation database (precious) inside the data folder."""
KVCACHE_DB = "kvcache.sqlite3"
"""File name of the KV prefix store (disposable) inside the data folder."""
DIR_MODE = 0o700
"""Mode of the data folder and of the folders inside it (owner only)."""
FILE_MODE = 0o600
"""Mode of every file inside the data folder (owner read and write)."""
PRIVATE_UMASK = 0o077
"""The umask set by :func:`resolve_data_dir`: new files 0600, new folders 0700."""

BLOCKS_DIR = KVCACHE_DB + "-blocks"
"""The folder of the prefix store's block files (``storage/block_files.py``)."""
CHECKPOINTS_DIR = KVCACHE_DB + "-checkpoints"
"""The folder of the prefix store's checkpoint files (``storage/prefix/checkpoints.py``),
named like block files."""
BLOCK_NAME = re.compile(r"[0-9a-f]{64}(\.[0-9]{1,10}\.tmp)?")
"""A block file's name: its 32-byte key in hex, or that plus ``.PID.tmp`` while it is
written. Nothing else in the blocks folder is ever opened for writing or removed."""
LOGS_DIR = "logs"
LOG_NAME = re.compile(r"(app|engine|cli)\.log(\.[0-9]{1,3})?")
"""The log files in ``logs/``, rotated ones (``app.log.1``) included."""
_DATABASES = (CHATS_DB, KVCACHE_DB, "serve-replies.sqlite3")
OWN_FILES = frozenset(
    [db + suffix for db in _DATABASES for suffix in ("", "-wal", "-shm", "-journal")]
    + ["settings.json", "settings.json.tmp", "settings.json.unreadable",
       "cpu-verdict.json", "cpu-verdict.tmp", "hub-token", KVCACHE_DB + "-blocks.lock"])
"""Every file Branchwise makes directly in the data folder: the three databases and
SQLite's sidecars, the window's settings (with its temporary and set-aside copies) and
the crash verdict (``engine/cpu.py``), the model hub's token (``engine/hub/catalog.py``) and
the lock that keeps block files from being zeroed while a restore copies them
(``storage/block_files.py``).
The folder also holds :data:`LOGS_DIR`, :data:`BLOCKS_DIR`, :data:`CHECKPOINTS_DIR` and :data:`MODELS_DIR`, and
``.branchwise-probe-*`` files live a moment at start."""
MODELS_DIR = "models"
"""Downloaded models (``engine/hub/library.py``): GGUF files, and ``.partial/`` while one downloads."""
MODEL_NAME = re.compile(r"[^/\\]+\.gguf")
STREAMS_DIR = CHATS_DB + "-streams"
"""Locks of the replies being streamed now (``storage/chats/live_streams.py``)."""
STREAM_LOCK_NAME = re.compile(r"[0-9]{1,19}\.lock")
OWN_DIRS = {LOGS_DIR: LOG_NAME, BLOCKS_DIR: BLOCK_NAME, CHECKPOINTS_DIR: BLOCK_NAME, MODELS_DIR: MODEL_NAME,
            STREAMS_DIR: STREAM_LOCK_NAME}
"""The folders Branchwise makes in the data folder, with the pattern of the files in them."""
_PROBE = ".branchwise-probe-"


_DESKTOP_FILES = frozenset([".DS_Store", "Thumbs.db", "desktop.ini", ".directory"])
"""What a file manager leaves in any folder it shows: never a sign of someone else's files."""


def is_own_name(name: str) -> bool:
    """True when ``name`` (an entry directly in the data folder) is one Branchwise makes, or
    one a file manager leaves in every folder it opens (never touched: see tighten_permissions)."""
    return name in OWN_FILES or name in OWN_DIRS or name.startswith(_PROBE) or name in _DESKTOP_FILES


def is_data_folder(path: Path) -> bool:
    """True when ``path`` is a folder Branchwise may use as its data folder: missing,
    empty, holding only names Branchwise makes, or holding one of its databases as a
    regular file (a data folder the user also keeps other files in)."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except FileNotFoundError:
        return True
    except OSError:
        return True  # not listable: the write probe says why, in one line
    if all(is_own_name(e.name) for e in entries):
        return True
    return any(e.name in _DATABASES and e.is_file(follow_symlinks=False) for e in entries)


def resolve_data_dir(cli_value: str | None, allow_foreign: bool = False) -> Path:
    """Return the data folder as an absolute path, creating it if needed.

    Args:
        cli_value: the ``--data-dir`` value, or None (an empty or blank string
            counts as not given). ``~`` is expanded; a relative path is taken
            relative to the current working directory.
        allow_foreign: use a folder that already holds other files and no Branchwise
            database (the window asks the user first); without it that is refused.
            Either way Branchwise touches only the files it makes there.

    Returns:
        The absolute path of an existing folder Branchwise can write in.

    Raises:
        DataDirError: the folder cannot be created (for example a file of that
            name exists, or permission is denied) or a file cannot be written
            in it. The message names the folder and where the choice came from.
    """
    if cli_value and cli_value.strip():
        raw, source = cli_value.strip(), "set by --data-dir"
    elif os.environ.get(ENV_VAR, "").strip():
        raw, source = os.environ[ENV_VAR].strip(), f"set by {ENV_VAR}"
    else:
        raw, source = platformdirs.user_data_dir(APP_NAME, appauthor=False), "the default"
    path = Path(raw).expanduser().absolute()
    if not allow_foreign and path.is_dir() and not is_data_folder(path):
        raise ForeignDataDirError(
            f"The data folder {path} ({source}) already holds other files and no Branchwise "
            f"database, and Branchwise keeps its files in a folder of its own: pass a new or "
            f"empty folder, for example {path / APP_NAME}.")
    make_private()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise DataDirError(_message(path, source, "a file with that name already exists")) from exc
    except OSError as exc:
        raise DataDirError(_message(path, source, _reason(exc))) from exc
    _check_writable(path, source)
    tighten_permissions(path)
    return path


def make_private() -> None:
    """Set the process umask to :data:`PRIVATE_UMASK` (077), so that every file and
    folder created from now on is readable by its owner only. A no-op on Windows."""
    if sys.platform != "win32":
        os.umask(PRIVATE_UMASK)


def tighten_permissions(folder: Path) -> list[Path]:
    """Make what Branchwise created in ``folder`` private: its files 0600, its folders
    (``logs/``, the blocks folder) 0700, and ``folder`` itself 0700 when it holds
    nothing but Branchwise's names (a folder that also holds the user's files keeps
    its mode: it is theirs).

    Only names Branchwise makes are touched (:data:`OWN_FILES`, :data:`OWN_DIRS` and
    the file patterns in them); nothing else is walked into. Symbolic links are never
    followed, a file with other hard links is skipped (a symlinked blocks folder keeps its target's mode), and permission bits
    are only ever removed (a file the owner made read-only stays read-only). Entries
    that vanish meanwhile or cannot be changed (another owner) are skipped. Returns the
    paths whose mode changed. A no-op on Windows, where the profile's ACLs apply (see
    the module docstring).
    """
    if sys.platform == "win32":
        return []
    folder = Path(folder)
    changed: list[Path] = []
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:
        return changed
    if all(is_own_name(e.name) for e in entries) and _restrict(folder, DIR_MODE):
        changed.append(folder)
    for entry in entries:
        path = Path(entry.path)
        try:
            if entry.name in OWN_FILES and entry.is_file(follow_symlinks=False):
                if _restrict(path, FILE_MODE):
                    changed.append(path)
            elif entry.name in OWN_DIRS and entry.is_dir(follow_symlinks=False):
                changed += _tighten_own_dir(path, OWN_DIRS[entry.name])
        except OSError:
            continue
    return changed


def _tighten_own_dir(folder: Path, names: re.Pattern) -> list[Path]:
    """``folder`` 0700 and its regular files whose names match ``names`` 0600."""
    changed = [folder] if _restrict(folder, DIR_MODE) else []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if (names.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
                        and _restrict(Path(entry.path), FILE_MODE)):
                    changed.append(Path(entry.path))
    except OSError:
        pass
    return changed


def _restrict(path: Path, allowed: int) -> bool:
    """Clear the permission bits of ``path`` outside ``allowed``; True if any were set.
    A file with other hard links is left alone: its mode is also the other name's."""
    try:
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            return False
        if mode & ~allowed:
            os.chmod(path, mode & allowed, follow_symlinks=False)
            return True
    except (OSError, NotImplementedError):
        pass
    return False


def free_space(folder: Path) -> int | None:
    """Bytes free for this user on the file system holding ``folder`` (None if unknown)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def human_bytes(n: float) -> str:
    """``n`` bytes in the unit that keeps the number short: ``"812 bytes"``,
    ``"40.0 KB"``, ``"5.0 MB"``, ``"2.50 GB"``. Units are powers of 1024, like the
    sizes the command line accepts (``--cache-budget 5M`` is 5 x 1024**2 bytes)."""
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} bytes"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.2f} {unit}" if unit in ("GB", "TB") else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def disk_full_message(folder: Path, not_saved: str) -> str:
    """A sentence naming a full disk, its free space and the folder, e.g. "The disk
    holding /home/a/.local/share/Branchwise is full (40.0 KB free), so the reply was
    not saved. Free some space and try again." ``not_saved`` says what was lost."""
    free = free_space(folder)
    room = "" if free is None else f" ({human_bytes(free)} free)"
    return (f"The disk holding {folder} is full{room}, so {not_saved}. "
            "Free some space and try again.")


def _check_writable(path: Path, source: str) -> None:
    """Write and delete a small probe file in ``path``; raise DataDirError if that fails."""
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=_PROBE) as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # writable but full: reading chats must still work, and
            log.info("the disk holding %s is full", path)  # each write says "disk full" itself
            return
        raise DataDirError(_message(path, source, _reason(exc))) from exc


def _reason(exc: OSError) -> str:
    """The operating system's explanation of ``exc`` in lower case, e.g. "permission denied"."""
    return (exc.strerror or str(exc)).lower()


def _message(path: Path, source: str, reason: str) -> str:
    return (
        f"Branchwise cannot use the data folder {path} ({source}): {reason}. "
        f"Choose another folder with --data-dir or the {ENV_VAR} environment variable."
    )
