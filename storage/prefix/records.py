"""The prefix store's records and errors: what a lookup returns (``PrefixMatch`` of
``BlockRef``), what a write takes (``NewBlock``), a stored checkpoint (``CheckpointRef``),
a verify report, the xxh3 checksum every payload carries, and the store's errors (a
``StoreError`` means "go on without the cache")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storage.errors import StorageError, StorageFullError
from storage.parallel import xxh3_64

DEFAULT_BLOCK_SIZE = 64  # tokens; see `branchwise bench` for the trade-off
DEFAULT_BUDGET_BYTES = 4 * 1024**3
"""The prefix store's byte budget when the user chose none (4 GiB): the one default for the
window, the CLI, the engine process and the README."""


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


@dataclass
class MappedBlocks:
    """The payload files of a match, mapped but not yet verified (``Blocks.map_match``).

    ``payloads[i]`` is ``(view, n_tokens, use)`` over the mapped file of ``refs[i]``
    (read-only, no copy), ready for ``engine.kv_codec.assemble``; ``checksums[i]`` is the
    stored xxh3 the bytes must have. ``n_bad`` counts blocks already dropped because a file
    was missing or of the wrong size (the payloads stop before them). Nothing here may
    reach llama.cpp before :meth:`check` passed for it.
    """

    refs: list["BlockRef"] = field(default_factory=list)
    payloads: list[tuple[memoryview, int, int]] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    n_bad: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of all mapped payloads."""
        return sum(len(p) for p, _, _ in self.payloads)

    def check(self, i: int, data) -> bool:
        """True when ``data`` (the bytes of payload ``i``) has the stored checksum.
        Thread-safe: it reads only."""
        return checksum(data) == self.checksums[i]


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
