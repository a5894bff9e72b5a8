"""The prefix store as a package: ``from storage.prefix import PrefixStore`` (also
importable from ``storage.prefix_store``).

==================  =============================================================
``store.py``        ``PrefixStore``: the public face, one method per request
``index.py``        ``Index``: the SQLite file, schema 5 and its migrations, errors
``blocks.py``       ``Blocks``: lookup, read and verify, plan and write, subtrees
``checkpoints.py``  ``Checkpoints``: whole states at chosen positions, as files
``eviction.py``     ``Eviction`` and the named policy ``least_recently_used_leaves``
``maintenance.py``  ``Maintenance``: orphan reclaim, verify, forget, clear
``digests.py``      ``FileDigests``: the model-file digest cache
``records.py``      the records (``PrefixMatch``, ``NewBlock``...) and the errors
==================  =============================================================
"""

from storage.block_hash import tokens_from_bytes
from storage.prefix.records import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_BUDGET_BYTES,
    BlockRef,
    CheckpointRef,
    MappedBlocks,
    NewBlock,
    PrefixMatch,
    StoreError,
    StoreFull,
    StoreReset,
    StoreUnavailable,
    VerifyReport,
    checksum,
)
from storage.prefix.store import PrefixStore

__all__ = [
    "BlockRef", "CheckpointRef", "MappedBlocks", "NewBlock", "PrefixMatch", "PrefixStore", "StoreError", "StoreFull", "StoreReset",
    "StoreUnavailable", "VerifyReport",
    "checksum", "tokens_from_bytes", "DEFAULT_BLOCK_SIZE", "DEFAULT_BUDGET_BYTES",
]
