"""The few numbers of a GGUF header that bound a context, read without llama.cpp.

llama.cpp allocates the whole KV cache when it creates a context, so a context size too
large for the machine is only safe to refuse before that. This reads the metadata
key/value section (layout: ggml ``gguf.cpp``; magic, uint32 version, uint64 tensor count,
uint64 key count, then each key as a uint64-length string, a uint32 type and the value)
and keeps the scalars; arrays of fixed-size items are skipped by seeking, arrays of
strings by their lengths, so a tokenizer of 150,000 tokens costs a few tens of ms.
Anything odd (a truncated file, an unknown type, absurd lengths) gives None: the caller
then leaves the judgement to llama.cpp.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # gguf_type -> bytes
_FORMAT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 1 << 16
_MAX_TENSORS = 1 << 20
_MAX_STRING = 1 << 26  # a chat template of 64 MiB is already absurd
_KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32,
                  "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class ModelShape:
    """What bounds a context: ``trained`` (``<arch>.context_length``, 0 if absent) and the
    attention shape: ``n_layer``, ``kv_heads`` (KV heads summed over layers), ``key_length``
    and ``value_length`` (per head)."""

    trained: int
    n_layer: int
    kv_heads: int
    key_length: int
    value_length: int

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> int:
        """KV cache bytes one token takes in context (all layers, K and V)."""
        k = self.kv_heads * self.key_length * _KV_TYPE_BYTES.get(type_k, 2.0)
        v = self.kv_heads * self.value_length * _KV_TYPE_BYTES.get(type_v, 2.0)
        return int(round(k + v))


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise EOFError
        return data

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self, keep: bool = True) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise ValueError("string too long")
        if not keep:
            self.f.seek(n, 1)
            return ""
        return self.take(n).decode("utf-8", "replace")

    def value(self, kind: int):
        if kind in _FORMAT:
            return struct.unpack(_FORMAT[kind], self.take(_FIXED[kind]))[0]
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.u32(), self.u64()
            if item in _FIXED:
                if n <= 4096:  # small arrays (per-layer head counts) are kept
                    return [self.value(item) for _ in range(n)]
                self.f.seek(n * _FIXED[item], 1)
                return None
            if item == _STRING:
                for _ in range(n):
                    self.string(keep=False)
                return None
        raise ValueError(f"unknown GGUF type {kind}")


def _header(f) -> tuple[_Reader, int, int] | None:
    """``(reader, tensor count, key count)`` after a GGUF file's magic and version, or None
    when ``f`` is not a GGUF of version 2 or 3 or its counts are absurd."""
    r = _Reader(f)
    if r.take(4) != b"GGUF" or r.u32() not in (2, 3):
        return None
    n_tensors, n_keys = r.u64(), r.u64()
    if n_keys > _MAX_KEYS or n_tensors > _MAX_TENSORS:
        return None
    return r, n_tensors, n_keys


def read_metadata(path: str | Path) -> dict | None:
    """The scalar metadata of a GGUF file (and small numeric arrays), or None when the
    header cannot be read."""
    try:
        with open(path, "rb") as f:
            head = _header(f)
            return None if head is None else dict(_pairs(head[0], head[2]))
    except (OSError, EOFError, ValueError, struct.error, OverflowError):
        return None


def _pairs(r: _Reader, n_keys: int, keep: bool = True):
    """The ``n_keys`` metadata (key, value) pairs at ``r`` whose value is kept (none when
    not ``keep``: the reader is then only moved past them)."""
    for _ in range(n_keys):
        key = r.string(keep=keep)
        value = r.value(r.u32())
        if keep and value is not None:
            yield key, value


def layer_weight_types(path: str | Path) -> frozenset[int] | None:
    """The ggml type ids of the per-layer weight tensors (names ``blk.*``) of the GGUF file at
    ``path``: what the KV-computing matrix products run on. Reads the tensor infos that
    follow the metadata (name, dimensions, type, offset each), not the weights. None when the
    header cannot be read."""
    try:
        with open(path, "rb") as f:
            head = _header(f)
            if head is None:
                return None
            r, n_tensors, n_keys = head
            for _ in _pairs(r, n_keys, keep=False):
                pass
            types = set()
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.u32()
                if n_dims > 8:
                    return None
                f.seek(8 * n_dims, 1)
                kind = r.u32()
                r.u64()
                if name.startswith("blk."):
                    types.add(kind)
            return frozenset(types)
    except (OSError, EOFError, ValueError, struct.error, OverflowError):
        return None


def model_shape(path: str | Path) -> ModelShape | None:
    """The context-bounding shape of the model at ``path``, or None when unknown."""
    meta = read_metadata(path)
    if not meta:
        return None
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None

    def num(key: str, default: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    n_layer, n_embd, n_head = num("block_count"), num("embedding_length"), meta.get(f"{arch}.attention.head_count")
    kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head, list):
        n_head = max(n_head, default=0)
    if isinstance(kv, list):
        kv_heads = int(sum(kv))
    elif isinstance(kv, (int, float)):
        kv_heads = int(kv) * n_layer
    else:
        kv_heads = 0
    head = n_embd // n_head if isinstance(n_head, int) and n_head > 0 else 0
    return ModelShape(trained=num("context_length"), n_layer=n_layer, kv_heads=max(kv_heads, 0),
                      key_length=num("attention.key_length", head), value_length=num("attention.value_length", head))
