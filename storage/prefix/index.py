"""The prefix store's index: one SQLite file (``kvcache.sqlite3``) of block and checkpoint
rows, its schema and migrations, its transactions, and SQLite's failures mapped to the
store's own errors.

Schema 5 (this one) keeps every payload in a file: blocks in ``kvcache.sqlite3-blocks/``,
checkpoints in ``kvcache.sqlite3-checkpoints/`` (two folders because a checkpoint's key
is hashed like a tail block's and may equal one). Schema 3 (block payloads in a
``block_data`` table) and schema 4 (checkpoint payloads in ``checkpoints.data``) are
migrated at open, each in one transaction; any other version is replaced by an empty store.

Faults: only a file SQLite reports as damaged (SQLITE_CORRUPT, SQLITE_NOTADB) is ever
replaced. A full disk, a lock or an I/O error leaves the file alone and raises
:class:`StoreFull` or :class:`StoreUnavailable` (both :class:`StoreError`).

Deletion: a transaction collects the keys whose rows it deletes (:attr:`Index.doomed`,
:attr:`Index.doomed_checkpoints`); their files are zeroed and unlinked after the commit
(a row never outlives its file), and kept after a rollback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from pathlib import Path

from storage.block_files import BlockFiles
from storage.errors import is_disk_full
from storage.paths import disk_full_message, free_space
from storage.prefix.records import StoreFull, StoreReset, StoreUnavailable

log = logging.getLogger("storage.prefix_store")

_PAGE_SIZE = 65536  # large pages keep the overflow chains of megabyte blobs short
_SCHEMA_VERSION = 5  # v3 and v4 are migrated (see the module docstring); others are replaced
_BLOCKS_IN_TABLE = 3
_CHECKPOINTS_IN_TABLE = 4


class Index:
    """The open index of one store and what its transactions share.

    Args:
        path: the ``kvcache.sqlite3`` file; created if missing.

    ``db`` is the connection (replaced when a damaged file is), ``lock`` the lock every
    caller holds, ``files`` and ``checkpoint_files`` the payload folders. Thread-safe
    under ``lock``. Raises StoreFull / StoreUnavailable when the file cannot be used.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.lock = threading.RLock()
        self.recovered_from: str | None = None  # why the file was replaced, if it was
        self.files = BlockFiles(f"{self.path}-blocks")
        self.checkpoint_files = BlockFiles(f"{self.path}-checkpoints")
        self.sync_scrub = False  # forget() forces its zeros to the disk
        self.doomed: list[bytes] = []  # block keys whose rows are deleted in the open transaction
        self.doomed_checkpoints: list[bytes] = []  # the same for checkpoints
        self.db = self.open()

    def open(self) -> sqlite3.Connection:
        """Connect (migrating an older schema); a malformed file is replaced by an empty
        store (``recovered_from`` says why), a full, locked or unwritable one raises
        StoreFull / StoreUnavailable and is left alone."""
        try:
            db = self._connect()
            db.execute("SELECT count(*) FROM blocks").fetchone()
            return db
        except (sqlite3.DatabaseError, ValueError) as exc:
            if isinstance(exc, sqlite3.OperationalError):
                # Full, locked, read-only, I/O error: the file may well be valid. Never
                # delete it for that; run without the cache this time.
                raise self.unavailable(exc, "the KV cache is not used this time") from exc
            log.warning("prefix store %s is unreadable (%s); starting an empty one", self.path, exc)
            self.recovered_from = str(exc)
            self.remove_files()
            return self._connect()

    def unavailable(self, exc: BaseException, consequence: str) -> "StoreUnavailable":
        """The StoreError for an OperationalError: StoreFull for a full disk (SQLITE_FULL,
        ENOSPC, or an I/O error with under 1 MB free), else StoreUnavailable."""
        folder = self.path.parent
        io_error = "disk I/O error" in str(exc)
        free = free_space(folder)
        if is_disk_full(exc) or (io_error and free is not None and free < 1024**2):
            return StoreFull(disk_full_message(folder, consequence))
        if "locked" in str(exc) or "busy" in str(exc):
            return StoreUnavailable(f"the KV cache {self.path} is locked by another process")
        return StoreUnavailable(f"the KV cache {self.path} could not be used: {exc}")

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
        db.text_factory = lambda b: b.decode("utf-8", "replace")  # damaged text is damage, not a crash
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _BLOCKS_IN_TABLE, _CHECKPOINTS_IN_TABLE, _SCHEMA_VERSION):
            db.close()
            log.info("prefix store %s has schema %s; starting a new one", self.path, version)
            self.remove_files()
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
            db.text_factory = lambda b: b.decode("utf-8", "replace")
        db.execute(f"PRAGMA page_size={_PAGE_SIZE}")
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        # The store is disposable, so durability is traded for speed: a rollback journal
        # (appended blocks are not journaled, and reads come straight from the mmap, where
        # a WAL would write every block twice and serve fresh blocks by pread), no fsync.
        # A crash of the machine mid-write is caught by the checksums or by the
        # malformed-file recovery above; it can cost cached blocks, never a wrong restore.
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA mmap_size=1073741824")
        db.execute("PRAGMA foreign_keys=ON")
        # Freed pages are overwritten with zeros: an evicted or forgotten block leaves
        # no token ids or KV bytes behind (https://sqlite.org/pragma.html#pragma_secure_delete).
        db.execute("PRAGMA secure_delete=ON")
        if version == _BLOCKS_IN_TABLE:
            self._migrate_v3(db)
        if db.execute("PRAGMA user_version").fetchone()[0] == _CHECKPOINTS_IN_TABLE:
            self._migrate_v4(db)
        if db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
            # Under the write lock, read the version again: another process opening the
            # same new folder may have created the schema meanwhile.
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
                raise
        return db

    def _migrate_v3(self, db: sqlite3.Connection) -> None:
        """Schema 3 kept payloads in a ``block_data`` table: write each one to its block
        file, then drop the table, in one transaction (schema 4; :meth:`_migrate_v4` then
        moves the checkpoints). A crash midway leaves schema 3 (the files written so far
        are rewritten next time)."""
        with _tx(db):
            if db.execute("PRAGMA user_version").fetchone()[0] == _BLOCKS_IN_TABLE:
                for key, data in db.execute(
                    "SELECT b.key, d.data FROM blocks b JOIN block_data d ON d.id = b.id"
                ):
                    self.files.write(key, data)
                db.execute("DROP TABLE block_data")
                db.execute(f"PRAGMA user_version={_CHECKPOINTS_IN_TABLE}")
        db.executescript("PRAGMA incremental_vacuum;")
        log.info("prefix store %s: block payloads moved to %s", self.path, self.files.folder)

    def _migrate_v4(self, db: sqlite3.Connection) -> None:
        """Schema 4 kept checkpoint payloads in the ``checkpoints.data`` column: write each
        one to its file (:attr:`checkpoint_files`), then drop the column, in one
        transaction, as :meth:`_migrate_v3` did for blocks. The rows keep their checksums,
        so a payload is verified on read as before. A crash midway leaves schema 4 (the
        files written so far are orphans, rewritten next time or reclaimed)."""
        with _tx(db):
            if db.execute("PRAGMA user_version").fetchone()[0] != _CHECKPOINTS_IN_TABLE:
                return
            columns = {r[1] for r in db.execute("PRAGMA table_info(checkpoints)")}
            if "data" in columns:
                for key, data in db.execute("SELECT key, data FROM checkpoints"):
                    self.checkpoint_files.write(key, data)
                db.execute("ALTER TABLE checkpoints DROP COLUMN data")
            for statement in _SCHEMA.split(";"):  # a v3 store had no checkpoints table
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        db.executescript("PRAGMA incremental_vacuum;")
        log.info("prefix store %s: checkpoint payloads moved to %s", self.path, self.checkpoint_files.folder)

    @contextlib.contextmanager
    def tx(self):
        """A transaction after whose commit the files of deleted blocks and checkpoints
        (:attr:`doomed`, :attr:`doomed_checkpoints`) are scrubbed; after a rollback they stay, as their rows do."""
        try:
            with _tx(self.db):
                yield
        except BaseException:
            if not self.db.in_transaction:
                self.doomed.clear()
                self.doomed_checkpoints.clear()
            raise
        if not self.db.in_transaction:
            self.scrub_doomed()

    def scrub_doomed(self) -> None:
        """Zero and unlink the files of the rows the last transaction deleted."""
        doomed, self.doomed = self.doomed, []
        self.files.scrub(doomed, sync=self.sync_scrub)
        doomed, self.doomed_checkpoints = self.doomed_checkpoints, []
        self.checkpoint_files.scrub(doomed, sync=self.sync_scrub)

    def remove_files(self) -> None:
        """Delete the index file, its journals and every payload file."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{self.path}{suffix}")
        self.files.remove_all()
        self.checkpoint_files.remove_all()

    def close(self) -> None:
        """Close the connection."""
        with self.lock:
            self.db.close()

    @contextlib.contextmanager
    def guard(self):
        """Run under the lock and turn SQLite's failures into the store's own errors: a
        full disk is StoreFull, a busy or unwritable file StoreUnavailable, and a
        malformed file is replaced by an empty one (StoreReset)."""
        with self.lock:
            try:
                yield
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise self.unavailable(exc, "the KV cache could not be saved") from exc
                log.error("prefix store damaged (%s); replacing it with an empty one", exc)
                self.recovered_from = str(exc)
                self.reset_file()
                raise StoreReset(str(exc)) from exc

    def reset_file(self) -> None:
        """Replace a damaged index (and its payload files) by an empty store."""
        self.doomed.clear()
        self.doomed_checkpoints.clear()
        with contextlib.suppress(Exception):
            self.db.close()
        self.remove_files()
        self.db = self._connect()

    def vacuum(self) -> None:
        """Return every free page to the file system (outside any transaction).

        ``PRAGMA incremental_vacuum`` frees one page per step of the statement. The
        sqlite3 module steps a statement without result columns once, so ``execute``
        (even with ``fetchall``) frees a single page: measured here, 259 free pages
        became 258. ``executescript`` steps each statement to the end."""
        assert not self.db.in_transaction
        self.db.executescript("PRAGMA incremental_vacuum;")

    def disk_bytes(self) -> int:
        """Bytes the cache takes on disk: the index file, its WAL and rollback journal, and
        the block and checkpoint files."""
        total = self.total_bytes()
        for suffix in ("", "-wal", "-journal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(f"{self.path}{suffix}")
        return total

    def fixed_overhead_bytes(self) -> int:
        """The size of this store when empty: page 1, a root page per table and index,
        and the pointer-map pages of auto-vacuum (one per page_size/5 pages;
        https://sqlite.org/fileformat2.html#pointer_map_or_ptrmap_pages)."""
        page_size = self.db.execute("PRAGMA page_size").fetchone()[0]
        roots = self.db.execute(
            "SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()[0]
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        ptrmaps = -(-pages // (page_size // 5))
        return page_size * (1 + roots + ptrmaps)

    def total_bytes(self) -> int:
        """Payload bytes held: blocks and checkpoints (both count against the budget)."""
        return self.db.execute(
            "SELECT (SELECT coalesce(sum(nbytes), 0) FROM blocks)"
            " + (SELECT coalesce(sum(nbytes), 0) FROM checkpoints)"
        ).fetchone()[0]

    def bump(self, **deltas: int) -> None:
        """Add ``deltas`` to the named counters (``stats``)."""
        self.db.executemany(
            "INSERT INTO counters(name, value) VALUES (?, ?)"
            " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            list(deltas.items()),
        )

    def write_payload(self, files: BlockFiles, key: bytes, payload) -> None:
        """Write a block's or a checkpoint's file (:meth:`BlockFiles.write`); a full disk
        raises StoreFull naming the folder, another OSError StoreUnavailable naming the file."""
        try:
            files.write(key, payload)
        except OSError as exc:
            if is_disk_full(exc):
                raise StoreFull(disk_full_message(self.path.parent, "the KV cache could not be saved")) from exc
            raise StoreUnavailable(f"the KV cache block {files.path(key)} could not be written: {exc}") from exc


@contextlib.contextmanager
def _tx(db: sqlite3.Connection):
    """A transaction on an autocommit connection (nested calls join the outer one)."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:  # SQLite may have rolled back already (a full disk does)
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# Raw sqlite3, not sqlite-utils, in this module: the store is the engine's hot path (a
# lookup and a put per turn, a row per 64 tokens). Measured on this project's machine
# (2 shared cores, other jobs running, so noisy): inserting a block row took 82 us with
# a prepared INSERT and 981 us with sqlite-utils' ``Table.insert`` (12x, it inspects
# the table's columns on every call). The schema is small and fixed, so it stays SQL.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS models(
    fingerprint BLOB PRIMARY KEY,
    layout TEXT NOT NULL,
    description TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS blocks(
    id INTEGER PRIMARY KEY,
    key BLOB NOT NULL UNIQUE,
    parent BLOB NOT NULL,
    fingerprint BLOB NOT NULL,
    start INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    nbytes INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    n_children INTEGER NOT NULL DEFAULT 0,
    last_access REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS blocks_parent ON blocks(parent);
CREATE INDEX IF NOT EXISTS blocks_leaves ON blocks(n_children, last_access);
CREATE TABLE IF NOT EXISTS checkpoints(
    id INTEGER PRIMARY KEY,
    key BLOB NOT NULL UNIQUE,
    fingerprint BLOB NOT NULL,
    anchor BLOB NOT NULL,
    n_tokens INTEGER NOT NULL,
    tail BLOB NOT NULL,
    nbytes INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    last_access REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_anchor ON checkpoints(anchor);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS file_digests(
    path TEXT PRIMARY KEY, stamp TEXT NOT NULL, digest TEXT NOT NULL
);
"""
