"""Moving KV bytes between a state blob's layout and block payloads (``engine.kv_codec``
describes both layouts): :func:`block_into` cuts one block out of a parsed state,
:func:`scatter` copies blocks into the per-layer views of a state being assembled, each
block's checksum checked just before its bytes are copied (the one pass of a restore).

Both move whole runs at a time. A run is what is contiguous on both sides: one layer's K
rows of a block (``n_tokens x k_row_bytes``) and, for a transposed V, one dimension's
elements of a block (``n_tokens x elem`` bytes, 128 bytes for a 64-token block of f16).
Each run is viewed as one numpy element of a void dtype of that size, so numpy copies
a run per element of its inner loop instead of stepping an iterator once per run
(measured with ``branchwise bench``: the transposed-V gather of a 48 MB state about 1.7
times faster). When every layer has the same sizes, all layers move in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from storage.parallel import in_halves

if TYPE_CHECKING:
    from engine.kv_codec import KvLayout, ParsedState


class DamagedPayloadError(Exception):
    """A block payload failed its checksum during :func:`scatter`; ``index`` is the first
    such payload (every payload before it passed). The state being assembled must not be
    handed to llama.cpp."""

    def __init__(self, index: int):
        super().__init__(f"block payload {index} failed its checksum")
        self.index = index


def merge_last(a: np.ndarray) -> np.ndarray:
    """``a`` of shape ``(..., m, e)`` with contiguous ``(m, e)`` rows as ``(..., m * e)``: a
    view, never a copy (setting ``shape`` raises rather than copy), so writes go through."""
    out = a.view()
    out.shape = (*a.shape[:-2], a.shape[-2] * a.shape[-1])
    return out


def reshaped(a: np.ndarray, *shape: int) -> np.ndarray:
    """``a.reshape(shape)`` as a view; raises AttributeError where numpy would copy (a
    copy would drop the writes made through it)."""
    out = a.view()
    out.shape = shape
    return out


def runs(a: np.ndarray) -> np.ndarray:
    """``a`` (uint8, last axis contiguous) with its last axis as one element of a void
    dtype of that many bytes: shape ``a.shape[:-1]``. A view; writes go through."""
    return a.view(np.dtype(f"V{a.shape[-1]}"))[..., 0]


def stacked(views: Sequence[np.ndarray]) -> np.ndarray | None:
    """One ``(len(views), *shape)`` view over equally shaped, equally strided views placed
    at a constant distance from each other in one buffer (the layers of a state blob), or
    None when they are not."""
    first = views[0]
    if any(v.shape != first.shape or v.strides != first.strides for v in views):
        return None
    addr = [v.ctypes.data for v in views]
    step = addr[1] - addr[0] if len(views) > 1 else first.nbytes
    if any(b - a != step for a, b in zip(addr, addr[1:])):
        return None
    return np.lib.stride_tricks.as_strided(first, shape=(len(views), *first.shape),
                                           strides=(step, *first.strides))


def block_into(state: ParsedState, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Write the payload of the block of tokens ``[start, stop)`` into ``out`` (a uint8
    array of at least ``(stop - start) * state.layout.bytes_per_token`` bytes) and return
    the part written: the K rows of each layer, then V (a transposed V, strided in the
    state, is gathered a ``dims x (stop - start)`` box per layer).

    One contiguous payload is what the store checksums and writes in one call each.

    Raises:
        ValueError: ``[start, stop)`` is not inside the state.
    """
    if not 0 <= start < stop <= state.n_tokens:
        raise ValueError(f"block [{start}, {stop}) outside 0..{state.n_tokens}")
    n = stop - start
    layout = state.layout
    out = out[: n * layout.bytes_per_token]
    k_all = stacked(state.k)
    v_all = stacked(state.v)
    if k_all is not None and v_all is not None:  # every layer alike: two copies in all
        k_part = k_all.shape[0] * n * k_all.shape[2]
        runs(out[:k_part].reshape(k_all.shape[0], -1))[:] = runs(merge_last(k_all[:, start:stop]))
        if layout.v_trans == 0:
            runs(out[k_part:].reshape(v_all.shape[0], -1))[:] = runs(merge_last(v_all[:, start:stop]))
        else:
            L, dims, _, elem = v_all.shape
            runs(out[k_part:].reshape(L, dims, n * elem))[:] = runs(merge_last(v_all[:, :, start:stop]))
        return out
    off = 0
    for k in state.k:
        size = n * k.shape[1]
        out[off : off + size] = k[start:stop].reshape(-1)
        off += size
    for v in state.v:
        if layout.v_trans == 0:
            size = n * v.shape[1]
            out[off : off + size] = v[start:stop].reshape(-1)
        else:
            dims, _, elem = v.shape
            size = dims * n * elem
            runs(out[off : off + size].reshape(dims, n * elem))[:] = runs(merge_last(v[:, start:stop]))
        off += size
    assert off == out.nbytes
    return out


