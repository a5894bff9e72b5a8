"""The connection to ``chats.sqlite3`` that the store's parts share: opening it (pragmas,
migrations, a retried first lock), its transactions, and a full disk as
:class:`storage.errors.StorageFullError`.

Durability: WAL mode with ``synchronous=NORMAL`` and one transaction per change. A crash
of the app loses nothing that was committed; a crash of the operating system or a power
cut may also roll back the last few commits (never leaving a half-written one).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from storage.chat_schema import migrate
from storage.errors import StorageError, StorageFullError, is_disk_full
from storage.paths import disk_full_message, free_space

LOW_SPACE_BYTES = 1024**2
"""Below this much free space, SQLite's "disk I/O error" is taken for a full disk: the
shared-memory file (``-shm``) and the WAL fail that way when they cannot grow."""


class ChatDatabase:
    """One open connection to a chat database and the lock its users hold.

    Opened with ``check_same_thread=False`` and used under :attr:`lock`, so the UI thread
    and a worker thread may share it. Raises StorageError (not a Branchwise database, a
    newer version, cannot be opened) or StorageFullError (a full disk) when opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = threading.RLock()
        self.read_only = False
        """Opened read-only because the disk is full (:func:`open_read_only`): the chats
        can be listed, shown and exported, and every change says the disk is full."""
        try:
            self.conn = _open(self.path)
        except StorageFullError:
            self.conn = open_read_only(self.path)
            self.read_only = True
        self.utils = sqlite_utils.Database(self.conn, recursive_triggers=False)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one write transaction; commit on success, roll back on error."""
        if self.read_only:
            raise StorageFullError(disk_full_message(self.path.parent, "the last change was not saved"))
        with self.lock, disk_full_raises(self.path, "the last change was not saved"):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # SQLite may already have rolled back
                    self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the connection; it cannot be used afterwards."""
        with self.lock:
            self.conn.close()


class Part:
    """A part of the store (its tree, search, copies, deletion): the shared connection
    under the names every method uses (``_conn``, ``_lock``, ``_tx``, ``_db``)."""

    def __init__(self, database: ChatDatabase) -> None:
        self.path = database.path
        self._conn = database.conn
        self._lock = database.lock
        self._tx = database.tx
        self._db = database.utils


# -- opening and validation -----------------------------------


_OPEN_RETRIES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Waits before trying a locked first open again. Measured: with 8 processes opening a new
folder together, SQLite occasionally answered "database is locked" at once, without its
busy handler (while another opener was setting the new file up): once in 160 opens in one
run of tests/test_concurrency.py."""


def _open(path: Path) -> sqlite3.Connection:
    """Connect in autocommit mode (transactions are explicit), set pragmas, migrate.
    A lock that SQLite reports at once is retried a few times (``_OPEN_RETRIES_S``)."""
    for wait in _OPEN_RETRIES_S:
        try:
            return _open_once(path)
        except StorageError as exc:
            if not isinstance(exc.__cause__, sqlite3.OperationalError) or "locked" not in str(exc.__cause__):
                raise
            time.sleep(wait)
    return _open_once(path)


def _open_once(path: Path) -> sqlite3.Connection:
    conn: sqlite3.Connection | None = None
    try:
        with disk_full_raises(path, f"the chat database {path.name} could not be opened"):
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Deleted rows are overwritten with zeros, not left in free pages
            # (https://sqlite.org/pragma.html#pragma_secure_delete).
            conn.execute("PRAGMA secure_delete = ON")
            migrate(conn, str(path))
            return conn
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.OperationalError):  # cannot open, locked, permission denied
            raise StorageError(f"Branchwise cannot open its chat database {path}: {exc}.") from exc
        raise StorageError(  # not a database, or a damaged one
            f"{path} is not a readable Branchwise chat database ({exc}). "
            "Move the file aside to start with an empty history."
        ) from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise


def open_read_only(path: Path) -> sqlite3.Connection:
    """On a full disk, where even opening needs room (the WAL's shared-memory file):
    ``chats.sqlite3`` opened read-only and immutable, so the chats can still be read and
    exported. Only when the file is complete on its own: no WAL file with changes not yet
    copied into it (a clean close leaves none), and its schema is this version's.

    Raises:
        StorageFullError: the disk is full and the file cannot be read this way.
    """
    full = StorageFullError(disk_full_message(path.parent, f"the chat database {path.name} could not be opened"))
    wal = path.with_name(path.name + "-wal")
    try:
        if not path.is_file() or (wal.exists() and wal.stat().st_size > 0):
            raise full
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, isolation_level=None,
                               check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise full from exc
    try:
        from storage.chat_schema import MIGRATIONS, schema_version

        if schema_version(conn) != len(MIGRATIONS):
            raise full
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA temp_store = MEMORY")  # a query's temporary tables need no disk
        return conn
    except BaseException:
        conn.close()
        raise


@contextmanager
def disk_full_raises(path: Path, not_saved: str) -> Iterator[None]:
    """Re-raise a full disk inside the block as StorageFullError naming the folder and
    its free space. SQLITE_FULL and ENOSPC are a full disk; so is SQLITE_IOERR ("disk
    I/O error") while less than LOW_SPACE_BYTES are free. Other errors pass unchanged."""
    try:
        yield
    except (sqlite3.OperationalError, OSError) as exc:
        if _is_full(exc, path.parent):
            raise StorageFullError(disk_full_message(path.parent, not_saved)) from exc
        raise


def _is_full(exc: BaseException, folder: Path) -> bool:
    if is_disk_full(exc):
        return True
    io_error = (isinstance(exc, sqlite3.OperationalError)
                and (getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_IOERR
                     or "disk I/O error" in str(exc)))
    free = free_space(folder) if io_error else None
    return free is not None and free < LOW_SPACE_BYTES
