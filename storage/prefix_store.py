"""The prefix store's public names, where callers have always imported them from: the
store itself is the package :mod:`storage.prefix` (one module per job; see there)."""

from storage.prefix import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_BUDGET_BYTES,
    BlockRef,
    CheckpointRef,
    MappedBlocks,
    NewBlock,
    PrefixMatch,
    PrefixStore,
    StoreError,
    StoreFull,
    StoreReset,
    StoreUnavailable,
    VerifyReport,
    checksum,
    tokens_from_bytes,
)

__all__ = [
    "BlockRef", "CheckpointRef", "MappedBlocks", "NewBlock", "PrefixMatch", "PrefixStore", "StoreError", "StoreFull", "StoreReset",
    "StoreUnavailable", "VerifyReport",
    "checksum", "tokens_from_bytes", "DEFAULT_BLOCK_SIZE", "DEFAULT_BUDGET_BYTES",
]
