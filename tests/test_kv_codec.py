"""The KV-state codec: split then join is byte-identical, for both V layouts; unknown
layouts are refused. Synthetic blobs follow the layout in engine/kv_codec.py; the
real-model tests pin it to the llama.cpp this project ships with."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import kv_codec
from engine.kv_codec import STATE_MAGIC, UnsupportedStateError


def make_blob(n: int, k_rows: list[int], v: list[int], v_trans: int, seed: int = 0,
              seq_id: int = 0, positions=None) -> bytes:
    """A synthetic llama_state_seq_get_data blob: random K/V bytes in the documented layout.
    ``v`` is per-layer V row bytes (v_trans 0) or (elem, dims) packed as elem*1000+dims."""
    rng = np.random.default_rng(seed)
    out = [struct.pack("<IiII", STATE_MAGIC, seq_id, 1, n)]
    pos = range(n) if positions is None else positions
    out += [struct.pack("<iIi", p, 1, seq_id) for p in pos]
    out.append(struct.pack("<II", v_trans, len(k_rows)))
    for row in k_rows:
        out.append(struct.pack("<iQ", 1, row) + rng.integers(0, 256, n * row, dtype=np.uint8).tobytes())
    for spec in v:
        if v_trans == 0:
            out.append(struct.pack("<iQ", 1, spec) + rng.integers(0, 256, n * spec, dtype=np.uint8).tobytes())
        else:
            elem, dims = divmod(spec, 1000)
            out.append(struct.pack("<iII", 1, elem, dims)
                       + rng.integers(0, 256, dims * n * elem, dtype=np.uint8).tobytes())
    return b"".join(out)


def split_join(blob: bytes, cuts: list[int], use_last: int | None = None) -> np.ndarray:
    state = kv_codec.parse(blob)
    bounds = [0, *cuts, state.n_tokens]
    payloads = []
    for a, b in zip(bounds, bounds[1:]):
        payloads.append((kv_codec.block_payload(state, a, b), b - a, b - a))
    if use_last is not None:
        p, count, _ = payloads[-1]
        payloads[-1] = (p, count, use_last)
    return kv_codec.join(state.layout, payloads)


@pytest.mark.parametrize("v_trans", [0, 1])
def test_round_trip_is_byte_identical(v_trans):
    v = [96, 96, 96] if v_trans == 0 else [2 * 1000 + 48] * 3
    blob = make_blob(150, [128, 128, 128], v, v_trans)
    assert split_join(blob, [64, 128]).tobytes() == blob


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 90),
    layers=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=4),
    v_trans=st.sampled_from([0, 1]),
    cuts=st.lists(st.integers(1, 89), max_size=5),
)
def test_round_trip_any_layout(n, layers, v_trans, cuts):
    k_rows = [k for k, _ in layers]
    v = [vv for _, vv in layers] if v_trans == 0 else [2 * 1000 + vv for _, vv in layers]
    blob = make_blob(n, k_rows, v, v_trans, seed=n)
    assert split_join(blob, sorted({c for c in cuts if c < n})).tobytes() == blob


@pytest.mark.parametrize("v_trans", [0, 1])
def test_partial_last_block_equals_the_shorter_state(v_trans):
    v = [64] * 2 if v_trans == 0 else [2 * 1000 + 32] * 2
    long = make_blob(100, [64, 64], v, v_trans, seed=3)
    state = kv_codec.parse(long)
    joined = split_join(long, [64], use_last=10)  # 64 + 10 tokens
    short = kv_codec.parse(joined)
    assert short.n_tokens == 74
    for i in range(2):
        assert np.array_equal(short.k[i], state.k[i][:74])
        if v_trans == 0:
            assert np.array_equal(short.v[i], state.v[i][:74])
        else:
            assert np.array_equal(short.v[i], state.v[i][:, :74])


def test_block_payload_size_and_layout_json():
    blob = make_blob(20, [8, 8], [4, 4], 0)
    state = kv_codec.parse(blob)
    assert state.layout.bytes_per_token == 24
    assert len(kv_codec.block_payload(state, 5, 15)) == 10 * 24
    assert kv_codec.KvLayout.from_json(state.layout.to_json()) == state.layout


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: struct.pack("<I", 0x12345678) + b[4:], "magic"),
        (lambda b: b[:8] + struct.pack("<I", 2) + b[12:], "streams"),
        (lambda b: b + b"\0", "unexpected bytes"),
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:16] + struct.pack("<iIi", 7, 1, 0) + b[28:], "positions"),
        (lambda b: b[:16] + struct.pack("<iIi", 0, 2, 0) + b[28:], "seq"),
    ],
)
def test_refuses_unknown_layouts(mutate, reason):
    blob = make_blob(10, [8], [8], 0)
    kv_codec.parse(blob)  # the unmutated blob is fine
    with pytest.raises(UnsupportedStateError):
        kv_codec.parse(mutate(blob))


def test_refuses_unknown_v_trans():
    blob = bytearray(make_blob(4, [8], [8], 0))
    off = 16 + 4 * 12
    blob[off : off + 4] = struct.pack("<I", 2)
    with pytest.raises(UnsupportedStateError):
        kv_codec.parse(bytes(blob))


def test_join_rejects_payload_of_wrong_size():
    state = kv_codec.parse(make_blob(10, [8], [8], 0))
    with pytest.raises(ValueError):
        kv_codec.join(state.layout, [(b"\0" * 17, 1, 1)])


def test_empty_state():
    state = kv_codec.parse(struct.pack("<IiII", STATE_MAGIC, 0, 1, 0))
    assert state.n_tokens == 0


@pytest.mark.parametrize("flash_attn", [True, False], ids=["v_trans=0", "v_trans=1"])
def test_real_llama_state_round_trip(model_path, flash_attn):
    """The blob of the shipped llama.cpp parses, and split/join gives it back exactly."""
    import llama_cpp

    from engine.cpu import load_llama

    llm, _ = load_llama(model_path, n_ctx=512, flash_attn=flash_attn, verbose=False)
    llm.eval(llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 12))
    size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    assert llama_cpp.llama_state_seq_get_data(llm.ctx, buf, size, 0) == size
    blob = bytes(buf)
    state = kv_codec.parse(blob)
    assert state.n_tokens == llm.n_tokens
    assert state.layout.v_trans == (0 if flash_attn else 1)
    assert state.layout.n_layer == 30  # SmolLM2-135M
    assert state.layout.bytes_per_token == 23040  # 30 layers x (K 384 + V 384) bytes, f16
    joined = split_join(blob, [64])
    assert joined.tobytes() == blob
    # llama.cpp accepts the joined blob back.
    assert llama_cpp.llama_state_seq_set_data(
        llm.ctx, joined.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), joined.nbytes, 0) == joined.nbytes
    llm.close()


def _kv_section(positions, k_rows, v_rows, seed):
    """One llama_kv_cache::state_write section (v_trans 0) at ``positions``."""
    blob = make_blob(len(positions), k_rows, v_rows, 0, seed=seed, positions=positions)
    return blob[8:]  # without magic and seq_id


def test_iswa_split_and_assemble_pad_the_window_from_position_zero():
    n, w = 100, 32
    base = _kv_section(range(n), [16, 16], [16, 16], seed=1)
    swa = _kv_section(range(n - w, n), [8, 8, 8], [8, 8, 8], seed=2)
    blob = struct.pack("<Ii", STATE_MAGIC, 0) + base + swa
    parts = kv_codec.split(blob, kv_codec.StateKind.ISWA)
    assert parts.n_tokens == n and parts.blocks.n_tokens == n and bytes(parts.partial) == swa
    assert kv_codec.partial_tokens(kv_codec.StateKind.ISWA, swa) == n
    assert kv_codec.partial_start(kv_codec.StateKind.ISWA, swa) == n - w
    payload = kv_codec.block_payload(parts.blocks, 0, n)
    out = kv_codec.assemble(kv_codec.StateKind.ISWA, parts.blocks.layout, [(payload, n, n)], swa).tobytes()
    assert out[: 8 + len(base)] == blob[: 8 + len(base)]  # the blocks come back byte for byte
    padded = kv_codec.parse(struct.pack("<Ii", STATE_MAGIC, 0) + out[8 + len(base):])
    window = kv_codec.parse(struct.pack("<Ii", STATE_MAGIC, 0) + _kv_section(range(w), [8] * 3, [8] * 3, seed=2))
    assert padded.n_tokens == n
    for got, want in zip(padded.k + padded.v, window.k + window.v):
        assert not got[: n - w].any()  # zero cells below the window
        assert np.array_equal(got[n - w :], want)
    # A window that does not end where the blocks do is refused.
    with pytest.raises(UnsupportedStateError):
        kv_codec.assemble(kv_codec.StateKind.ISWA, parts.blocks.layout, [(payload, n, n - 1)], swa)


def test_recurrent_partial_states_are_read_and_odd_ones_refused():
    recurrent = struct.pack("<IiIII", 1, 41, 0, 0, 2) + b"\x01" * 40  # cell_count, pos, n_seq_id, s_trans, n_layer
    assert kv_codec.partial_tokens(kv_codec.StateKind.RECURRENT, recurrent) == 42
    blob = struct.pack("<Ii", STATE_MAGIC, 0) + recurrent
    parts = kv_codec.split(blob, kv_codec.StateKind.RECURRENT)
    assert parts.n_tokens == 42 and parts.blocks.n_tokens == 0
    assert kv_codec.assemble(kv_codec.StateKind.RECURRENT, None, [], recurrent).tobytes() == blob
    for bad in (struct.pack("<I", 2) + recurrent[4:],  # two cells for one sequence
                struct.pack("<IiIII", 1, 41, 1, 0, 2),  # a seq-id list
                struct.pack("<IiIII", 1, 41, 0, 1, 2),  # transposed S
                b"\x01\x00"):
        with pytest.raises(UnsupportedStateError):
            kv_codec.partial_tokens(kv_codec.StateKind.RECURRENT, bad)
