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
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

from storage.errors import DataDirError

APP_NAME = "Branchwise"
ENV_VAR = "BRANCHWISE_DATA_DIR"
CHATS_DB = "chats.sqlite3"
"""File name of the conversation database (precious) inside the data folder."""
KVCACHE_DB = "kvcache.sqlite3"
"""File name of the KV prefix store (disposable) inside the data folder."""


def resolve_data_dir(cli_value: str | None) -> Path:
    """Return the data folder as an absolute path, creating it if needed.

    Args:
        cli_value: the ``--data-dir`` value, or None (an empty or blank string
            counts as not given). ``~`` is expanded; a relative path is taken
            relative to the current working directory.

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
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise DataDirError(_message(path, source, "a file with that name already exists")) from exc
    except OSError as exc:
        raise DataDirError(_message(path, source, _reason(exc))) from exc
    _check_writable(path, source)
    return path


def _check_writable(path: Path, source: str) -> None:
    """Write and delete a small probe file in ``path``; raise DataDirError if that fails."""
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".branchwise-probe-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as exc:
        raise DataDirError(_message(path, source, _reason(exc))) from exc


def _reason(exc: OSError) -> str:
    """The operating system's explanation of ``exc`` in lower case, e.g. "permission denied"."""
    return (exc.strerror or str(exc)).lower()


def _message(path: Path, source: str, reason: str) -> str:
    return (
        f"Branchwise cannot use the data folder {path} ({source}): {reason}. "
        f"Choose another folder with --data-dir or the {ENV_VAR} environment variable."
    )
