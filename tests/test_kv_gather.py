"""The one-pass restore's copy (engine/kv_gather.py): each payload is checked just before
it is copied, a refused one is never copied and stops the assembly with the first bad
index, also when the copy runs on two threads; the snapshot's cut of a run of blocks
equals cutting them one by one. And the store's side (map_match, reject, prefetch)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import kv_codec
from engine.kv_gather import DamagedPayloadError
from storage.prefix.records import checksum
from storage.prefix_store import PrefixStore
from tests.test_kv_codec import make_blob

LAYOUTS = {
    "trans": ([512] * 4, [2 * 1000 + 256] * 4, 1),  # uniform, V transposed
    "rows": ([512] * 4, [512] * 4, 0),  # uniform, V by rows
    "mixed": ([512, 256, 512, 128], [2 * 1000 + 256, 2 * 1000 + 64, 2 * 1000 + 256, 2 * 1000 + 32], 1),
}


def blocks_of(state: kv_codec.ParsedState, size: int) -> list[tuple[bytes, int, int]]:
    bounds = [*range(0, state.n_tokens, size), state.n_tokens]
    return [(kv_codec.block_payload(state, a, b), b - a, b - a) for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_cut_into_a_run_equals_cutting_block_by_block(name):
    k, v, trans = LAYOUTS[name]
    state = kv_codec.parse(make_blob(300, k, v, trans, seed=3))
    per = state.layout.bytes_per_token
    # a run of 3 blocks, a gap, a run of 1, then a tail: offsets back to back
    spans = [(0, 64), (64, 128), (128, 192), (192 + 64, 256 + 32), (256 + 32, 300)]
    want, cuts, off = [], [], 0
    for a, b in spans:
        cuts.append((a, b, off))
        want.append(kv_codec.block_payload(state, a, b))
        off += (b - a) * per
    out = np.zeros(off, np.uint8)
    kv_codec.cut_into(state, cuts, out)
    assert out.tobytes() == b"".join(want)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_checked_assembly_equals_the_plain_one(name):
    k, v, trans = LAYOUTS[name]
    blob = make_blob(700, k, v, trans, seed=1)
    payloads = blocks_of(kv_codec.parse(blob), 64)
    seen = []
    out = kv_codec.join(kv_codec.parse(blob).layout, payloads, check=lambda i, p: seen.append(i) or True)
    assert out.tobytes() == blob
    assert sorted(seen) == list(range(len(payloads)))


@pytest.mark.parametrize("bad", [[2], [9], [3, 10], [0]])
def test_a_refused_payload_is_never_copied_and_the_first_bad_index_is_raised(bad):
    # 16 blocks of 64 tokens x 12 KB: over 4 MB, so the copy runs on two threads
    k, v, trans = [1536] * 4, [2 * 1000 + 768] * 4, 1
    blob = make_blob(1024, k, v, trans, seed=2)
    state = kv_codec.parse(blob)
    payloads = blocks_of(state, 64)
    poisoned = [(bytes([0xEE]) * len(p) if i in bad else p, c, u) for i, (p, c, u) in enumerate(payloads)]
    refused = {id(poisoned[i][0]) for i in bad}
    buffer = np.zeros(len(blob), np.uint8)
    with pytest.raises(DamagedPayloadError) as info:
        kv_codec.join(state.layout, poisoned, buffer=buffer, check=lambda i, p: id(p) not in refused)
    assert info.value.index == min(bad)
    assert bytes([0xEE]) * 64 not in buffer.tobytes()  # no run of a refused payload reached the state


def test_map_match_checks_lazily_and_reject_drops_the_subtree(tmp_path):
    blob = make_blob(200, [512] * 2, [2 * 1000 + 256] * 2, 1, seed=4)
    state = kv_codec.parse(blob)
    store = PrefixStore(tmp_path / "kv.sqlite3", block_size=64)
    fp = b"f" * 32
    tokens = np.arange(200, dtype=np.int32)
    missing, _ = store.plan(fp, tokens)
    from storage.prefix_store import NewBlock

    store.put(fp, [NewBlock(b.key, b.parent, b.start, b.tokens,
                            kv_codec.block_payload(state, b.start, b.start + b.n_tokens)) for b in missing])
    match = store.lookup(fp, tokens, count=False)
    assert len(match.blocks) == 4
    key = match.blocks[1].key
    path = store.files.path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))  # same size: only the checksum can tell
    store.files.drop_cache()
    mapped = store.map_blocks(match)
    assert mapped.n_bad == 0 and len(mapped.payloads) == 4  # mapping reads nothing
    assert [mapped.check(i, p) for i, (p, _, _) in enumerate(mapped.payloads)] == [True, False, True, True]
    assert mapped.checksums[0] == checksum(mapped.payloads[0][0])
    with pytest.raises(DamagedPayloadError) as info:
        kv_codec.join(state.layout, mapped.payloads, check=mapped.check)
    assert info.value.index == 1
    assert store.reject(mapped, 1) == 3  # the block and the two below it
    assert store.lookup(fp, tokens, count=False).n_tokens == 64
    # read() keeps its contract: the verified leading payloads
    payloads, bad = store.read(store.lookup(fp, tokens, count=False))
    assert bad == 0 and len(payloads) == 1
    store.close()


def test_prefetch_advises_unmapped_files_only(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", block_size=64)
    files = store.files
    keys = [bytes([i]) * 32 for i in range(3)]
    for key in keys:
        files.write(key, b"x" * 4096)
    assert files.map(keys[0]) is not None
    expected = 2 if hasattr(__import__("os"), "posix_fadvise") else 0
    assert files.prefetch([*keys, b"\x09" * 32]) == expected  # the mapped one and a missing one skipped
    store.close()
