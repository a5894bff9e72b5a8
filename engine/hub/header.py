"""The facts a memory estimate needs, from a GGUF file's header: read from a local file,
or from a hub with HTTP range requests of the file's first few MB.

Only the metadata section is read (magic, version, counts, then the key/value pairs;
the tensor list is not needed). ``gguf.GGUFReader`` parses a whole file with numpy one
value at a time: 15 s for SmolLM2's 49,152-token vocabulary on this busy machine, too slow
for a list of a dozen files. So :func:`parse_metadata` walks the same layout (ggml's
``gguf.h``; value types from ``gguf.GGUFValueType``) with ``struct`` and keeps the
length of a string array, not its strings: milliseconds. The tests check it against
``GGUFReader`` on a real model. When the metadata runs past the bytes fetched (a large
vocabulary: Gemma 3's 262,144 tokens take about 6 MB), twice as much is requested, up to
:data:`MAX_HEADER_BYTES`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

FIRST_REQUEST_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 128 * 1024 * 1024

RECURRENT_ARCHS = {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
"""Architectures llama.cpp keeps in ``llama_memory_recurrent`` (``llm_arch_is_recurrent``)."""
HYBRID_ARCHS = {"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "qwen3next"}
"""Architectures llama.cpp keeps in ``llama_memory_hybrid`` (``llm_arch_is_hybrid``)."""


class HeaderError(Exception):
    """The header could not be read; the message is one sentence naming the file."""


@dataclass
class GgufFacts:
    """What the header says about a model's shape. Per-layer lists have ``n_layer`` entries."""

    name: str
    architecture: str
    file_type: int
    context_length: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: list[int]  # per layer; 0 for a layer without attention (recurrent layers)
    key_length: int
    value_length: int
    n_vocab: int
    sliding_window: int  # 0 without sliding-window attention
    ssm_state_bytes: int  # recurrent state of one sequence (Mamba, hybrids), bytes; 0 when none
    header_bytes: int

    @property
    def recurrent(self) -> bool:
        return self.architecture in RECURRENT_ARCHS

    @property
    def hybrid(self) -> bool:
        return self.architecture in HYBRID_ARCHS

    def to_dict(self) -> dict:
        return asdict(self)


class NeedMore(Exception):
    """The metadata runs past the bytes given."""


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer values); longer ones skipped


def parse_metadata(buf: bytes | memoryview) -> tuple[dict, int]:
    """Parse a GGUF file's metadata from its first bytes ``buf``: returns (key -> value,
    bytes the metadata takes). A string array's value is its length; numeric arrays longer
    than 4,096 items are None.

    Raises:
        NeedMore: the metadata does not end within ``buf``.
        HeaderError: not GGUF, an unknown version or value type.
    """
    buf = memoryview(buf)
    n = len(buf)

    def need(off: int, size: int) -> None:
        if off + size > n:
            raise NeedMore(off + size)

    need(0, 24)
    if bytes(buf[:4]) != b"GGUF":
        raise HeaderError("not a GGUF file (no GGUF magic)")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} is not supported")
    off = 24

    def string(off: int) -> tuple[str, int]:
        need(off, 8)
        (length,) = struct.unpack_from("<Q", buf, off)
        need(off + 8, length)
        return bytes(buf[off + 8: off + 8 + length]).decode("utf-8", "replace"), off + 8 + length

    out: dict = {}
    for _ in range(n_kv):
        key, off = string(off)
        need(off, 4)
        (vtype,) = struct.unpack_from("<I", buf, off)
        off += 4
        if vtype in _SCALARS:
            size = struct.calcsize(_SCALARS[vtype])
            need(off, size)
            out[key] = struct.unpack_from(_SCALARS[vtype], buf, off)[0]
            off += size
        elif vtype == _STRING:
            out[key], off = string(off)
        elif vtype == _ARRAY:
            need(off, 12)
            etype, count = struct.unpack_from("<IQ", buf, off)
            off += 12
            if etype == _STRING:
                for _i in range(count):
                    need(off, 8)
                    off += 8 + struct.unpack_from("<Q", buf, off)[0]
                need(off, 0)
                out[key] = count
            elif etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype])
                need(off, size * count)
                out[key] = (list(struct.unpack_from(f"<{count}{_SCALARS[etype][1]}", buf, off))
                            if count <= _KEEP_ARRAY else None)
                off += size * count
            else:
                raise HeaderError(f"array of unknown value type {etype} in {key}")
        else:
            raise HeaderError(f"unknown value type {vtype} for {key}")
    return out, off


