"""Cut a llama.cpp per-sequence KV state blob into token-aligned blocks and join them back.

The blob is what ``llama_state_seq_get_data`` writes. For the llama.cpp bundled with
llama-cpp-python 0.3.36 it is laid out as follows (``src/llama-context.cpp``
``state_seq_get_data`` and ``src/llama-kv-cache.cpp`` ``state_write`` /
``state_write_meta`` / ``state_write_data``)::

    u32 magic (0xaf143cd8), i32 seq_id
    u32 n_stream
    per stream: u32 cell_count
      cell_count x { i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id }
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_size, cell_count rows of K          (token-major)
      v_trans == 0, per layer: i32 v_type, u64 v_row_size, cell_count rows of V
      v_trans == 1, per layer: i32 v_type, u32 v_elem_size, u32 n_embd_v_gqa,
                               n_embd_v_gqa runs of cell_count elements    (dimension-major)

A *block* of tokens ``[a, b)`` is stored as its payload only: for every layer the K
rows ``[a, b)``, then for every layer the V rows ``[a, b)`` (for a transposed V the
elements ``[a, b)`` of every dimension). The cell records are not stored: for the
single sequence the engine uses they are always ``pos = i, seq_id = 0`` and are
re-created by :func:`join`. The per-layer types and sizes form a :class:`KvLayout`,
which depends only on the model and the context settings.

Other memories write their sections one after the other (:class:`StateKind`):
``llama_kv_cache_iswa`` the full-attention section, then the sliding-window one, which
holds only the cells still inside the window (``state_write`` skips SWA-masked cells even
with ``swa_full``, ``src/llama-kv-cache.cpp``); ``llama_memory_recurrent`` one recurrent
section (``src/llama-memory-recurrent.cpp``); ``llama_memory_hybrid`` the attention
section, then the recurrent one (``src/llama-memory-hybrid.cpp``). With
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` they write only the second part. :func:`split`
cuts a whole state into the first section (blocks, as above) and the *partial* rest,
stored whole as a checkpoint; :func:`assemble` puts blocks and a checkpoint back together.

The format is not a stable public contract, so :func:`parse` refuses anything it does
not recognise (M-RoPE cell extensions, several streams, layers without V, positions
that are not ``0..n-1``) with :class:`UnsupportedStateError`, and the caller falls back
to prefill.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from engine.kv_gather import DamagedPayloadError, block_into, cut_into, scatter  # noqa: F401 - part of this API

STATE_MAGIC = 0xAF143CD8
_CELL_RECORD = np.dtype([("pos", "<i4"), ("n_seq_id", "<u4"), ("seq_id", "<i4")])


class UnsupportedStateError(ValueError):
    """The blob does not have the layout this codec knows; never restore from it."""


@dataclass(frozen=True)
class KvLayout:
    """The shape of one token's KV data, the same for every blob of one model and context.

    ``k_types[i]`` / ``v_types[i]`` are ggml type ids of layer ``i``; ``k_row_bytes[i]``
    is the bytes of one token's K in layer ``i``; for ``v_trans == 0`` ``v_row_bytes[i]``
    is the bytes of one token's V; for ``v_trans == 1`` ``v_elem_bytes[i]`` and
    ``v_dims[i]`` give the element size and number of dimensions of the transposed V.
    """

    v_trans: int
    k_types: tuple[int, ...]
    k_row_bytes: tuple[int, ...]
    v_types: tuple[int, ...]
    v_row_bytes: tuple[int, ...]  # v_trans == 0
    v_elem_bytes: tuple[int, ...]  # v_trans == 1
    v_dims: tuple[int, ...]  # v_trans == 1

    @property
    def n_layer(self) -> int:
        return len(self.k_types)

    @property
    def bytes_per_token(self) -> int:
        """Bytes of KV data one token occupies in a block payload."""
        v = (
            sum(self.v_row_bytes)
            if self.v_trans == 0
            else sum(e * d for e, d in zip(self.v_elem_bytes, self.v_dims))
        )
        return sum(self.k_row_bytes) + v

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: dict) -> "KvLayout":
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})

    @property
    def uniform(self) -> bool:
        """True when every layer has the same sizes (then numpy can move all layers at once)."""
        same = lambda xs: len(set(xs)) <= 1  # noqa: E731
        if self.v_trans == 0:
            return same(self.k_row_bytes) and same(self.v_row_bytes)
        return same(self.k_row_bytes) and same(self.v_elem_bytes) and same(self.v_dims)


@dataclass(frozen=True)
class ParsedState:
    """A parsed blob: its layout, its token count and zero-copy views of K and V.

    ``k[i]`` has shape ``(n_tokens, k_row_bytes[i])``; ``v[i]`` has shape
    ``(n_tokens, v_row_bytes[i])`` when ``v_trans == 0`` and
    ``(v_dims[i], n_tokens, v_elem_bytes[i])`` when ``v_trans == 1``. All uint8.
    """

    layout: KvLayout
    n_tokens: int
    k: list[np.ndarray]
    v: list[np.ndarray]
    pos0: int = 0  # position of the first cell (non-zero only for a sliding-window section)


class StateKind(StrEnum):
    """Which memory llama.cpp keeps for a model, and so how its state blob is laid out
    (``src/llama-model.cpp`` ``create_memory``; each class's ``state_write``)."""

    DENSE = "dense"  # llama_kv_cache: one KV section
    ISWA = "iswa"  # llama_kv_cache_iswa: the full-attention section, then the sliding-window one
    RECURRENT = "recurrent"  # llama_memory_recurrent: one recurrent section
    HYBRID = "hybrid"  # llama_memory_hybrid: the attention section, then the recurrent one


@dataclass(frozen=True)
class SplitState:
    """A whole-state blob cut in two: ``blocks``, the KV that can be cut at any token
    (empty for a recurrent model), and ``partial``, the rest (a sliding-window section or
    a recurrent state): what ``llama_state_seq_get_data_ext`` writes with
    ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``, without its 8-byte header. It stands for the
    state after ``n_tokens`` tokens."""

    blocks: ParsedState
    partial: memoryview
    n_tokens: int


class _Reader:
    def __init__(self, buf: memoryview):
        self.buf = buf
        self.off = 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.off + size > len(self.buf):
            raise UnsupportedStateError("KV state blob is truncated")
        vals = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return vals

    def array(self, nbytes: int) -> np.ndarray:
        if nbytes < 0 or self.off + nbytes > len(self.buf):
            raise UnsupportedStateError("KV state blob is truncated")
        out = np.frombuffer(self.buf, dtype=np.uint8, count=nbytes, offset=self.off)
        self.off += nbytes
        return out


def parse(blob: bytes | bytearray | memoryview | np.ndarray) -> ParsedState:
    """Parse a ``llama_state_seq_get_data`` blob of one sequence into K/V views.

    Args:
        blob: the bytes, as written by llama.cpp (no copy is made; views alias it).
    Returns:
        A :class:`ParsedState`; an empty sequence gives ``n_tokens == 0`` and no layers.
    Raises:
        UnsupportedStateError: the layout is not the one documented in this module.
    """
    r = _Reader(memoryview(blob).cast("B"))
    _header(r)
    state = _parse_kv(r)
    if r.off != len(r.buf):
        raise UnsupportedStateError(
            f"{len(r.buf) - r.off} unexpected bytes at the end of the KV state"
        )
    return state


def split(blob: bytes | bytearray | memoryview | np.ndarray, kind: StateKind) -> SplitState:
    """Cut a whole-state blob into its block part and its partial part.

    Raises:
        UnsupportedStateError: the blob is not laid out as ``kind`` says, or the two parts
            do not stand for the same number of tokens.
    """
    r = _Reader(memoryview(blob).cast("B"))
    _header(r)
    if kind == StateKind.RECURRENT:
        blocks = ParsedState(KvLayout(0, (), (), (), (), (), ()), 0, [], [])
    else:
        blocks = _parse_kv(r)
    partial = r.buf[r.off :]
    if kind == StateKind.DENSE:
        if len(partial):
            raise UnsupportedStateError(f"{len(partial)} unexpected bytes at the end of the KV state")
        return SplitState(blocks, partial, blocks.n_tokens)
    n = partial_tokens(kind, partial)
    if kind != StateKind.RECURRENT and n != blocks.n_tokens:
        raise UnsupportedStateError(
            f"the {kind} state's two parts stand for {blocks.n_tokens} and {n} tokens"
        )
    return SplitState(blocks, partial, n)


def partial_tokens(kind: StateKind, partial: bytes | memoryview) -> int:
    """How many tokens a partial state (a checkpoint) stands for: one past the position of
    its last cell. Checks the fields this codec relies on and refuses anything else.

    * ISWA: one ``llama_kv_cache::state_write`` section whose cells are a consecutive run
      of positions (the unmasked window).
    * RECURRENT / HYBRID: ``llama_memory_recurrent::state_write``
      (``src/llama-memory-recurrent.cpp``): u32 cell_count (0 or 1 for one sequence); per
      cell i32 pos, u32 n_seq_id (0 when one sequence is written); u32 s_trans (0),
      u32 n_layer, then per-layer R and S rows, kept as opaque bytes.

    Raises:
        UnsupportedStateError: anything else.
    """
    r = _Reader(memoryview(partial).cast("B"))
    if kind == StateKind.ISWA:
        state = _parse_kv(r, window=True)
        if r.off != len(r.buf):
            raise UnsupportedStateError("unexpected bytes after the sliding-window KV section")
        return state.pos0 + state.n_tokens
    if kind in (StateKind.RECURRENT, StateKind.HYBRID):
        (cells,) = r.take("<I")
        if cells == 0:
            return 0
        if cells != 1:
            raise UnsupportedStateError(f"{cells} recurrent cells for one sequence")
        pos, n_seq_id, s_trans, n_layer = r.take("<iIII")
        if n_seq_id != 0 or s_trans != 0 or n_layer == 0 or pos < 0:
            raise UnsupportedStateError(
                f"unknown recurrent state (n_seq_id={n_seq_id}, s_trans={s_trans}, n_layer={n_layer})"
            )
        return pos + 1
    raise UnsupportedStateError(f"a {kind} state has no partial part")


def partial_start(kind: StateKind, partial: bytes | memoryview) -> int:
    """Position of the first cell of an ISWA checkpoint's window (0 for other kinds)."""
    if kind != StateKind.ISWA:
        return 0
    return _parse_kv(_Reader(memoryview(partial).cast("B")), window=True).pos0


def _header(r: _Reader) -> None:
    magic, _seq_id = r.take("<Ii")
    if magic != STATE_MAGIC:
        raise UnsupportedStateError(f"unknown KV state magic {magic:#x}")


def _parse_kv(r: _Reader, window: bool = False) -> ParsedState:
    """One ``llama_kv_cache::state_write`` section. Cells must be one sequence at positions
    ``0..n-1``; with ``window`` any contiguous run ``a..a+n-1`` (the cells a sliding-window
    cache writes: ``src/llama-kv-cache.cpp`` skips SWA-masked cells), kept in ``pos0``."""
    (n_stream,) = r.take("<I")
    if n_stream != 1:
        raise UnsupportedStateError(f"{n_stream} KV streams (only 1 is supported)")
    (n,) = r.take("<I")
    if n == 0:
        return ParsedState(KvLayout(0, (), (), (), (), (), ()), 0, [], [])
    cells = r.array(n * _CELL_RECORD.itemsize).view(_CELL_RECORD)
    pos0 = int(cells["pos"][0]) if window else 0
    if not (np.all(cells["n_seq_id"] == 1) and np.array_equal(cells["pos"], np.arange(pos0, pos0 + n))):
        raise UnsupportedStateError("KV cells are not one sequence at consecutive positions")
    if pos0 < 0:
        raise UnsupportedStateError(f"KV cells start at position {pos0}")
    v_trans, n_layer = r.take("<II")
    if v_trans not in (0, 1) or n_layer == 0:
        raise UnsupportedStateError(f"unknown KV layout (v_trans={v_trans}, n_layer={n_layer})")
    k_types, k_rows, k = [], [], []
    for _ in range(n_layer):
        t, row = r.take("<iQ")
        k_types.append(t)
        k_rows.append(row)
        k.append(r.array(n * row).reshape(n, row))
    v_types, v_rows, v_elems, v_dims, v = [], [], [], [], []
    for _ in range(n_layer):
        if v_trans == 0:
            t, row = r.take("<iQ")
            v_rows.append(row)
            v.append(r.array(n * row).reshape(n, row))
        else:
            t, elem, dims = r.take("<iII")
            v_elems.append(elem)
            v_dims.append(dims)
            v.append(r.array(dims * n * elem).reshape(dims, n, elem))
        v_types.append(t)
    layout = KvLayout(
        v_trans, tuple(k_types), tuple(k_rows), tuple(v_types),
        tuple(v_rows), tuple(v_elems), tuple(v_dims),
    )
    return ParsedState(layout, n, k, v, pos0)


def block_payload(state: ParsedState, start: int, stop: int) -> bytes:
    """The payload of the block of tokens ``[start, stop)``: K of every layer, then V.

    Size is ``(stop - start) * state.layout.bytes_per_token`` bytes.
    """
    return block_into(state, start, stop, np.empty((stop - start) * state.layout.bytes_per_token, np.uint8)).tobytes()


def join(
    layout: KvLayout,
    payloads: list[tuple[bytes | memoryview | None, int, int]],
    seq_id: int = 0,
    buffer: np.ndarray | None = None,
    check: Callable[[int, Any], bool] | None = None,
) -> np.ndarray:
    """Re-create a ``llama_state_seq_set_data`` blob from consecutive blocks.

    Args:
        layout: the layout the payloads were cut with.
        payloads: ``(payload, n_tokens_in_payload, n_tokens_to_use)`` in token order;
            ``n_tokens_to_use <= n_tokens_in_payload`` takes only the first tokens of a
            block (a longest-common-prefix match that ends inside a block). A payload of
            None stands for zeros.
        seq_id: the sequence id written into the cell records.
        buffer: a uint8 array to write into when it is large enough (reusing memory that
            is already paged in saves ~2 ms per 10 MB on a first restore).
        check: ``check(i, payload) -> bool``, called for each payload just before it is
            copied (``engine.kv_gather.scatter``); False stops the assembly.
    Returns:
        A contiguous uint8 array holding the blob (pass ``arr.ctypes.data`` to llama.cpp).
    Raises:
        ValueError: a payload's size does not match ``n_tokens * layout.bytes_per_token``.
        DamagedPayloadError: ``check`` refused a payload (``.index``); discard the blob.
    """
    return assemble(StateKind.DENSE, layout, payloads, None, seq_id, buffer, check)


def kv_section_bytes(layout: KvLayout, n: int) -> int:
    """Bytes of one ``llama_kv_cache::state_write`` section holding ``n`` cells."""
    L = layout.n_layer
    return 8 + n * _CELL_RECORD.itemsize + 8 + L * 12 + L * 12 + n * layout.bytes_per_token


def assemble(
    kind: "StateKind",
    layout: KvLayout | None,
    payloads: list[tuple[bytes | memoryview | None, int, int]],
    partial: bytes | memoryview | None,
    seq_id: int = 0,
    buffer: np.ndarray | None = None,
    check: Callable[[int, Any], bool] | None = None,
    pos0: int = 0,
) -> np.ndarray:
    """A whole-state blob for ``llama_state_seq_set_data``: the blocks (as :func:`join`)
    followed by a checkpoint's partial state (:func:`partial_tokens` describes it).

    ``pos0`` is the position of the first block's first token: a piece of a dense state
    to append after ``pos0`` live tokens (``LiveContext.append``); it must be 0 with a
    checkpoint.

    For :attr:`StateKind.ISWA` the sliding-window section of the checkpoint holds only
    the cells of the window; it is written back padded with zero cells from position 0, so
    llama.cpp places every cell at the same index as a from-scratch prefill would (masked
    cells weigh exactly 0 in attention, and equal cell indices keep the summation order,
    hence the bits, of the attention output). :attr:`StateKind.RECURRENT` has no blocks.

    ``check`` verifies each block payload just before it is copied (see :func:`join`).

    Raises:
        ValueError / UnsupportedStateError: the pieces do not fit together.
        DamagedPayloadError: ``check`` refused a block payload; discard the blob.
    """
    n = sum(use for _, _, use in payloads)
    swa: ParsedState | None = None
    tail = b""
    if pos0 and (partial is not None or kind == StateKind.RECURRENT):
        raise ValueError("a state with a checkpoint starts at position 0")
    if partial is not None:
        if kind == StateKind.ISWA:
            r = _Reader(memoryview(partial).cast("B"))
            swa = _parse_kv(r, window=True)
            if r.off != len(r.buf) or swa.pos0 + swa.n_tokens != n or swa.n_tokens == 0:
                raise UnsupportedStateError("the sliding-window checkpoint does not end where the blocks do")
        else:
            if kind == StateKind.HYBRID and partial_tokens(kind, partial) != n:
                raise UnsupportedStateError("the recurrent checkpoint does not end where the blocks do")
            tail = partial
    total = 8
    if kind != StateKind.RECURRENT:
        assert layout is not None
        total += kv_section_bytes(layout, n)
    if swa is not None:
        total += kv_section_bytes(swa.layout, n)
    total += len(tail)
    if buffer is not None and buffer.nbytes >= total:
        out = buffer[:total]
    else:
        out = np.empty(total, dtype=np.uint8)
    struct.pack_into("<Ii", out, 0, STATE_MAGIC, seq_id)
    off = 8
    if kind != StateKind.RECURRENT:
        off = _write_kv(out, off, layout, payloads, n, seq_id, check, pos0)
    if swa is not None:
        front = [(None, swa.pos0, swa.pos0)] if swa.pos0 else []
        body = block_payload(swa, 0, swa.n_tokens)
        off = _write_kv(out, off, swa.layout, [*front, (body, swa.n_tokens, swa.n_tokens)], n, seq_id)
    if len(tail):
        out[off:] = np.frombuffer(tail, dtype=np.uint8)
        off += len(tail)
    assert off == total
    return out


def _write_kv(out: np.ndarray, off: int, layout: KvLayout, payloads, n: int, seq_id: int,
              check: Callable[[int, Any], bool] | None = None, pos0: int = 0) -> int:
    """Write one KV section of ``n`` cells (positions pos0..pos0+n-1) at ``out[off:]``; returns
    the offset after it. The payloads are copied by ``engine.kv_gather.scatter`` (which
    calls ``check``)."""
    L = layout.n_layer
    k_rows = layout.k_row_bytes
    start = off
    struct.pack_into("<II", out, off, 1, n)
    off += 8
    cells = out[off : off + n * _CELL_RECORD.itemsize].view(_CELL_RECORD)
    cells["pos"] = np.arange(pos0, pos0 + n, dtype=np.int32)
    cells["n_seq_id"] = 1
    cells["seq_id"] = seq_id
    off += n * _CELL_RECORD.itemsize
    struct.pack_into("<II", out, off, layout.v_trans, L)
    off += 8

    # Destination views, one per layer, into ``out``.
    k_dst: list[np.ndarray] = []
    for i in range(L):
        struct.pack_into("<iQ", out, off, layout.k_types[i], k_rows[i])
        off += 12
        k_dst.append(out[off : off + n * k_rows[i]].reshape(n, k_rows[i]))
        off += n * k_rows[i]
    v_dst: list[np.ndarray] = []
    for i in range(L):
        if layout.v_trans == 0:
            row = layout.v_row_bytes[i]
            struct.pack_into("<iQ", out, off, layout.v_types[i], row)
            off += 12
            v_dst.append(out[off : off + n * row].reshape(n, row))
            off += n * row
        else:
            elem, dims = layout.v_elem_bytes[i], layout.v_dims[i]
            struct.pack_into("<iII", out, off, layout.v_types[i], elem, dims)
            off += 12
            v_dst.append(out[off : off + dims * n * elem].reshape(dims, n, elem))
            off += dims * n * elem
    assert off - start == kv_section_bytes(layout, n)

    # Check every payload's size first, then copy them into their disjoint ranges of
    # ``out`` (on two threads when they are large).
    entries = []
    pos = 0
    for payload, count, use in payloads:
        if payload is not None and (memoryview(payload).nbytes != count * layout.bytes_per_token or use > count):
            raise ValueError(
                f"block payload of {memoryview(payload).nbytes} bytes does not hold {count} tokens of "
                f"{layout.bytes_per_token} bytes"
            )
        entries.append((payload, count, use, pos))
        pos += use
    if pos != n:
        raise ValueError(f"payloads hold {pos} tokens, expected {n}")
    scatter(layout, k_dst, v_dst, entries, check)
    return off
