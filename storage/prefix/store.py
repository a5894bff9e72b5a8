"""The prefix store: token-aligned KV blocks, content-addressed and indexed in SQLite.

``kvcache.sqlite3`` (the index: keys, tokens, checksums) and the folders
``kvcache.sqlite3-blocks/`` and ``kvcache.sqlite3-checkpoints/`` (one file per payload,
:mod:`storage.block_files`) are disposable (deleting them only costs prefill time) and
bounded by a byte budget. The index is the source of truth: a file without a row is an
orphan, reclaimed at open. It knows nothing of llama.cpp: a block is an opaque payload
plus the token ids it covers.

:class:`PrefixStore` is the public face; each job is a part in its own module:

* :mod:`storage.prefix.index`: the SQLite file, schema and migrations, transactions, and
  SQLite's failures as the store's errors;
* :mod:`storage.prefix.blocks`: lookup (the hash chain, then the longest common prefix
  among the last match's children: token-granular), read and verify, plan and write;
* :mod:`storage.prefix.checkpoints`: the states that cannot be cut back, stored whole;
* :mod:`storage.prefix.eviction`: the named policy (least recently used leaves first, the
  active path last) that keeps the store within its budget after every write;
* :mod:`storage.prefix.maintenance`: orphan reclaim, verify, forget, clear;
* :mod:`storage.prefix.digests`: the model-file digest cache;
* :mod:`storage.prefix.records`: the records and errors.

Faults: only a file SQLite reports as damaged (SQLITE_CORRUPT, SQLITE_NOTADB) is ever
replaced. A full disk, a lock or an I/O error leaves the file alone and raises
:class:`StoreFull` or :class:`StoreUnavailable` (both :class:`StoreError`), which the
engine treats as "no cache this time"; statistics and last-use stamps written by a
lookup are best effort and never fail it.

Budget: ``budget_bytes`` bounds what the cache takes on disk (the index file, its
journal and the payload files), beyond the fixed size of an empty store (its schema
pages, a few hundred KB at 64 KB pages). After an eviction ``PRAGMA incremental_vacuum``
returns every free page to the file system, so the file shrinks with its contents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from storage.prefix.blocks import Blocks
from storage.prefix.checkpoints import Checkpoints
from storage.prefix.digests import FileDigests
from storage.prefix.eviction import Eviction
from storage.prefix.index import Index
from storage.prefix.maintenance import Maintenance
from storage.prefix.records import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_BUDGET_BYTES,
    CheckpointRef,
    MappedBlocks,
    NewBlock,
    PrefixMatch,
    VerifyReport,
)


class PrefixStore:
    """The KV prefix store in one SQLite index and two folders of payload files.

    Args:
        path: the ``kvcache.sqlite3`` file; created if missing.
        budget_bytes: the most payload bytes kept after any :meth:`put`.
        block_size: tokens per full block; part of every model fingerprint.

    Parts (public): ``index``, ``blocks``, ``checkpoints``, ``eviction``,
    ``maintenance``, ``digests`` (see the module docstring); ``files`` is the block folder.

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
        self.index = self.ix = Index(self.path)
        self.files = self.ix.files
        self.checkpoints = Checkpoints(self.ix, self.block_size)
        self.blocks = Blocks(self.ix, self.block_size, self.checkpoints)
        self.eviction = Eviction(self.ix, self.blocks, self.checkpoints)
        self.maintenance = Maintenance(self.ix, self.blocks, self.checkpoints)
        self.digests = FileDigests(self.ix)
        self.maintenance.reclaim()

    @property
    def recovered_from(self) -> str | None:
        """Why the index file was replaced by an empty one (SQLite's words), or None."""
        return self.ix.recovered_from

    def close(self) -> None:
        """Close the index; the store cannot be used afterwards."""
        self.ix.close()

    # -- models ----------------------------------------------------------------------

    def register_model(self, fingerprint: bytes, layout: str, description: str) -> None:
        """Remember the KV layout (an opaque JSON string) of a fingerprint."""
        with self.ix.guard(), self.ix.tx():
            self.ix.db.execute(
                "INSERT INTO models(fingerprint, layout, description, created_at) VALUES (?,?,?,?)"
                " ON CONFLICT(fingerprint) DO UPDATE SET layout=excluded.layout",
                (fingerprint, layout, description, time.time()),
            )

    def layout(self, fingerprint: bytes) -> str | None:
        """The layout JSON registered for ``fingerprint``, or None."""
        with self.ix.guard():
            row = self.ix.db.execute(
                "SELECT layout FROM models WHERE fingerprint=?", (fingerprint,)
            ).fetchone()
        return row[0] if row else None

    # -- blocks ----------------------------------------------------------------------

    def lookup(
        self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray, *, count: bool = True
    ) -> PrefixMatch:
        """The longest stored prefix of ``tokens`` (int32 ids) under ``fingerprint``,
        token-granular (:meth:`Blocks.lookup`); ``count`` adds it to the statistics and
        marks the matched blocks as used."""
        return self.blocks.lookup(fingerprint, tokens, count=count)

    def coverage(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> int:
        """How many leading ``tokens`` the store could restore (no statistics counted)."""
        return self.blocks.coverage(fingerprint, tokens)

    def read(self, match: PrefixMatch) -> tuple[list[tuple[memoryview, int, int]], int]:
        """``([(payload, n_tokens, use)], n_bad)``: the verified leading payloads of
        ``match`` as read-only views of the mapped files (:meth:`Blocks.read`); a bad block
        is deleted with its descendants and counted in ``n_bad``."""
        return self.blocks.read(match)

    def map_blocks(self, match: PrefixMatch) -> MappedBlocks:
        """The payload files of ``match`` mapped but not yet verified, for a restore that
        checks each block as it copies it (:meth:`Blocks.map_match`); give a block that
        fails :meth:`MappedBlocks.check` to :meth:`reject`."""
        return self.blocks.map_match(match)

    def reject(self, mapped: MappedBlocks, i: int) -> int:
        """Delete block ``i`` of ``mapped`` (it failed its checksum) with its descendants;
        returns how many blocks went."""
        return self.blocks.reject(mapped, i)

    def record_restore(self, restored_tokens: int, prefilled_tokens: int) -> None:
        """Add a request's restored / prefilled token counts to the statistics."""
        self.blocks.record_restore(restored_tokens, prefilled_tokens)

    def plan(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> tuple[list[NewBlock], list[bytes]]:
        """``(missing blocks, chain keys)`` of ``tokens`` (:meth:`Blocks.plan`): the blocks
        the store lacks, payloads left empty for the caller to cut."""
        return self.blocks.plan(fingerprint, tokens)

    def put(
        self,
        fingerprint: bytes,
        blocks: Iterable[NewBlock],
        active_path: Sequence[bytes] = (),
    ) -> int:
        """Store ``blocks`` in one transaction (:meth:`Blocks.put`), then evict to the
        budget, ``active_path`` (keys) last. Returns the payload bytes written. Raises
        StorageFullError when the disk is full (nothing is written)."""
        with self.ix.guard():
            written, dropped = self.blocks.put(fingerprint, blocks, active_path)
            if not self.eviction.evict(self.budget_bytes, set(active_path)) and dropped:
                self.ix.vacuum()  # give the dropped tails' pages back (eviction does it otherwise)
        return written

    # -- checkpoints -----------------------------------------------------------------

    def has_checkpoint(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> bool:
        """Whether a checkpoint after exactly ``tokens`` is stored."""
        return self.checkpoints.has(fingerprint, tokens)

    def put_checkpoint(
        self,
        fingerprint: bytes,
        tokens: Sequence[int] | np.ndarray,
        data: bytes | memoryview,
        active_path: Sequence[bytes] = (),
    ) -> tuple[bytes, int]:
        """Store the checkpoint taken after ``tokens`` (:meth:`Checkpoints.put`), then evict
        to the budget, it and ``active_path`` last. Returns ``(key, payload bytes
        written)`` (0 when it was stored already). Raises StorageFullError when the disk
        is full (nothing is written)."""
        with self.ix.guard():
            key, written = self.checkpoints.put(fingerprint, tokens, data)
            self.eviction.evict(self.budget_bytes, {key, *active_path})
        return key, written

    def lookup_checkpoint(
        self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray, max_tokens: int | None = None,
        *, count: bool = True,
    ) -> CheckpointRef | None:
        """The deepest stored checkpoint after a prefix of ``tokens`` of at most
        ``max_tokens`` tokens (all of them by default), or None."""
        return self.checkpoints.lookup(fingerprint, tokens, max_tokens, count=count)

    def read_checkpoint(self, ref: CheckpointRef) -> bytes | None:
        """The verified payload of ``ref``; None when it is gone or fails its checksum (it
        is then deleted)."""
        return self.checkpoints.read(ref)

    # -- eviction and maintenance ----------------------------------------------------

    def evict(self, protect: Iterable[bytes] = ()) -> int:
        """Evict down to the budget, ``protect`` (keys) last; returns the payload bytes freed."""
        with self.ix.guard():
            return self.eviction.evict(self.budget_bytes, set(protect))

    def fingerprints(self) -> list[bytes]:
        """Every model fingerprint that has blocks in the store."""
        return self.maintenance.fingerprints()

    def forget(
        self,
        forget: Iterable[Sequence[int] | np.ndarray],
        keep: Iterable[Sequence[int] | np.ndarray] = (),
        fingerprints: Iterable[bytes] | None = None,
    ) -> int:
        """Delete the blocks holding ``forget``'s token sequences that ``keep`` does not use
        (:meth:`Maintenance.forget`), zeros forced to the disk. Returns the number of
        blocks deleted. Raises StoreFull / StoreUnavailable."""
        return self.maintenance.forget(forget, keep, fingerprints)

    def forget_models(self, fingerprints: Iterable[bytes]) -> int:
        """Delete every block and checkpoint of the models ``fingerprints`` name (32-byte
        root keys, ``engine.fingerprint.fingerprint``), zeros forced to the disk
        (:meth:`Maintenance.forget_models`). Returns the number of blocks deleted.
        Raises StoreFull / StoreUnavailable."""
        return self.maintenance.forget_models(fingerprints)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every checksum; remove bad blocks with their descendants, bad checkpoints
        and damaged layouts (:meth:`Maintenance.verify`)."""
        return self.maintenance.verify(progress)

    def clear(self) -> None:
        """Empty the store in place, in one transaction (:meth:`Maintenance.clear`)."""
        self.maintenance.clear()

    def stats(self) -> dict:
        """Counters and sizes: lookups, hits, misses, tokens_restored, tokens_prefilled,
        blocks, tail_blocks, tokens, bytes (block payload), checkpoints, checkpoint_bytes
        (their payload; blocks and checkpoints together are kept under budget_bytes),
        evicted_blocks, evicted_checkpoints, evicted_bytes, file_bytes (file + WAL +
        journal on disk), overhead_bytes (an empty store's size, not counted against the
        budget), budget_bytes, models. Sizes are in bytes."""
        with self.ix.guard():
            out = {name: value for name, value in self.ix.db.execute("SELECT name, value FROM counters")}
            blocks, tails, tokens, nbytes = self.ix.db.execute(
                "SELECT count(*), coalesce(sum(n_tokens < ?), 0), coalesce(sum(n_tokens), 0),"
                " coalesce(sum(nbytes), 0) FROM blocks",
                (self.block_size,),
            ).fetchone()
            models = self.ix.db.execute("SELECT count(*) FROM models").fetchone()[0]
            overhead = self.ix.fixed_overhead_bytes()
            checkpoints, checkpoint_bytes = self.ix.db.execute(
                "SELECT count(*), coalesce(sum(nbytes), 0) FROM checkpoints"
            ).fetchone()
        file_bytes = self.ix.disk_bytes()
        for name in ("lookups", "hits", "misses", "tokens_queried", "tokens_restored",
                     "tokens_prefilled", "evicted_blocks", "evicted_checkpoints", "evicted_bytes"):
            out.setdefault(name, 0)
        out.update(blocks=blocks, tail_blocks=tails, tokens=tokens, bytes=nbytes,
                   file_bytes=file_bytes, overhead_bytes=overhead, budget_bytes=self.budget_bytes,
                   block_size=self.block_size, models=models,
                   checkpoints=checkpoints, checkpoint_bytes=checkpoint_bytes)
        return out