Entry = tuple[Any, int, int, int]
"""``(payload or None, n_tokens in it, tokens to use, position of its first token)``."""


def scatter(layout: KvLayout, k_dst: list[np.ndarray], v_dst: list[np.ndarray], entries: Sequence[Entry],
            check: Callable[[int, Any], bool] | None = None) -> None:
    """Copy block payloads into the per-layer destination views of a state being
    assembled: ``k_dst[i]`` of shape ``(n, k_row_bytes[i])``, ``v_dst[i]`` of shape
    ``(n, v_row_bytes[i])`` or, transposed, ``(dims, n, elem)``. A payload of None writes
    zeros. Work of 4 MB or more is split over two threads (``storage.parallel``).

    ``check(i, payload)`` is called for payload ``i`` on the thread that copies it, just
    before the copy, so the bytes it reads are in the CPU cache when they are copied.

    Raises:
        DamagedPayloadError: ``check`` refused a payload (the smallest such index; the
            destination then holds unchecked bytes and must be discarded).
    """
    L = layout.n_layer
    k_rows = layout.k_row_bytes
    v_sizes = layout.v_row_bytes if layout.v_trans == 0 else tuple(
        e * d for e, d in zip(layout.v_elem_bytes, layout.v_dims))
    k_all, v_all = (stacked(k_dst), stacked(v_dst)) if layout.uniform and k_dst and v_dst else (None, None)

    def zero(pos: int, use: int) -> None:
        for d in k_dst:
            d[pos : pos + use] = 0
        for d in v_dst:
            if layout.v_trans == 0:
                d[pos : pos + use] = 0
            else:
                d[:, pos : pos + use] = 0

    def copy_uniform(src: np.ndarray, count: int, use: int, pos: int) -> None:
        k_part = count * sum(k_rows)
        runs(merge_last(k_all[:, pos : pos + use]))[:] = runs(src[:k_part].reshape(L, count * k_rows[0])[:, : use * k_rows[0]])
        if layout.v_trans == 0:
            runs(merge_last(v_all[:, pos : pos + use]))[:] = runs(src[k_part:].reshape(L, count * v_sizes[0])[:, : use * v_sizes[0]])
        else:
            dims, elem = layout.v_dims[0], layout.v_elem_bytes[0]
            vs = src[k_part:].reshape(L, dims, count * elem)[:, :, : use * elem]
            runs(merge_last(v_all[:, :, pos : pos + use]))[:] = runs(vs)

    def copy_layers(src: np.ndarray, count: int, use: int, pos: int) -> None:
        o = 0
        for i in range(L):
            size = count * k_rows[i]
            k_dst[i][pos : pos + use] = src[o : o + size].reshape(count, k_rows[i])[:use]
            o += size
        for i in range(L):
            size = count * v_sizes[i]
            if layout.v_trans == 0:
                v_dst[i][pos : pos + use] = src[o : o + size].reshape(count, v_sizes[i])[:use]
            else:
                d, e = layout.v_dims[i], layout.v_elem_bytes[i]
                runs(merge_last(v_dst[i][:, pos : pos + use]))[:] = runs(src[o : o + size].reshape(d, count * e)[:, : use * e])
            o += size

    fast = k_all is not None and v_all is not None

    def part(items: Sequence[tuple[int, Entry]]) -> list[int]:
        for i, (payload, count, use, pos) in items:
            if payload is None:
                zero(pos, use)
                continue
            if check is not None and not check(i, payload):
                return [i]
            (copy_uniform if fast else copy_layers)(np.frombuffer(payload, dtype=np.uint8), count, use, pos)
        return []

    total = sum(use for _, _, use, _ in entries) * layout.bytes_per_token
    bad = in_halves(part, list(enumerate(entries)), total)
    if bad:
        raise DamagedPayloadError(min(bad))


