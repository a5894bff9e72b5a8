"""Model fingerprints: everything that changes the bytes of the KV state.

Two requests may share KV blocks only if their fingerprints are equal. The fingerprint
covers the model file's content (xxh3-128 of every byte, cached by path, size and
mtime), the llama-cpp-python version (which pins llama.cpp), the K and V types, flash
attention (which decides whether V is stored transposed), the block size, and the CPU
kernels that compute the KV (:func:`kernels`): whether weights are repacked and what the
llama.cpp build was compiled for. A Q4_0 model's KV differs with repacking on and off, and
a build for another CPU multiplies with other kernels.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import xxhash

FINGERPRINT_VERSION = b"branchwise-kv/1"
_CHUNK = 8 * 1024 * 1024


def file_digest(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    """xxh3-128 hex digest of a file's bytes; ``progress(done_bytes, total_bytes)``."""
    total = path.stat().st_size
    h = xxhash.xxh3_128()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return h.hexdigest()


def cached_file_digest(path: Path, cache, progress=None) -> str:
    """:func:`file_digest`, remembered in ``cache`` (a PrefixStore) by path, size, mtime,
    ctime and inode: copying a file over it, even keeping its mtime, changes the ctime."""
    st = os.stat(path)
    key = (str(path), f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")
    if cache is not None:
        hit = cache.digests.cached(*key)
        if hit:
            return hit
    digest = file_digest(path, progress)
    if cache is not None:
        cache.digests.remember(*key, digest)
    return digest


def kernels(repack: bool, system_info: str) -> str:
    """What decides the CPU kernels a KV is computed with: weight repacking (on/off) and
    llama.cpp's system info line (``engine.cpu.system_info``: the instruction sets and
    backends it was built with)."""
    return f"repack={int(repack)};{system_info}"


def fingerprint(
    model_digest: str, llama_version: str, type_k: str, type_v: str, flash_attn: bool, block_size: int,
    kernel_set: str = "",
) -> bytes:
    """The 32-byte root key for one model and KV configuration (``kernel_set``: :func:`kernels`)."""
    h = hashlib.blake2b(FINGERPRINT_VERSION, digest_size=32)
    for part in (model_digest, llama_version, type_k, type_v, str(int(flash_attn)), str(block_size)):
        h.update(b"\0" + part.encode())
    if kernel_set:
        h.update(b"\0" + kernel_set.encode())
    return h.digest()
