"""The prefix store: token-aligned KV blocks, content-addressed and indexed in SQLite.

``kvcache.sqlite3`` (the index: keys, tokens, checksums, checkpoints) and the folder
``kvcache.sqlite3-blocks/`` (one file per block payload, :mod:`storage.block_files`) are
disposable (deleting them only costs prefill time) and bounded by a byte budget. The
index is the source of truth: a file without a row is an orphan, reclaimed at open. It knows nothing of llama.cpp: a block is an opaque payload plus the token
ids it covers. The rules it keeps:

* keys chain from the model fingerprint (:mod:`storage.block_hash`), so blocks are shared
  by every branch and conversation with the same token prefix and never across models;
* :meth:`PrefixStore.lookup` finds full blocks by walking the chain, then the longest
  common prefix among the children of the last match (full blocks and tails), so a match
  is token-granular;
* :meth:`PrefixStore.put` writes only blocks the store lacks, in one transaction, drops
  tails a longer block now covers, then evicts leaves in least-recently-used order down
  to the budget, the blocks of the active path last;
* every payload carries an xxh3-64 checksum that :meth:`PrefixStore.read` verifies over
  the mapped file (no copy); a bad or missing block is deleted with its descendants and the match stops before it. A database file
  SQLite itself reports as malformed is replaced by an empty one.

Faults: only a file SQLite reports as damaged (SQLITE_CORRUPT, SQLITE_NOTADB) is ever
replaced. A full disk, a lock or an I/O error leaves the file alone and raises
:class:`StoreFull` or :class:`StoreUnavailable` (both :class:`StoreError`), which the
engine treats as "no cache this time"; statistics and last-use stamps written by a
lookup are best effort and never fail it.

Budget: ``budget_bytes`` bounds what the cache takes on disk (the index file, its
journal and the block files),
beyond the fixed size of an empty store (its schema pages, a few hundred KB at 64 KB
pages). After an eviction ``PRAGMA incremental_vacuum`` returns every free page to the
file system, so the file shrinks with its contents.

Deletion: ``PRAGMA secure_delete=ON`` overwrites freed index content with zeros, the
vacuum truncates the freed pages, and a block's file is overwritten with zeros before
it is unlinked, so an evicted or forgotten block leaves no bytes in the folder. :meth:`PrefixStore.forget` drops the blocks of token sequences that no other
sequence needs (the engine computes them: ``engine.forget``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np

from storage.block_files import BlockFiles
from storage.block_hash import block_key, chain_keys, tokens_from_bytes, tokens_to_bytes
from storage.errors import StorageError, StorageFullError, is_disk_full
from storage.parallel import in_halves, xxh3_64
from storage.paths import disk_full_message, free_space

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 64  # tokens; see `branchwise bench` for the trade-off
DEFAULT_BUDGET_BYTES = 4 * 1024**3
"""The prefix store's byte budget when the user chose none (4 GiB): the one default for the
window, the CLI, the engine process and the README."""
_PAGE_SIZE = 65536  # large pages keep the overflow chains of megabyte blobs short
_SCHEMA_VERSION = 4  # v3 (payloads in a block_data table) is migrated; others are replaced
_BLOCKS_IN_TABLE = 3


def checksum(data) -> int:
    """xxh3-64 of ``data`` (a contiguous buffer) as a signed 64-bit integer (SQLite's
    INTEGER range)."""
    value = xxh3_64(data)
    return value - (1 << 64) if value >= (1 << 63) else value


@dataclass(frozen=True)
class BlockRef:
    """One stored block in a match: tokens ``[start, start + n_tokens)``, of which the
    first ``use`` tokens are part of the match (``use < n_tokens`` only for the last)."""

    key: bytes
    start: int
    n_tokens: int
    use: int


@dataclass
class PrefixMatch:
    """The longest stored prefix of a query: ``blocks`` in token order, ``n_tokens`` long."""

    blocks: list[BlockRef] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(b.use for b in self.blocks)

    def truncated(self, max_tokens: int) -> "PrefixMatch":
        """The same match cut to at most ``max_tokens`` tokens."""
        out, left = [], max_tokens
        for b in self.blocks:
            if left <= 0:
                break
            out.append(BlockRef(b.key, b.start, b.n_tokens, min(b.use, left)))
            left -= out[-1].use
        return PrefixMatch(out)


@dataclass(frozen=True)
class NewBlock:
    """A block to store: tokens ``[start, stop)`` of the sequence, keyed in the chain."""

    key: bytes
    parent: bytes
    start: int
    tokens: np.ndarray
    # The bytes: a contiguous buffer, or a callable returning one (called once, on whichever
    # thread writes the block: PrefixStore.put).
    payload: bytes | memoryview | np.ndarray | Callable[[], Any] | None = None
    nbytes: int = 0  # the size a callable payload will have (to decide on a second thread)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class CheckpointRef:
    """A stored checkpoint: the state that cannot be cut back (a sliding window, a
    recurrent state) after the first ``n_tokens`` tokens. ``key`` is the block chain's
    hash at that position: :func:`storage.block_hash.block_key` of the last full block's
    key (the fingerprint below one block) and the tokens after it."""

    key: bytes
    n_tokens: int
    nbytes: int


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`PrefixStore.verify` found: blocks checked, bad, and removed in all."""

    checked: int
    bad: int
    removed: int