def facts_from_metadata(meta: dict, header_bytes: int) -> GgufFacts:
    """Pull :class:`GgufFacts` out of :func:`parse_metadata`'s dict."""
    arch = meta.get("general.architecture", "unknown")

    def a(key: str, default=0):
        return meta.get(f"{arch}.{key}", default)

    n_layer = int(a("block_count", 0))
    n_embd = int(a("embedding_length", 0))
    n_head = a("attention.head_count", 0)
    n_head = int(max(n_head) if isinstance(n_head, list) else n_head)
    kv = a("attention.head_count_kv", None)
    if kv is None:
        kv = [n_head] * n_layer
    elif not isinstance(kv, list):
        kv = [int(kv)] * n_layer
    head_dim = n_embd // n_head if n_head else 0
    n_vocab = meta.get("tokenizer.ggml.tokens") or int(a("vocab_size", 0))
    ssm = 0
    d_inner, d_state, d_conv = int(a("ssm.inner_size", 0)), int(a("ssm.state_size", 0)), int(a("ssm.conv_kernel", 0))
    recurrent_layers = sum(1 for h in kv if h == 0) if arch in HYBRID_ARCHS else n_layer
    if d_inner and (arch in RECURRENT_ARCHS or arch in HYBRID_ARCHS):
        ssm = recurrent_layers * 4 * (max(d_conv - 1, 0) * (d_inner + 2 * d_state) + d_state * d_inner)
    elif arch.startswith("lfm2"):  # short convolutions: (L_cache - 1) x 3 x n_embd f32 per conv layer
        ssm = recurrent_layers * 4 * max(int(a("shortconv.l_cache", 3)) - 1, 0) * 3 * n_embd
    return GgufFacts(
        name=str(meta.get("general.name", "") or ""),
        architecture=arch,
        file_type=int(meta.get("general.file_type", -1)),
        context_length=int(a("context_length", 0)),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=[int(h) for h in kv],
        key_length=int(a("attention.key_length", head_dim) or head_dim),
        value_length=int(a("attention.value_length", head_dim) or head_dim),
        n_vocab=int(n_vocab),
        sliding_window=int(a("attention.sliding_window", 0) or 0),
        ssm_state_bytes=ssm,
        header_bytes=header_bytes,
    )


def read_local(path: str | os.PathLike) -> GgufFacts:
    """Read the header of a GGUF file on disk (the first part of a split model).

    Raises:
        HeaderError: not a GGUF file, its header is damaged, or it cannot be read.
    """
    path = Path(path)
    want = FIRST_REQUEST_BYTES
    try:
        with open(path, "rb") as f:
            while True:
                f.seek(0)
                buf = f.read(want)
                try:
                    return facts_from_metadata(*parse_metadata(buf))
                except NeedMore:
                    if len(buf) < want or want >= MAX_HEADER_BYTES:
                        raise HeaderError("the header is truncated") from None
                    want *= 2
    except HeaderError as exc:
        raise HeaderError(f"The header of {path.name} could not be read: {exc}.") from None
    except OSError as exc:
        raise HeaderError(f"{path} could not be read ({exc.strerror or exc}).") from exc


def parse_prefix(prefix: bytes, file_size: int) -> GgufFacts | None:
    """Parse the header from the first ``len(prefix)`` bytes of a file of ``file_size``
    bytes; None when the metadata runs past the prefix (ask for more).

    Raises:
        HeaderError: the bytes are not a GGUF header.
    """
    try:
        return facts_from_metadata(*parse_metadata(prefix))
    except NeedMore:
        if len(prefix) >= file_size:
            raise HeaderError("the header runs past the end of the file") from None
        return None


def read_remote(url: str, file_size: int, token: str | None = None, client=None) -> GgufFacts:
    """Read the header of the GGUF file at ``url`` (``file_size`` bytes) with HTTP range
    requests: 4 MiB first, doubled until the header fits (contacts the URL's host).

    Raises:
        HeaderError: the host could not be reached, refused the range, or the file is not GGUF.
    """
    import httpx

    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=30.0, trust_env=False)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    want = min(FIRST_REQUEST_BYTES, file_size)
    try:
        while True:
            try:
                r = client.get(url, headers={**headers, "Range": f"bytes=0-{want - 1}"})
            except httpx.HTTPError as exc:
                raise HeaderError(f"{httpx.URL(url).host} could not be reached for {url.rsplit('/', 1)[-1]} "
                                  f"({exc}).") from exc
            if r.status_code not in (200, 206):
                raise HeaderError(f"{httpx.URL(url).host} answered {r.status_code} for {url.rsplit('/', 1)[-1]}.")
            prefix = r.content[:want]
            try:
                facts = parse_prefix(prefix, file_size)
            except HeaderError as exc:
                raise HeaderError(f"The header of {url.rsplit('/', 1)[-1]} could not be read: {exc}.") from None
            if facts is not None:
                return facts
            if want >= min(file_size, MAX_HEADER_BYTES):
                raise HeaderError(f"The header of {url.rsplit('/', 1)[-1]} is larger than "
                                  f"{MAX_HEADER_BYTES >> 20} MiB or damaged.")
            want = min(want * 2, file_size, MAX_HEADER_BYTES)
    finally:
        if own:
            client.close()
