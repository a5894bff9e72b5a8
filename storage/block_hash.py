"""Content addresses of KV blocks: a hash chain over token ids, rooted at the model fingerprint.

Block ``i`` of a token sequence covers tokens ``[i*B, (i+1)*B)`` (``B`` = block size).
Its key is ``BLAKE2b-256(parent_key || tokens as little-endian int32)`` where the parent of
block 0 is the fingerprint (engine/fingerprint.py), so equal keys mean the same model, the
same settings and the same tokens at the same positions. A *tail* block (fewer than ``B``
tokens, always the last of a sequence) is keyed the same way over its own tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

KEY_BYTES = 32


def tokens_to_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as a little-endian int32 byte string (4 bytes per token)."""
    return np.asarray(tokens, dtype="<i4").tobytes()


def tokens_from_bytes(data: bytes) -> list[int]:
    """Inverse of :func:`tokens_to_bytes`."""
    return np.frombuffer(data, dtype="<i4").tolist()


def block_key(parent: bytes, tokens: Sequence[int] | np.ndarray) -> bytes:
    """The key of a block holding ``tokens`` whose parent key is ``parent`` (32 bytes)."""
    h = hashlib.blake2b(parent, digest_size=KEY_BYTES)
    h.update(tokens_to_bytes(tokens))
    return h.digest()


def chain_keys(root: bytes, tokens: Sequence[int] | np.ndarray, block_size: int) -> list[bytes]:
    """Keys of the full blocks of ``tokens`` (``len(tokens) // block_size`` of them), in order."""
    arr = np.asarray(tokens, dtype="<i4")
    keys, parent = [], root
    for start in range(0, len(arr) - block_size + 1, block_size):
        parent = block_key(parent, arr[start : start + block_size])
        keys.append(parent)
    return keys
