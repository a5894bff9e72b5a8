"""The blocks of the prefix store: finding the longest stored prefix of a token sequence,
reading and verifying its payloads, planning and writing new blocks, and deleting a block
with everything below it.

Keys chain from the model fingerprint (:mod:`storage.block_hash`), so blocks are shared by
every branch with the same token prefix and never across models. A lookup walks the chain
of full blocks, then takes the longest common prefix among the children of the last match
(full blocks and tails), so a match is token-granular. Every payload carries an xxh3-64
checksum, verified over the mapped file (no copy): by :meth:`Blocks.read`, or for a
restore by the copy into the state, block by block (:meth:`Blocks.map_match`); a bad or
missing block is deleted with its descendants and the match stops before it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from storage.block_hash import block_key, chain_keys, tokens_to_bytes
from storage.parallel import in_halves
from storage.prefix.checkpoints import Checkpoints
from storage.prefix.index import Index
from storage.prefix.records import BlockRef, MappedBlocks, NewBlock, PrefixMatch, checksum

log = logging.getLogger("storage.prefix_store")


class Blocks:
    """The block rows and files of one store (``PrefixStore.blocks``).

    Args:
        index: the store's :class:`Index` (its lock is held by every method).
        block_size: tokens per full block.
        checkpoints: the checkpoints, which go with the block they hang off.

    Errors: StoreFull / StoreUnavailable / StoreReset from the index (see there).
    """

    def __init__(self, index: Index, block_size: int, checkpoints: Checkpoints):
        self.ix = index
        self.block_size = block_size
        self.checkpoints = checkpoints

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
        with self.ix.guard():
            present = self.present(keys)
            blocks: list[BlockRef] = []
            for i, k in enumerate(keys):
                if k not in present:
                    break
                blocks.append(BlockRef(k, i * B, B, B))
            parent = blocks[-1].key if blocks else fingerprint
            pos = len(blocks) * B
            if pos < len(arr):
                best: BlockRef | None = None
                for key, n, tok in self.ix.db.execute(
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
                    with self.ix.tx():
                        self.ix.bump(lookups=1, hits=int(bool(blocks)), misses=int(not blocks),
                                   tokens_queried=len(arr))
                        self.touch([b.key for b in blocks])
                except sqlite3.OperationalError as exc:  # full disk, lock: the match stands
                    log.warning("KV cache statistics not updated: %s", exc)
        return match

    def coverage(self, fingerprint: bytes, tokens: Sequence[int] | np.ndarray) -> int:
        """How many leading ``tokens`` the store could restore (no statistics counted)."""
        return self.lookup(fingerprint, tokens, count=False).n_tokens

    def read(self, match: PrefixMatch) -> tuple[list[tuple[memoryview, int, int]], int]:
        """Fetch and verify the payloads of ``match``.

        Returns ``(payloads, n_bad)``: ``payloads`` is ``[(payload, n_tokens, use)]``
        (``payload`` a read-only memoryview over the mapped block file) for
        the verified leading blocks, ready for ``engine.kv_codec.join``; reading stops at
        the first block that is missing or fails its checksum, and such a block is deleted
        with its descendants (``n_bad`` counts them). A restore does better with
        :meth:`map_match` and a checked copy (each block verified just before it is copied,
        while it is in the CPU cache); this checks every file first, on two threads.
        """
        mapped = self.map_match(match)
        ok = in_halves(lambda part: [mapped.check(i, d) for i, (d, _, _) in part],
                       list(enumerate(mapped.payloads)), mapped.nbytes)
        good = ok.index(False) if False in ok else len(ok)
        bad = mapped.n_bad
        if good < len(ok):
            bad += self.reject(mapped, good)
        return mapped.payloads[:good], bad

    def map_match(self, match: PrefixMatch) -> MappedBlocks:
        """Map the payload files of ``match`` without reading them (no checksum yet).

        The files not mapped already are first given to the kernel's read-ahead
        (``BlockFiles.prefetch``), so on a cold page cache they are read in parallel while
        the first ones are mapped. Mapping stops at the first block whose row or file is
        missing or whose file has the wrong size; such a block is deleted with its
        descendants (``n_bad``). The caller checks every payload with
        :meth:`MappedBlocks.check` before llama.cpp may see it, and gives a failed one to
        :meth:`reject`.
        """
        out = MappedBlocks()
        with self.ix.guard():
            rows = self.rows([b.key for b in match.blocks])
            self.ix.files.prefetch([b.key for b in match.blocks if b.key in rows])
            broken = None  # a block whose file is missing or of the wrong size
            for ref in match.blocks:
                row = rows.get(ref.key)
                if row is None:
                    break
                data = self.ix.files.map(ref.key)
                if data is None or len(data) != row[1] or len(data) % ref.n_tokens:
                    broken = ref
                    break
                out.refs.append(ref)
                out.payloads.append((data, ref.n_tokens, ref.use))
                out.checksums.append(row[0])
            if broken is not None:
                log.warning("KV block %s is missing or truncated; dropping it", broken.key.hex()[:12])
                out.n_bad += self.delete_subtree(broken.key)
        return out

    def reject(self, mapped: MappedBlocks, i: int) -> int:
        """Block ``i`` of ``mapped`` failed its checksum: delete it with its descendants;
        returns how many blocks went."""
        key = mapped.refs[i].key
        log.warning("KV block %s failed its checksum; dropping it", key.hex()[:12])
        with self.ix.guard():
            return self.delete_subtree(key)

    def rows(self, keys: Sequence[bytes]) -> dict[bytes, tuple[int, int]]:
        """``{key: (checksum, nbytes)}`` of the stored ``keys`` (queried 500 at a time)."""
        rows: dict[bytes, tuple[int, int]] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            q = f"SELECT key, checksum, nbytes FROM blocks WHERE key IN ({','.join('?' * len(chunk))})"
            rows.update((k, (c, n)) for k, c, n in self.ix.db.execute(q, chunk))
        return rows

    def record_restore(self, restored_tokens: int, prefilled_tokens: int) -> None:
        """Add a request's restored / prefilled token counts to the statistics."""
        with self.ix.guard(), self.ix.tx():
            self.ix.bump(tokens_restored=restored_tokens, tokens_prefilled=prefilled_tokens)

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
        with self.ix.guard():
            present = self.present(chain)
        return [b for b in wanted if b.key not in present], chain

    def put(
        self,
        fingerprint: bytes,
        blocks: Iterable[NewBlock],
        active_path: Sequence[bytes] = (),
    ) -> tuple[int, int]:
        """Store ``blocks`` in one transaction (``PrefixStore.put`` then evicts to the budget).

        Each block the store lacks is made ready on one of two threads (storage.parallel):
        its payload is produced (when it is a callable, see :class:`NewBlock`),
        checksummed and written to its file while it is still in the CPU cache; the
        SQLite work stays on this thread, the rows inserted with one ``executemany``. The
        files are written inside the transaction
        that inserts their rows, before it commits: a process killed before the commit
        leaves orphans (reclaimed at open), never a row without its payload.

        ``active_path`` are the keys of the conversation being served: they are marked
        as just used and are evicted only when nothing else is left. Returns the payload
        bytes written and the number of covered tails dropped. Raises StorageFullError when
        the disk is full (nothing is written).
        """
        now = time.time()
        blocks = list(blocks)
        written = dropped = 0
        todo: list[NewBlock] = []
        with self.ix.guard():
            try:
                with self.ix.tx():  # BEGIN IMMEDIATE: no other writer until the commit
                    present = self.present([b.key for b in blocks])
                    todo = [b for b in blocks if b.key not in present]
                    size = sum(b.nbytes if callable(b.payload) else memoryview(b.payload).nbytes for b in todo)
                    ready = in_halves(lambda part: [self._write_block(b) for b in part], todo, size)
                    self.ix.db.executemany(
                        "INSERT INTO blocks(key, parent, fingerprint, start, n_tokens,"
                        " tokens, nbytes, checksum, n_children, last_access)"
                        " VALUES (?,?,?,?,?,?,?,?,0,?)",
                        [(b.key, b.parent, fingerprint, b.start, b.n_tokens, tokens_to_bytes(b.tokens),
                          nbytes, value, now) for b, (nbytes, value) in zip(todo, ready)],
                    )
                    children = Counter(b.parent for b in todo)
                    self.ix.db.executemany(
                        "UPDATE blocks SET n_children = n_children + ? WHERE key=?",
                        [(count, parent) for parent, count in children.items()],
                    )
                    written = sum(nbytes for nbytes, _ in ready)
                    new = {b.key for b in todo}
                    for b in todo:
                        # A parent inserted by this very call has no other children, so no
                        # tail of its can be covered (a chain: one query, not one per block).
                        if b.parent not in new or children[b.parent] > 1:
                            dropped += self._drop_covered_tails(b)
                    self.touch(active_path, now)
            except BaseException:
                self.ix.files.scrub(b.key for b in todo)  # rolled back: their rows are gone, so are they
                raise
        return written, dropped

    def _write_block(self, b: NewBlock) -> tuple[int, int]:
        """Produce, checksum and write the payload of ``b``; returns ``(bytes, checksum)``."""
        payload = b.payload() if callable(b.payload) else b.payload
        assert payload is not None
        value = checksum(payload)
        self.ix.write_payload(self.ix.files, b.key, payload)
        return memoryview(payload).nbytes, value

    def _drop_covered_tails(self, new: NewBlock) -> int:
        """Delete tails under ``new.parent`` whose tokens are a prefix of ``new``'s;
        returns how many blocks went."""
        rows = self.ix.db.execute(
            "SELECT key, tokens FROM blocks WHERE parent=? AND n_tokens < ? AND key != ?",
            (new.parent, new.n_tokens, new.key),
        ).fetchall()
        n = 0
        for key, tok in rows:
            t = np.frombuffer(tok, dtype="<i4")
            if np.array_equal(t, new.tokens[: len(t)]):
                n += self.delete_subtree(key)
        return n

    def delete_subtree(self, key: bytes) -> int:
        """Delete a block and every block below it; returns how many were deleted."""
        keys = [
            r[0]
            for r in self.ix.db.execute(
                "WITH RECURSIVE sub(key) AS (SELECT ? UNION"
                " SELECT b.key FROM blocks b JOIN sub ON b.parent = sub.key) SELECT key FROM sub",
                (key,),
            )
        ]
        row = self.ix.db.execute("SELECT parent FROM blocks WHERE key=?", (key,)).fetchone()
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            self.ix.db.execute(f"DELETE FROM blocks WHERE key IN ({marks})", chunk)
            self.checkpoints.drop(chunk)
        # The files go after the commit (a row never outlives its file); killed in
        # between, they are orphans, scrubbed at the next open.
        self.ix.doomed.extend(keys)
        if not self.ix.db.in_transaction:
            self.ix.scrub_doomed()
        if row:
            self.ix.db.execute(
                "UPDATE blocks SET n_children = n_children - 1 WHERE key=?", (row[0],)
            )
        return len(keys) if row else 0

    def present(self, keys: Sequence[bytes]) -> set[bytes]:
        """Which of ``keys`` the store holds."""
        return set(self.rows(keys))

    def touch(self, keys: Sequence[bytes], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.ix.db.executemany(
            "UPDATE blocks SET last_access=? WHERE key=?", [(now, k) for k in keys]
        )


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
