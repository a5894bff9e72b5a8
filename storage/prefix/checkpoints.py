"""Checkpoints: the part of a model's state that cannot be cut back to a shorter prefix (a
sliding window, a recurrent state), stored whole at chosen positions.

A checkpoint hangs off the block chain: its anchor is the key of the last full block at or
before its position (the fingerprint below one block), and it keeps the tokens after that.
It goes with the block it hangs off, and counts against the store's budget.

Payloads are files, like blocks (one regime for both): ``kvcache.sqlite3-checkpoints/``,
one file per checkpoint named by its key, written under a temporary name and renamed
inside the transaction that inserts its row, verified against the row's xxh3 checksum and
size on every read, zeroed before it is unlinked after the commit that deleted its row,
and reclaimed at open when no row names it. Until schema 5 they were BLOBs in
``checkpoints.data`` (migrated at open: :meth:`storage.prefix.index.Index._migrate_v4`).

Measured before the move, on this project's machine (2 shared cores, other jobs running,
so noisy), with a real checkpoint of Gemma 3 270M Q4_K_M after a 630-token prompt
(7,870,840 bytes, as ``tests/test_checkpoints.py`` makes them), 7 runs each, medians of
two rounds: writing took 30-64 ms as a BLOB (``put_checkpoint``, min 21 ms) and 18-21 ms
as a file (min 10 ms); reading and verifying took 11 ms either way (file: map, xxh3 over
the page cache, one copy; BLOB: ``blobopen`` read, xxh3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from storage.block_hash import block_key, chain_keys, tokens_to_bytes
from storage.prefix.index import Index
from storage.prefix.records import CheckpointRef, checksum

log = logging.getLogger("storage.prefix_store")


class Checkpoints:
    """The checkpoint rows and files of one store (``PrefixStore.checkpoints``).

    Args:
        index: the store's :class:`Index`.
        block_size: tokens per full block (a checkpoint's anchor is a block key).

    Errors: StoreFull / StoreUnavailable / StoreReset from the index.
    """

    def __init__(self, index: Index, block_size: int):
        self.ix = index
        self.block_size = block_size

    def key(self, fingerprint: bytes, tokens: np.ndarray) -> tuple[bytes, bytes, np.ndarray]:
        """``(key, anchor, tail)`` of the checkpoint after ``tokens`` (int32)."""
        keys = chain_keys(fingerprint, tokens, self.block_size)
        anchor = keys[-1] if keys else fingerprint
        tail = tokens[len(keys) * self.block_size :]
        return block_key(anchor, tail), anchor, tail

    def has(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> bool:
        """Whether a checkpoint after exactly ``tokens`` is stored."""
        key, _, _ = self.key(fingerprint, np.asarray(tokens, dtype=np.int32))
        with self.ix.guard():
            return self.ix.db.execute("SELECT 1 FROM checkpoints WHERE key=?", (key,)).fetchone() is not None

    def put(
        self,
        fingerprint: bytes,
        tokens: Sequence[int] | np.ndarray,
        data: bytes | memoryview,
    ) -> tuple[bytes, int]:
        """Store the checkpoint taken after ``tokens`` (``PrefixStore.put_checkpoint`` then
        evicts to the budget). Its file is written inside the transaction that inserts its
        row, before the commit, as a block's is; rolled back, the file goes too.

        Returns ``(key, payload bytes written)`` (0 when it was stored already). Raises
        StorageFullError when the disk is full (nothing is written).
        """
        arr = np.asarray(tokens, dtype=np.int32)
        key, anchor, tail = self.key(fingerprint, arr)
        now = time.time()
        nbytes = memoryview(data).nbytes
        wrote = False
        with self.ix.guard():
            try:
                with self.ix.tx():
                    stored = self.ix.db.execute("SELECT 1 FROM checkpoints WHERE key=?", (key,)).fetchone()
                    if stored is None:
                        value = checksum(data)
                        self.ix.write_payload(self.ix.checkpoint_files, key, data)
                        wrote = True
                        self.ix.db.execute(
                            "INSERT INTO checkpoints(key, fingerprint, anchor, n_tokens, tail, nbytes,"
                            " checksum, last_access) VALUES (?,?,?,?,?,?,?,?)",
                            (key, fingerprint, anchor, len(arr), tokens_to_bytes(tail), nbytes, value, now),
                        )
                    self.touch([key], now)
            except BaseException:
                if wrote:  # rolled back: the row is gone, so is its file
                    self.ix.checkpoint_files.scrub([key])
                raise
        return key, nbytes if stored is None else 0

    def lookup(
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
        with self.ix.guard():
            items = list(anchors)
            for i in range(0, len(items), 500):
                chunk = items[i : i + 500]
                for key, anchor, n, tail, nbytes in self.ix.db.execute(
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
                with self.ix.tx():
                    self.touch([best.key])
        return best

    def read(self, ref: CheckpointRef) -> bytes | None:
        """The verified payload of ``ref`` (a copy of its mapped file); None when it is gone,
        of the wrong size or fails its checksum (it is then deleted, file and row)."""
        with self.ix.guard():
            row = self.ix.db.execute("SELECT checksum, nbytes FROM checkpoints WHERE key=?", (ref.key,)).fetchone()
            if row is None:
                return None
            mapped = self.ix.checkpoint_files.map(ref.key, cache=False)
            good = (mapped is not None and len(mapped) == row[1] == ref.nbytes
                    and checksum(mapped) == row[0])
            data = bytes(mapped) if good else None
            del mapped
            if data is None:
                log.warning("checkpoint %s failed its checksum; dropping it", ref.key.hex()[:12])
                with self.ix.tx():
                    self.delete([ref.key])
        return data

    def touch(self, keys: Sequence[bytes], now: float | None = None) -> None:
        """Mark checkpoints as used at ``now`` (seconds; default: now)."""
        now = time.time() if now is None else now
        self.ix.db.executemany("UPDATE checkpoints SET last_access=? WHERE key=?", [(now, k) for k in keys])

    def drop(self, anchors: Sequence[bytes]) -> None:
        """Checkpoints go with the block they hang off (eviction, a bad checksum). The
        caller holds a transaction; the files go after its commit."""
        marks = ",".join("?" * len(anchors))
        keys = [r[0] for r in self.ix.db.execute(
            f"SELECT key FROM checkpoints WHERE anchor IN ({marks})", list(anchors))]
        if keys:
            self.delete(keys)

    def delete(self, keys: Sequence[bytes]) -> None:
        """Delete the rows of ``keys``; their files are zeroed and unlinked after the
        commit of the caller's transaction (a row never outlives its file)."""
        self.ix.db.executemany("DELETE FROM checkpoints WHERE key=?", [(k,) for k in keys])
        self.ix.doomed_checkpoints.extend(keys)
        if not self.ix.db.in_transaction:
            self.ix.scrub_doomed()
