"""Maintenance of the prefix store: reclaiming orphaned files at open, verifying every
checksum, forgetting the blocks of deleted conversations, and clearing the store.

Deletion leaves no bytes behind: ``PRAGMA secure_delete=ON`` overwrites freed index
content with zeros, the vacuum truncates the freed pages, and a block's or checkpoint's
file is overwritten with zeros before it is unlinked. :meth:`Maintenance.forget` forces
its zeros to the disk.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from storage.prefix.blocks import Blocks
from storage.prefix.checkpoints import Checkpoints
from storage.prefix.index import Index
from storage.prefix.records import VerifyReport, checksum

log = logging.getLogger("storage.prefix_store")


class Maintenance:
    """Reclaim, verify, forget and clear for one store (``PrefixStore.maintenance``).

    Errors: StoreFull / StoreUnavailable / StoreReset from the index.
    """

    def __init__(self, index: Index, blocks: Blocks, checkpoints: Checkpoints):
        self.ix = index
        self.blocks = blocks
        self.checkpoints = checkpoints

    def reclaim(self) -> None:
        """Remove block and checkpoint files without an index row (a write killed before
        its commit) and temporary files, under the write lock so no other process is
        between a file and its row. Best effort: a locked store is left as it is."""
        for files, table, what in ((self.ix.files, "blocks", "block"),
                                   (self.ix.checkpoint_files, "checkpoints", "checkpoint")):
            if not files.names():
                continue
            try:
                with self.ix.lock, self.ix.tx():
                    keep = {r[0].hex() for r in self.ix.db.execute(f"SELECT key FROM {table}")}  # noqa: S608 - fixed names
                    gone = files.reclaim(keep)
                if gone:
                    log.info("prefix store: %d orphaned %s files removed", gone, what)
            except sqlite3.Error as exc:
                log.warning("prefix store: orphaned %s files not checked: %s", what, exc)

    def fingerprints(self) -> list[bytes]:
        """Every model fingerprint that has blocks in the store."""
        with self.ix.guard():
            return [r[0] for r in self.ix.db.execute(
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
        with self.ix.guard():
            self.ix.sync_scrub = True
            try:
                deleted = self._forget(forget, keep, fingerprints)
            finally:
                self.ix.sync_scrub = False
            if deleted:
                self.ix.vacuum()
        return deleted

    def _forget(self, forget: list[np.ndarray], keep: list[np.ndarray],
                fingerprints: Iterable[bytes] | None) -> int:
        deleted = 0
        for fp in (self.fingerprints() if fingerprints is None else list(fingerprints)):
            kept: set[bytes] = set()
            for tokens in keep:  # a block kept text uses only in part may hold ours
                kept.update(b.key for b in self.blocks.lookup(fp, tokens, count=False).blocks
                            if b.use == b.n_tokens)
            with self.ix.tx():
                for tokens in forget:
                    for ref in self.blocks.lookup(fp, tokens, count=False).blocks:
                        if ref.use < ref.n_tokens:
                            break  # a block that only starts like ours holds other text
                        if ref.key not in kept:
                            deleted += self.blocks.delete_subtree(ref.key)
                            break
        return deleted

    def forget_models(self, fingerprints: Iterable[bytes]) -> int:
        """Delete every block and checkpoint stored under ``fingerprints`` (a model that was
        removed: its KV is of no use to any other model) and their KV layouts, files zeroed
        and forced to the disk as in :meth:`forget`. Returns the number of blocks deleted
        (0 when the store holds none of them). Raises StoreFull / StoreUnavailable."""
        fps = list(fingerprints)
        if not fps:
            return 0
        marks = ",".join("?" * len(fps))
        with self.ix.guard():
            self.ix.sync_scrub = True
            try:
                with self.ix.tx():
                    keys = [r[0] for r in self.ix.db.execute(
                        f"SELECT key FROM blocks WHERE fingerprint IN ({marks})", fps)]  # noqa: S608 - placeholders
                    cps = [r[0] for r in self.ix.db.execute(
                        f"SELECT key FROM checkpoints WHERE fingerprint IN ({marks})", fps)]  # noqa: S608
                    self.ix.db.execute(f"DELETE FROM blocks WHERE fingerprint IN ({marks})", fps)  # noqa: S608
                    self.ix.doomed.extend(keys)
                    if cps:
                        self.checkpoints.delete(cps)
                    self.ix.db.execute(f"DELETE FROM models WHERE fingerprint IN ({marks})", fps)  # noqa: S608
            finally:
                self.ix.sync_scrub = False
            if keys or cps:
                self.ix.vacuum()
        return len(keys)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every block's and checkpoint's checksum (and every KV layout); remove bad
        blocks with their descendants, bad checkpoints and damaged layouts. ``progress`` is
        called with (blocks checked, blocks in all)."""
        with self.ix.guard():
            ids = self.ix.db.execute("SELECT id, key FROM blocks ORDER BY id").fetchall()
            bad_keys = []
            for i, (rowid, key) in enumerate(ids):
                row = self.ix.db.execute("SELECT checksum, nbytes FROM blocks WHERE id=?", (rowid,)).fetchone()
                if row is None:
                    continue
                data = self.ix.files.map(key, cache=False)
                if data is None or len(data) != row[1] or checksum(data) != row[0]:
                    bad_keys.append(key)
                del data
                if progress:
                    progress(i + 1, len(ids))
            removed = 0
            with self.ix.tx():
                for key in bad_keys:
                    removed += self.blocks.delete_subtree(key)
                for key, want, nbytes in self.ix.db.execute("SELECT key, checksum, nbytes FROM checkpoints").fetchall():
                    data = self.ix.checkpoint_files.map(key, cache=False)
                    if data is None or len(data) != nbytes or checksum(data) != want:
                        log.warning("dropping a checkpoint that failed its checksum")
                        self.checkpoints.delete([key])
                    del data
                for fp, layout in self.ix.db.execute("SELECT fingerprint, layout FROM models").fetchall():
                    try:
                        json.loads(layout)
                    except ValueError:  # a damaged layout: its blocks cannot be joined
                        log.warning("dropping the KV layout of %s: it is damaged", fp.hex()[:12])
                        self.ix.db.execute("DELETE FROM models WHERE fingerprint=?", (fp,))
            if removed:
                self.ix.vacuum()
        return VerifyReport(len(ids), len(bad_keys), removed)

    def clear(self) -> None:
        """Empty the store (blocks, checkpoints, layouts, digests and counters go) in place,
        in one transaction: another process that has it open (the window, ``serve``) keeps
        a working store and simply finds nothing. A damaged file is replaced instead."""
        with self.ix.guard():
            with self.ix.tx():
                self.ix.doomed.extend(r[0] for r in self.ix.db.execute("SELECT key FROM blocks"))
                self.ix.doomed_checkpoints.extend(r[0] for r in self.ix.db.execute("SELECT key FROM checkpoints"))
                for table in ("blocks", "checkpoints", "models", "counters", "file_digests"):
                    self.ix.db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed names
            self.ix.vacuum()