class PrefixStore:
    """The KV prefix store in one SQLite file.

    Args:
        path: the ``kvcache.sqlite3`` file; created if missing.
        budget_bytes: the most payload bytes kept after any :meth:`put`.
        block_size: tokens per full block; part of every model fingerprint.

    Thread-safe (one connection behind a lock). Errors: a full disk raises
    :class:`StoreFull` (also a :class:`storage.errors.StorageFullError`) naming the
    folder and its free space; a locked or unwritable file :class:`StoreUnavailable`;
    a malformed file is replaced by an empty store and logged (``recovered_from``).
    """

    def __init__(
        self,
        path: Path | str,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        self.path = Path(path)
        self.budget_bytes = int(budget_bytes)
        self.block_size = int(block_size)
        self._lock = threading.RLock()
        self.recovered_from: str | None = None  # why the file was replaced, if it was
        self.files = BlockFiles(f"{self.path}-blocks")
        self._sync_scrub = False  # forget() forces its zeros to the disk
        self._doomed: list[bytes] = []  # keys whose rows are deleted in the open transaction
        self._db = self._open()
        self._reclaim()

    # -- connection and schema -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            db = self._connect()
            db.execute("SELECT count(*) FROM blocks").fetchone()
            return db
        except (sqlite3.DatabaseError, ValueError) as exc:
            if isinstance(exc, sqlite3.OperationalError):
                # Full, locked, read-only, I/O error: the file may well be valid. Never
                # delete it for that; run without the cache this time.
                raise self._unavailable(exc, "the KV cache is not used this time") from exc
            log.warning("prefix store %s is unreadable (%s); starting an empty one", self.path, exc)
            self.recovered_from = str(exc)
            self._remove_files()
            return self._connect()

    def _unavailable(self, exc: BaseException, consequence: str) -> "StoreUnavailable":
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
        if version not in (0, _BLOCKS_IN_TABLE, _SCHEMA_VERSION):
            db.close()
            log.info("prefix store %s has schema %s; starting a new one", self.path, version)
            self._remove_files()
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
        file, then drop the table, in one transaction. A crash midway leaves schema 3
        (the files written so far are rewritten next time)."""
        with _tx(db):
            if db.execute("PRAGMA user_version").fetchone()[0] == _BLOCKS_IN_TABLE:
                for key, data in db.execute(
                    "SELECT b.key, d.data FROM blocks b JOIN block_data d ON d.id = b.id"
                ):
                    self.files.write(key, data)
                db.execute("DROP TABLE block_data")
                db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        db.executescript("PRAGMA incremental_vacuum;")
        log.info("prefix store %s: block payloads moved to %s", self.path, self.files.folder)

    def _reclaim(self) -> None:
        """Remove block files without an index row (a write killed before its commit) and
        temporary files, under the write lock so no other process is between a file and
        its row. Best effort: a locked store is left as it is."""
        if not self.files.names():
            return
        try:
            with self._lock, self._tx():
                keep = {r[0].hex() for r in self._db.execute("SELECT key FROM blocks")}
                gone = self.files.reclaim(keep)
            if gone:
                log.info("prefix store: %d orphaned block files removed", gone)
        except sqlite3.Error as exc:
            log.warning("prefix store: orphaned block files not checked: %s", exc)

    @contextlib.contextmanager
    def _tx(self):
        """A transaction (``_tx``) after whose commit the files of deleted blocks are
        scrubbed; after a rollback they stay, as their rows do."""
        try:
            with _tx(self._db):
                yield
        except BaseException:
            if not self._db.in_transaction:
                self._doomed.clear()
            raise
        if not self._db.in_transaction:
            self._scrub_doomed()

    def _scrub_doomed(self) -> None:
        doomed, self._doomed = self._doomed, []
        self.files.scrub(doomed, sync=self._sync_scrub)

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{self.path}{suffix}")
        self.files.remove_all()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _guard(self):
        """Run under the lock and turn SQLite's failures into the store's own errors: a
        full disk is StoreFull, a busy or unwritable file StoreUnavailable, and a
        malformed file is replaced by an empty one (StoreReset)."""
        with self._lock:
            try:
                yield
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._unavailable(exc, "the KV cache could not be saved") from exc
                log.error("prefix store damaged (%s); replacing it with an empty one", exc)
                self.recovered_from = str(exc)
                self._reset_file()
                raise StoreReset(str(exc)) from exc

    def _reset_file(self) -> None:
        self._doomed.clear()
        with contextlib.suppress(Exception):
            self._db.close()
        self._remove_files()
        self._db = self._connect()

    # -- models ----------------------------------------------------------------------

    def register_model(self, fingerprint: bytes, layout: str, description: str) -> None:
        """Remember the KV layout (an opaque JSON string) of a fingerprint."""
        with self._guard(), self._tx():
            self._db.execute(
                "INSERT INTO models(fingerprint, layout, description, created_at) VALUES (?,?,?,?)"
                " ON CONFLICT(fingerprint) DO UPDATE SET layout=excluded.layout",
                (fingerprint, layout, description, time.time()),
            )

    def layout(self, fingerprint: bytes) -> str | None:
        """The layout JSON registered for ``fingerprint``, or None."""
        with self._guard():
            row = self._db.execute(
                "SELECT layout FROM models WHERE fingerprint=?", (fingerprint,)
            ).fetchone()
        return row[0] if row else None

    def cached_file_digest(self, path: str, stamp: str) -> str | None:
        """A model file's content digest computed earlier for this path and ``stamp`` (its
        size, mtime, ctime and inode: any write, copy or replacement changes one of them)."""
        with self._guard():
            row = self._db.execute(
                "SELECT digest FROM file_digests WHERE path=? AND stamp=?", (path, stamp)
            ).fetchone()
        return row[0] if row else None

    def remember_file_digest(self, path: str, stamp: str, digest: str) -> None:
        with self._guard(), self._tx():
            self._db.execute("DELETE FROM file_digests WHERE path=?", (path,))
            self._db.execute("INSERT INTO file_digests VALUES (?,?,?)", (path, stamp, digest))

    # -- lookup and read ---------------------------------------------------------------

    def lookup(
        self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray, *, count: bool = True
    ) -> PrefixMatch:
        """The longest stored prefix of ``tokens`` under ``fingerprint`` (token-granular).

        Walks the hash chain of full blocks, then takes the longest common prefix with
        the children (full and tail blocks) of the last block found. With ``count`` the
        lookup is added to the statistics and the matched blocks are marked as used.
        """
        arr = np.asarray(tokens, dtype=np.int32)
        B = self.block_size
        keys = chain_keys(fingerprint, arr, B)
        with self._guard():
            present = self._present(keys)
            blocks: list[BlockRef] = []
            for i, k in enumerate(keys):
                if k not in present:
                    break
                blocks.append(BlockRef(k, i * B, B, B))
            parent = blocks[-1].key if blocks else fingerprint
            pos = len(blocks) * B
            if pos < len(arr):
                best: BlockRef | None = None
                for key, n, tok in self._db.execute(
                    "SELECT key, n_tokens, tokens FROM blocks WHERE parent=?", (parent,)
                ):
                    cand = np.frombuffer(tok, dtype="<i4")
                    lcp = _common_prefix(cand, arr[pos : pos + n])
                    if lcp and (best is None or lcp > best.use):
                        best = BlockRef(key, pos, n, lcp)
                if best:
                    blocks.append(best)
            match = PrefixMatch(blocks)
            if count:
                try:
                    with self._tx():
                        self._bump(lookups=1, hits=int(bool(blocks)), misses=int(not blocks),
                                   tokens_queried=len(arr))
                        self._touch([b.key for b in blocks])
                except sqlite3.OperationalError as exc:  # full disk, lock: the match stands
                    log.warning("KV cache statistics not updated: %s", exc)
        return match

    def coverage(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> int:
        """How many leading ``tokens`` the store could restore (no statistics counted)."""
        return self.lookup(fingerprint, tokens, count=False).n_tokens

    def read(self, match: PrefixMatch) -> tuple[list[tuple[bytes, int, int]], int]:
        """Fetch and verify the payloads of ``match``.

        Returns ``(payloads, n_bad)``: ``payloads`` is ``[(payload, n_tokens, use)]``
        (``payload`` a read-only memoryview over the mapped block file) for
        the verified leading blocks, ready for ``engine.kv_codec.join``; reading stops at
        the first block that is missing or fails its checksum, and such a block is deleted
        with its descendants (``n_bad`` counts them).
        """
        out: list[tuple[memoryview, int, int]] = []
        bad = 0
        with self._guard():
            rows = self._rows([b.key for b in match.blocks])
            # No copy: the checksum runs over the mapped file, and the caller copies the
            # bytes once, into the state blob. The files are checked on two threads.
            mapped: list[tuple[BlockRef, memoryview, int]] = []
            broken = None  # a block whose file is missing or of the wrong size
            for ref in match.blocks:
                row = rows.get(ref.key)
                if row is None:
                    break
                data = self.files.map(ref.key)
                if data is None or len(data) != row[1] or len(data) % ref.n_tokens:
                    broken = ref
                    break
                mapped.append((ref, data, row[0]))
            sums = in_halves(lambda part: [checksum(d) for _, d, _ in part], mapped,
                             sum(len(d) for _, d, _ in mapped))
            for (ref, data, want), got in zip(mapped, sums):
                if got != want:
                    broken = ref
                    break
                out.append((data, ref.n_tokens, ref.use))
            if broken is not None:
                log.warning("KV block %s failed its checksum; dropping it", broken.key.hex()[:12])
                bad += self._delete_subtree(broken.key)
        return out, bad

    def _rows(self, keys: Sequence[bytes]) -> dict[bytes, tuple[int, int]]:
        """``{key: (checksum, nbytes)}`` of the stored ``keys`` (queried 500 at a time)."""
        rows: dict[bytes, tuple[int, int]] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            q = f"SELECT key, checksum, nbytes FROM blocks WHERE key IN ({','.join('?' * len(chunk))})"
            rows.update((k, (c, n)) for k, c, n in self._db.execute(q, chunk))
        return rows

    def record_restore(self, restored_tokens: int, prefilled_tokens: int) -> None:
        """Add a request's restored / prefilled token counts to the statistics."""
        with self._guard(), self._tx():
            self._bump(tokens_restored=restored_tokens, tokens_prefilled=prefilled_tokens)

    # -- write -----------------------------------------------------------------------

    def plan(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> tuple[list[NewBlock], list[bytes]]:
        """The blocks of ``tokens`` the store lacks, and the keys of the whole chain.

        Full blocks cover ``[0, n // B * B)``; a remainder becomes a tail block. Payloads
        are left empty: the caller cuts only these ranges out of the KV state.
        """
        arr = np.asarray(tokens, dtype=np.int32)
        B = self.block_size
        keys = chain_keys(fingerprint, arr, B)
        chain = list(keys)
        wanted: list[NewBlock] = []
        parent = fingerprint
        for i, k in enumerate(keys):
            wanted.append(NewBlock(k, parent, i * B, arr[i * B : (i + 1) * B]))
            parent = k
        rest = arr[len(keys) * B :]
        if len(rest):
            tail = block_key(parent, rest)
            wanted.append(NewBlock(tail, parent, len(keys) * B, rest))
            chain.append(tail)
        with self._guard():
            present = self._present(chain)
        return [b for b in wanted if b.key not in present], chain

    def put(
        self,
        fingerprint: bytes,
        blocks: Iterable[NewBlock],
        active_path: Sequence[bytes] = (),
    ) -> int:
        """Store ``blocks`` in one transaction, then evict to the budget.

        Each block the store lacks is made ready on one of two threads (storage.parallel):
        its payload is produced (when it is a callable, see :class:`NewBlock`),
        checksummed and written to its file while it is still in the CPU cache; the
        SQLite work stays on this thread. The files are written inside the transaction
        that inserts their rows, before it commits: a process killed before the commit
        leaves orphans (reclaimed at open), never a row without its payload.

        ``active_path`` are the keys of the conversation being served: they are marked
        as just used and are evicted only when nothing else is left. Returns the payload
        bytes written. Raises StorageFullError when the disk is full (nothing is written).
        """
        now = time.time()
        blocks = list(blocks)
        written = dropped = 0
        todo: list[NewBlock] = []
        with self._guard():
            try:
                with self._tx():  # BEGIN IMMEDIATE: no other writer until the commit
                    present = self._present([b.key for b in blocks])
                    todo = [b for b in blocks if b.key not in present]
                    size = sum(b.nbytes if callable(b.payload) else memoryview(b.payload).nbytes for b in todo)
                    ready = in_halves(lambda part: [self._write_block(b) for b in part], todo, size)
                    for b, (nbytes, value) in zip(todo, ready):
                        self._db.execute(
                            "INSERT INTO blocks(key, parent, fingerprint, start, n_tokens,"
                            " tokens, nbytes, checksum, n_children, last_access)"
                            " VALUES (?,?,?,?,?,?,?,?,0,?)",
                            (b.key, b.parent, fingerprint, b.start, b.n_tokens,
                             tokens_to_bytes(b.tokens), nbytes, value, now),
                        )
                        self._db.execute(
                            "UPDATE blocks SET n_children = n_children + 1 WHERE key=?", (b.parent,)
                        )
                        written += nbytes
                        dropped += self._drop_covered_tails(b)
                    self._touch(active_path, now)
            except BaseException:
                self.files.scrub(b.key for b in todo)  # rolled back: their rows are gone, so are they
                raise
            if not self._evict(set(active_path)) and dropped:
                self._vacuum()  # give the dropped tails' pages back (eviction does it otherwise)
        return written

    def _write_block(self, b: NewBlock) -> tuple[int, int]:
        """Produce, checksum and write the payload of ``b``; returns ``(bytes, checksum)``."""
        payload = b.payload() if callable(b.payload) else b.payload
        assert payload is not None
        value = checksum(payload)
        self._write_file(b.key, payload)
        return memoryview(payload).nbytes, value

    def _write_file(self, key: bytes, payload) -> None:
        try:
            self.files.write(key, payload)
        except OSError as exc:
            if is_disk_full(exc):
                raise StoreFull(disk_full_message(self.path.parent, "the KV cache could not be saved")) from exc
            raise StoreUnavailable(f"the KV cache block {self.files.path(key)} could not be written: {exc}") from exc

    def _drop_covered_tails(self, new: NewBlock) -> int:
        """Delete tails under ``new.parent`` whose tokens are a prefix of ``new``'s;
        returns how many blocks went."""
        rows = self._db.execute(
            "SELECT key, tokens FROM blocks WHERE parent=? AND n_tokens < ? AND key != ?",
            (new.parent, new.n_tokens, new.key),
        ).fetchall()
        n = 0
        for key, tok in rows:
            t = np.frombuffer(tok, dtype="<i4")
            if np.array_equal(t, new.tokens[: len(t)]):
                n += self._delete_subtree(key)
        return n

    # -- checkpoints -------------------------------------------------------------------
    # The part of a model's state that cannot be cut back to a shorter prefix (a sliding
    # window, a recurrent state) is stored whole at chosen positions. A checkpoint hangs
    # off the block chain: its anchor is the key of the last full block at or before its
    # position (the fingerprint below one block), and it keeps the tokens after that.

    def _checkpoint_key(self, fingerprint: bytes, tokens: np.ndarray) -> tuple[bytes, bytes, np.ndarray]:
        keys = chain_keys(fingerprint, tokens, self.block_size)
        anchor = keys[-1] if keys else fingerprint
        tail = tokens[len(keys) * self.block_size :]
        return block_key(anchor, tail), anchor, tail

    def has_checkpoint(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> bool:
        """Whether a checkpoint after exactly ``tokens`` is stored."""
        key, _, _ = self._checkpoint_key(fingerprint, np.asarray(tokens, dtype=np.int32))
        with self._guard():
            return self._db.execute("SELECT 1 FROM checkpoints WHERE key=?", (key,)).fetchone() is not None

    def put_checkpoint(
        self,
        fingerprint: bytes,
        tokens: Sequence[int] | np.ndarray,
        data: bytes | memoryview,
        active_path: Sequence[bytes] = (),
    ) -> tuple[bytes, int]:
        """Store the checkpoint taken after ``tokens``, then evict to the budget.

        Returns ``(key, payload bytes written)`` (0 when it was stored already). Raises
        StorageFullError when the disk is full (nothing is written).
        """
        arr = np.asarray(tokens, dtype=np.int32)
        key, anchor, tail = self._checkpoint_key(fingerprint, arr)
        now = time.time()
        with self._guard():
            with self._tx():
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO checkpoints(key, fingerprint, anchor, n_tokens, tail, nbytes,"
                    " checksum, last_access, data) VALUES (?,?,?,?,?,?,?,?,?)",
                    (key, fingerprint, anchor, len(arr), tokens_to_bytes(tail), len(data),
                     checksum(data), now, data),
                )
                written = len(data) if cur.rowcount else 0
                self._touch_checkpoints([key], now)
            self._evict({key, *active_path})
        return key, written

    def lookup_checkpoint(
        self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray, max_tokens: int | None = None,
        *, count: bool = True,
    ) -> CheckpointRef | None:
        """The deepest stored checkpoint after a prefix of ``tokens`` of at most
        ``max_tokens`` tokens (all of them by default), or None."""
        arr = np.asarray(tokens, dtype=np.int32)
        if max_tokens is not None:
            arr = arr[:max_tokens]
        B = self.block_size
        keys = chain_keys(fingerprint, arr, B)
        anchors = {fingerprint: 0, **{k: (i + 1) * B for i, k in enumerate(keys)}}
        best: CheckpointRef | None = None
        with self._guard():
            items = list(anchors)
            for i in range(0, len(items), 500):
                chunk = items[i : i + 500]
                for key, anchor, n, tail, nbytes in self._db.execute(
                    "SELECT key, anchor, n_tokens, tail, nbytes FROM checkpoints WHERE anchor IN"
                    f" ({','.join('?' * len(chunk))}) AND fingerprint=? AND n_tokens<=?",
                    (*chunk, fingerprint, len(arr)),
                ):
                    start = anchors[anchor]
                    t = np.frombuffer(tail, dtype="<i4")
                    if start + len(t) != n or not np.array_equal(t, arr[start:n]):
                        continue
                    if best is None or n > best.n_tokens:
                        best = CheckpointRef(key, n, nbytes)
            if best is not None and count:
                with self._tx():
                    self._touch_checkpoints([best.key])
        return best

    def read_checkpoint(self, ref: CheckpointRef) -> bytes | None:
        """The verified payload of ``ref``; None when it is gone or fails its checksum (it
        is then deleted)."""
        with self._guard():
            row = self._db.execute("SELECT id, checksum FROM checkpoints WHERE key=?", (ref.key,)).fetchone()
            if row is None:
                return None
            with self._db.blobopen("checkpoints", "data", row[0], readonly=True) as blob:
                data = blob.read()
            if checksum(data) != row[1] or len(data) != ref.nbytes:
                log.warning("checkpoint %s failed its checksum; dropping it", ref.key.hex()[:12])
                with self._tx():
                    self._db.execute("DELETE FROM checkpoints WHERE id=?", (row[0],))
                return None
        return data

    def _touch_checkpoints(self, keys: Sequence[bytes], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._db.executemany("UPDATE checkpoints SET last_access=? WHERE key=?", [(now, k) for k in keys])

    def _drop_checkpoints(self, anchors: Sequence[bytes]) -> None:
        """Checkpoints go with the block they hang off (eviction, a bad checksum)."""
        marks = ",".join("?" * len(anchors))
        self._db.execute(f"DELETE FROM checkpoints WHERE anchor IN ({marks})", list(anchors))

    # -- eviction --------------------------------------------------------------------

    def evict(self, protect: Iterable[bytes] = ()) -> int:
        """Evict down to the budget; returns the payload bytes freed."""
        with self._guard():
            return self._evict(set(protect))

    def _evict(self, protect: set[bytes]) -> int:
        """Evict leaves until the payload fits the budget and the file (plus WAL) fits the
        budget beyond the empty store's overhead; then give the free pages back."""
        freed = self._evict_payload_to(self.budget_bytes, protect)
        if freed:
            self._vacuum()
        for _ in range(64):  # each pass evicts at least the overshoot; blocks run out fast
            over = self.disk_bytes() - self.fixed_overhead_bytes() - self.budget_bytes
            total = self._total_bytes()
            if over <= 0 or total == 0:
                break
            more = self._evict_payload_to(max(0, total - over), protect)
            if not more:
                break
            freed += more
            self._vacuum()
        return freed

    def _evict_payload_to(self, target: int, protect: set[bytes]) -> int:
        """Delete leaves, least recently used first, the protected ones last, until the
        payload bytes are at most ``target``. Returns the payload bytes freed."""
        total = self._total_bytes()
        freed = 0
        while total > target:
            # Leaf blocks and checkpoints (with the bytes of the checkpoints a leaf takes along).
            leaves = self._db.execute(
                "SELECT b.key, b.nbytes + coalesce((SELECT sum(c.nbytes) FROM checkpoints c"
                " WHERE c.anchor = b.key), 0), b.last_access, 0, b.start FROM blocks b WHERE b.n_children = 0"
                " UNION ALL SELECT key, nbytes, last_access, 1, n_tokens FROM checkpoints ORDER BY 3, 5 DESC"
            ).fetchall()
            if not leaves:
                break
            # Unprotected leaves first, least recently used first; the active path last.
            order = [r for r in leaves if r[0] not in protect] or leaves
            with self._tx():
                for key, nbytes, _, is_checkpoint, _ in order:
                    if total <= target:
                        break
                    if is_checkpoint:
                        self._db.execute("DELETE FROM checkpoints WHERE key=?", (key,))
                        self._bump(evicted_checkpoints=1, evicted_bytes=nbytes)
                    else:
                        self._delete_subtree(key)
                        self._bump(evicted_blocks=1, evicted_bytes=nbytes)
                    total -= nbytes
                    freed += nbytes
        return freed

    def _vacuum(self) -> None:
        """Return every free page to the file system (outside any transaction).

        ``PRAGMA incremental_vacuum`` frees one page per step of the statement. The
        sqlite3 module steps a statement without result columns once, so ``execute``
        (even with ``fetchall``) frees a single page: measured here, 259 free pages
        became 258. ``executescript`` steps each statement to the end."""
        assert not self._db.in_transaction
        self._db.executescript("PRAGMA incremental_vacuum;")

    def disk_bytes(self) -> int:
        """Bytes the cache takes on disk: the index file, its WAL and rollback journal, and
        the block files."""
        total = self._db.execute("SELECT coalesce(sum(nbytes), 0) FROM blocks").fetchone()[0]
        for suffix in ("", "-wal", "-journal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(f"{self.path}{suffix}")
        return total

    def fixed_overhead_bytes(self) -> int:
        """The size of this store when empty: page 1, a root page per table and index,
        and the pointer-map pages of auto-vacuum (one per page_size/5 pages;
        https://sqlite.org/fileformat2.html#pointer_map_or_ptrmap_pages)."""
        page_size = self._db.execute("PRAGMA page_size").fetchone()[0]
        roots = self._db.execute(
            "SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()[0]
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        ptrmaps = -(-pages // (page_size // 5))
        return page_size * (1 + roots + ptrmaps)

    def _delete_subtree(self, key: bytes) -> int:
        """Delete a block and every block below it; returns how many were deleted."""
        keys = [
            r[0]
            for r in self._db.execute(
                "WITH RECURSIVE sub(key) AS (SELECT ? UNION"
                " SELECT b.key FROM blocks b JOIN sub ON b.parent = sub.key) SELECT key FROM sub",
                (key,),
            )
        ]
        row = self._db.execute("SELECT parent FROM blocks WHERE key=?", (key,)).fetchone()
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            self._db.execute(f"DELETE FROM blocks WHERE key IN ({marks})", chunk)
            self._drop_checkpoints(chunk)
        # The files go after the commit (a row never outlives its file); killed in
        # between, they are orphans, scrubbed at the next open.
        self._doomed.extend(keys)
        if not self._db.in_transaction:
            self._scrub_doomed()
        if row:
            self._db.execute(
                "UPDATE blocks SET n_children = n_children - 1 WHERE key=?", (row[0],)
            )
        return len(keys) if row else 0

    # -- deletion --------------------------------------------------------------------

    def fingerprints(self) -> list[bytes]:
        """Every model fingerprint that has blocks in the store."""
        with self._guard():
            return [r[0] for r in self._db.execute(
                "SELECT DISTINCT fingerprint FROM blocks")]

    def forget(
        self,
        forget: Iterable[Sequence[int] | np.ndarray],
        keep: Iterable[Sequence[int] | np.ndarray] = (),
        fingerprints: Iterable[bytes] | None = None,
    ) -> int:
        """Delete the blocks holding ``forget``'s token sequences that ``keep`` does not use.

        For each fingerprint (default: every one in the store; the same tokens under
        another KV type or flash-attention setting of one model have other keys), each
        sequence of ``forget`` is matched like a lookup (full blocks, then the child
        with the longest common prefix), counting only blocks whose every token is in
        the sequence (a block that merely starts the same way, such as another chat
        after a shared system prompt, is someone else's); the first such block that no
        sequence of ``keep`` passes through whole is deleted with everything below it.
        A block a kept sequence uses only in part goes too (privacy over a few tokens
        of prefill). Blocks ``keep`` uses stay: they
        are shared with what is kept. Then free pages are zeroed (secure_delete) and
        returned to the file system. Returns the number of blocks deleted.

        Shapes: sequences of int32 token ids. Raises StoreFull / StoreUnavailable.
        """
        forget = [np.asarray(t, dtype=np.int32) for t in forget]
        keep = [np.asarray(t, dtype=np.int32) for t in keep]
        deleted = 0
        with self._guard():
            self._sync_scrub = True
            try:
                deleted = self._forget(forget, keep, fingerprints)
            finally:
                self._sync_scrub = False
            if deleted:
                self._vacuum()
        return deleted

    def _forget(self, forget: list[np.ndarray], keep: list[np.ndarray],
                fingerprints: Iterable[bytes] | None) -> int:
        deleted = 0
        for fp in (self.fingerprints() if fingerprints is None else list(fingerprints)):
            kept: set[bytes] = set()
            for tokens in keep:  # a block kept text uses only in part may hold ours
                kept.update(b.key for b in self.lookup(fp, tokens, count=False).blocks
                            if b.use == b.n_tokens)
            with self._tx():
                for tokens in forget:
                    for ref in self.lookup(fp, tokens, count=False).blocks:
                        if ref.use < ref.n_tokens:
                            break  # a block that only starts like ours holds other text
                        if ref.key not in kept:
                            deleted += self._delete_subtree(ref.key)
                            break
        return deleted

    # -- maintenance -----------------------------------------------------------------

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every block's checksum; remove bad blocks with their descendants."""
        with self._guard():
            ids = self._db.execute("SELECT id, key FROM blocks ORDER BY id").fetchall()
            bad_keys = []
            for i, (rowid, key) in enumerate(ids):
                row = self._db.execute("SELECT checksum, nbytes FROM blocks WHERE id=?", (rowid,)).fetchone()
                if row is None:
                    continue
                data = self.files.map(key, cache=False)
                if data is None or len(data) != row[1] or checksum(data) != row[0]:
                    bad_keys.append(key)
                del data
                if progress:
                    progress(i + 1, len(ids))
            removed = 0
            with self._tx():
                for key in bad_keys:
                    removed += self._delete_subtree(key)
                for rowid, want, data in self._db.execute("SELECT id, checksum, data FROM checkpoints").fetchall():
                    if checksum(data) != want:
                        log.warning("dropping a checkpoint that failed its checksum")
                        self._db.execute("DELETE FROM checkpoints WHERE id=?", (rowid,))
                for fp, layout in self._db.execute("SELECT fingerprint, layout FROM models").fetchall():
                    try:
                        json.loads(layout)
                    except ValueError:  # a damaged layout: its blocks cannot be joined
                        log.warning("dropping the KV layout of %s: it is damaged", fp.hex()[:12])
                        self._db.execute("DELETE FROM models WHERE fingerprint=?", (fp,))
            if removed:
                self._vacuum()
        return VerifyReport(len(ids), len(bad_keys), removed)

    def clear(self) -> None:
        """Empty the store (blocks, checkpoints, layouts, digests and counters go) in place,
        in one transaction: another process that has it open (the window, ``serve``) keeps
        a working store and simply finds nothing. A damaged file is replaced instead."""
        with self._guard():
            with self._tx():
                self._doomed.extend(r[0] for r in self._db.execute("SELECT key FROM blocks"))
                for table in ("blocks", "checkpoints", "models", "counters", "file_digests"):
                    self._db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed names
            self._vacuum()

    def stats(self) -> dict:
        """Counters and sizes: lookups, hits, misses, tokens_restored, tokens_prefilled,
        blocks, tail_blocks, tokens, bytes (block payload), checkpoints, checkpoint_bytes
        (their payload; blocks and checkpoints together are kept under budget_bytes),
        evicted_blocks, evicted_checkpoints, evicted_bytes, file_bytes (file + WAL +
        journal on disk), overhead_bytes (an empty store's size, not counted against the
        budget), budget_bytes, models. Sizes are in bytes."""
        with self._guard():
            out = {name: value for name, value in self._db.execute("SELECT name, value FROM counters")}
            blocks, tails, tokens, nbytes = self._db.execute(
                "SELECT count(*), coalesce(sum(n_tokens < ?), 0), coalesce(sum(n_tokens), 0),"
                " coalesce(sum(nbytes), 0) FROM blocks",
                (self.block_size,),
            ).fetchone()
            models = self._db.execute("SELECT count(*) FROM models").fetchone()[0]
            overhead = self.fixed_overhead_bytes()
            checkpoints, checkpoint_bytes = self._db.execute(
                "SELECT count(*), coalesce(sum(nbytes), 0) FROM checkpoints"
            ).fetchone()
        file_bytes = self.disk_bytes()
        for name in ("lookups", "hits", "misses", "tokens_queried", "tokens_restored",
                     "tokens_prefilled", "evicted_blocks", "evicted_checkpoints", "evicted_bytes"):
            out.setdefault(name, 0)
        out.update(blocks=blocks, tail_blocks=tails, tokens=tokens, bytes=nbytes,
                   file_bytes=file_bytes, overhead_bytes=overhead, budget_bytes=self.budget_bytes,
                   block_size=self.block_size, models=models,
                   checkpoints=checkpoints, checkpoint_bytes=checkpoint_bytes)
        return out

    # -- helpers ---------------------------------------------------------------------

    def _present(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` the store holds."""
        return set(self._rows(keys))

    def _total_bytes(self) -> int:
        """Payload bytes held: blocks and checkpoints (both count against the budget)."""
        return self._db.execute(
            "SELECT (SELECT coalesce(sum(nbytes), 0) FROM blocks)"
            " + (SELECT coalesce(sum(nbytes), 0) FROM checkpoints)"
        ).fetchone()[0]

    def _touch(self, keys: Sequence[bytes], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._db.executemany(
            "UPDATE blocks SET last_access=? WHERE key=?", [(now, k) for k in keys]
        )

    def _bump(self, **deltas: int) -> None:
        self._db.executemany(
            "INSERT INTO counters(name, value) VALUES (?, ?)"
            " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            list(deltas.items()),
        )


class StoreError(StorageError, RuntimeError):
    """The store could not serve a request; the caller goes on without it (prefill).

    A ``StorageError`` (storage/errors.py), so a caller catches one family for both databases."""


class StoreReset(StoreError):
    """The store file was damaged beyond its checksums and has been replaced by an empty one."""


class StoreUnavailable(StoreError):
    """The store file is locked by another process, unwritable, or otherwise unusable now."""


class StoreFull(StoreUnavailable, StorageFullError):
    """The disk holding the store is full: nothing was written, the file is intact.

    The message names the folder and its free space. It is both a StoreError (the
    engine goes on without the cache) and a StorageFullError."""


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


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


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
    last_access REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_anchor ON checkpoints(anchor);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS file_digests(
    path TEXT PRIMARY KEY, stamp TEXT NOT NULL, digest TEXT NOT NULL
);
"""

__all__ = [
    "BlockRef", "CheckpointRef", "NewBlock", "PrefixMatch", "PrefixStore", "StoreError", "StoreFull", "StoreReset",
    "StoreUnavailable", "VerifyReport",
    "checksum", "tokens_from_bytes", "DEFAULT_BLOCK_SIZE", "DEFAULT_BUDGET_BYTES",
]
