"""Eviction: what goes when the store is over its byte budget, as a named policy.

The candidates are the leaves (:class:`Leaf`): blocks no other block hangs off (with the
bytes of the checkpoints that go with them) and checkpoints. The policy,
:func:`least_recently_used_leaves`, orders them least recently used first (the deeper of
two used at the same moment first) and keeps the protected ones (the active
conversation's path) for last: they are candidates only when nothing else is left. A
block that loses its last child becomes a leaf and is a candidate in the next pass, before
the protected ones. Evicting a block takes its subtree (none: it is a leaf) and its
checkpoints along.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from storage.prefix.blocks import Blocks
from storage.prefix.checkpoints import Checkpoints
from storage.prefix.index import Index


class Leaf(NamedTuple):
    """An eviction candidate, one row of :data:`LEAVES_SQL`."""

    key: bytes
    nbytes: int  # payload bytes freed: a block's own plus its checkpoints'
    last_access: float  # Unix seconds of the last lookup or write that used it
    is_checkpoint: bool
    depth: int  # tokens before it: a block's start, a checkpoint's position


LEAVES_SQL = (
    "SELECT b.key AS key,"
    " b.nbytes + coalesce((SELECT sum(c.nbytes) FROM checkpoints c WHERE c.anchor = b.key), 0) AS nbytes,"
    " b.last_access AS last_access, 0 AS is_checkpoint, b.start AS depth"
    " FROM blocks b WHERE b.n_children = 0"
    " UNION ALL SELECT key, nbytes, last_access, 1, n_tokens FROM checkpoints"
)
"""Every leaf block and every checkpoint, in the columns of :class:`Leaf`."""

Policy = Callable[[Sequence[Leaf], Collection[bytes]], list[Leaf]]
"""An eviction policy: the leaves in the order to evict them, given the protected keys."""


def least_recently_used_leaves(leaves: Sequence[Leaf], protect: Collection[bytes]) -> list[Leaf]:
    """The default policy: unprotected leaves, least recently used first (ties: the deeper
    first); only when every leaf is protected, the protected ones in the same order."""
    order = sorted(leaves, key=lambda leaf: (leaf.last_access, -leaf.depth))
    return [leaf for leaf in order if leaf.key not in protect] or order


class Eviction:
    """Evicts one store's leaves down to a budget by a :data:`Policy`
    (``PrefixStore.eviction``; default :func:`least_recently_used_leaves`)."""

    def __init__(self, index: Index, blocks: Blocks, checkpoints: Checkpoints,
                 policy: Policy = least_recently_used_leaves):
        self.ix = index
        self.blocks = blocks
        self.checkpoints = checkpoints
        self.policy = policy

    def evict(self, budget_bytes: int, protect: set[bytes]) -> int:
        """Evict leaves until the payload fits ``budget_bytes`` and the file (plus WAL)
        fits it beyond the empty store's overhead; then give the free pages back. The
        caller holds the index's guard, outside a transaction. Returns the payload bytes
        freed."""
        freed = self._evict_payload_to(budget_bytes, protect)
        if freed:
            self.ix.vacuum()
        for _ in range(64):  # each pass evicts at least the overshoot; blocks run out fast
            over = self.ix.disk_bytes() - self.ix.fixed_overhead_bytes() - budget_bytes
            total = self.ix.total_bytes()
            if over <= 0 or total == 0:
                break
            more = self._evict_payload_to(max(0, total - over), protect)
            if not more:
                break
            freed += more
            self.ix.vacuum()
        return freed

    def _evict_payload_to(self, target: int, protect: set[bytes]) -> int:
        """Delete leaves in the policy's order until the payload bytes are at most
        ``target``. Returns the payload bytes freed."""
        total = self.ix.total_bytes()
        freed = 0
        while total > target:
            leaves = [Leaf(*row) for row in self.ix.db.execute(LEAVES_SQL)]
            if not leaves:
                break
            with self.ix.tx():
                for leaf in self.policy(leaves, protect):
                    if total <= target:
                        break
                    if leaf.is_checkpoint:
                        self.checkpoints.delete([leaf.key])
                        self.ix.bump(evicted_checkpoints=1, evicted_bytes=leaf.nbytes)
                    else:
                        self.blocks.delete_subtree(leaf.key)
                        self.ix.bump(evicted_blocks=1, evicted_bytes=leaf.nbytes)
                    total -= leaf.nbytes
                    freed += leaf.nbytes
        return freed