def cut_into(state: ParsedState, blocks: Sequence[tuple[int, int, int]], out: np.ndarray) -> None:
    """Write the payloads of ``blocks`` (``(start, stop, offset)``: tokens ``[start, stop)``
    of ``state`` to ``out[offset:]``, each as :func:`block_into` writes it).

    A run of consecutive equal blocks stored back to back (a first snapshot's chain) is
    cut a layer at a time across all its blocks, the layers split over two threads: per
    block, a transposed V is a column of 128-byte pieces down every row of the state,
    and reading the rows of one layer (a few hundred KB) for all blocks while they are in
    the CPU cache halved the time of the cut against a block at a time (measured with
    ``branchwise bench``'s snapshot). Other blocks are cut one by one.

    Raises:
        ValueError: a block is not inside the state.
    """
    per_token = state.layout.bytes_per_token
    k_all = stacked(state.k) if state.k else None
    v_all = stacked(state.v) if state.v else None
    i = 0
    while i < len(blocks):
        start, stop, off = blocks[i]
        j = i + 1
        m = stop - start
        while (j < len(blocks) and blocks[j][1] - blocks[j][0] == m and blocks[j][0] == blocks[j - 1][1]
               and blocks[j][2] == blocks[j - 1][2] + m * per_token):
            j += 1
        if j - i < 2 or k_all is None or v_all is None or not 0 <= start < blocks[j - 1][1] <= state.n_tokens:
            block_into(state, start, stop, out[off:])
            i += 1
            continue
        _cut_run(state, k_all, v_all, start, m, j - i, out[off : off + (j - i) * m * per_token])
        i = j


def _cut_run(state: ParsedState, k_all: np.ndarray, v_all: np.ndarray, start: int, m: int, nb: int,
             out: np.ndarray) -> None:
    """``nb`` blocks of ``m`` tokens from ``start``, back to back in ``out``, a layer at a time."""
    L, kr = k_all.shape[0], k_all.shape[2]
    stop = start + nb * m
    pay = reshaped(out, nb, out.nbytes // nb)
    k_part = L * m * kr
    kd = reshaped(pay[:, :k_part], nb, L, m * kr)
    if state.layout.v_trans == 0:
        vr = v_all.shape[2]
        vd = reshaped(pay[:, k_part:], nb, L, m * vr)
        vs = reshaped(v_all[:, start:stop], L, nb, m * vr)
    else:
        _, dims, _, elem = v_all.shape
        vd = reshaped(pay[:, k_part:], nb, L, dims, m * elem)
        vs = reshaped(v_all[:, :, start:stop], L, dims, nb, m * elem).transpose(0, 2, 1, 3)
    ks = reshaped(k_all[:, start:stop], L, nb, m * kr)

    def layers(part: Sequence[int]) -> list[None]:
        for layer in part:
            runs(kd[:, layer])[:] = runs(ks[layer])
            runs(vd[:, layer])[:] = runs(vs[layer])
        return []

    in_halves(layers, range(L), out.nbytes)
