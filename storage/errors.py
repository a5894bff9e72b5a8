"""Errors raised by the storage layer, worded for the person using the app.

Every error here carries a message a person can act on (the window shows it
as is); the original exception stays attached as ``__cause__`` for the log.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


class StorageError(Exception):
    """Base class of every error raised by ``storage/``."""


class DataDirError(StorageError):
    """The data folder cannot be created, or Branchwise cannot write in it."""


class ForeignDataDirError(DataDirError):
    """The data folder chosen already holds other files and is not a Branchwise data
    folder (``storage.paths.is_data_folder``): the CLI refuses it, the window asks."""


class NotFoundError(StorageError, LookupError):
    """An unknown conversation or message id was asked for.

    The message names the kind of record and its id, for example
    ``"There is no message with id 42 (it may have been deleted)."``.
    """


class StorageFullError(StorageError):
    """The disk (or the database's size limit) is full; nothing was saved."""


def is_disk_full(exc: BaseException) -> bool:
    """Return True if ``exc`` means "no space left".

    Recognises ``sqlite3.OperationalError`` with result code ``SQLITE_FULL``
    ("database or disk is full", sqlite3.h) and ``OSError`` with ``ENOSPC``.
    """
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        return code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return False


@contextmanager
def disk_full_as_storage_full(where: str) -> Iterator[None]:
    """Re-raise "disk full" errors inside the block as ``StorageFullError``.

    ``where`` names the file or folder being written (shown to the person).
    Other exceptions pass through unchanged.

    Raises:
        StorageFullError: the block failed with SQLITE_FULL or ENOSPC.
    """
    try:
        yield
    except (sqlite3.OperationalError, OSError) as exc:
        if is_disk_full(exc):
            raise StorageFullError(
                f"The disk holding {where} is full, so the last change was not saved. "
                "Free some space and try again."
            ) from exc
        raise
