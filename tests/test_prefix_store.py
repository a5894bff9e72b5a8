"""The prefix store on synthetic payloads: lookup (miss, exact, extension, divergence inside
a block, longest of several candidates, tails), sharing, eviction order, budget,
checksums and statistics. Payload bytes encode their token ids so a read can be checked."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from storage.prefix_store import NewBlock, PrefixStore

FP = b"F" * 32
OTHER_FP = b"G" * 32
B = 8  # block size in tokens for these tests
BPT = 16  # payload bytes per token


def payload_for(tokens) -> bytes:
    """Each token becomes 16 bytes: its id (int32) repeated four times."""
    return np.repeat(np.asarray(tokens, dtype="<i4"), 4).tobytes()


def store_tokens(store: PrefixStore, tokens, fp: bytes = FP) -> int:
    """What the engine's snapshot does: plan, cut payloads, put. Returns bytes written."""
    missing, chain = store.plan(fp, tokens)
    blocks = [NewBlock(b.key, b.parent, b.start, b.tokens, payload_for(b.tokens)) for b in missing]
    return store.put(fp, blocks, active_path=chain)


def restored_tokens(store: PrefixStore, tokens, fp: bytes = FP) -> list[int]:
    """The token ids encoded in the payloads the store would restore for ``tokens``."""
    payloads, bad = store.read(store.lookup(fp, tokens))
    out: list[int] = []
    for data, _count, use in payloads:
        ids = np.frombuffer(data, dtype="<i4")[::4]
        out += ids[:use].tolist()
    return out


@pytest.fixture
def store(tmp_path):
    s = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    yield s
    s.close()


def seq(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def test_empty_store_misses(store):
    m = store.lookup(FP, seq(20))
    assert m.n_tokens == 0 and m.blocks == []
    assert store.stats()["misses"] == 1


def test_exact_match_restores_the_same_tokens(store):
    toks = seq(20)
    assert store_tokens(store, toks) == 20 * BPT
    assert restored_tokens(store, toks) == toks
    m = store.lookup(FP, toks)
    assert [b.n_tokens for b in m.blocks] == [8, 8, 4]  # two full blocks and a tail


def test_extension_matches_the_stored_prefix(store):
    store_tokens(store, seq(20))
    longer = seq(20) + [7, 7, 7, 7, 7]
    assert restored_tokens(store, longer) == seq(20)


def test_divergence_in_the_middle_of_a_block(store):
    store_tokens(store, seq(24))
    query = seq(19) + [1, 2, 3, 4, 5]  # differs at token 19, inside block [16, 24)
    m = store.lookup(FP, query)
    assert m.n_tokens == 19
    assert m.blocks[-1].use == 3 and m.blocks[-1].n_tokens == 8
    assert restored_tokens(store, query) == seq(19)


def test_longest_of_several_candidates(store):
    base = seq(8)
    store_tokens(store, base + [1, 2, 3])  # tail 1,2,3
    store_tokens(store, base + [1, 2, 9, 9, 9, 9])  # tail 1,2,9,...
    store_tokens(store, base + [5])
    query = base + [1, 2, 9, 9, 4]
    assert restored_tokens(store, query) == base + [1, 2, 9, 9]


def test_branches_share_blocks(store):
    prefix = seq(32)
    first = store_tokens(store, prefix + [1] * 8)
    second = store_tokens(store, prefix + [2] * 8)
    assert first == 40 * BPT
    assert second == 8 * BPT  # only the new block
    assert store.stats()["tokens"] == 48


def test_a_tail_covered_by_a_longer_block_is_dropped(store):
    store_tokens(store, seq(10))  # blocks [0,8) + tail [8,10)
    assert store.stats()["tail_blocks"] == 1
    store_tokens(store, seq(13))  # tail [8,13) covers the old tail
    s = store.stats()
    assert s["tail_blocks"] == 1 and s["tokens"] == 13
    store_tokens(store, seq(16))  # a full block now covers it
    s = store.stats()
    assert s["tail_blocks"] == 0 and s["tokens"] == 16 and s["blocks"] == 2


def test_a_tail_on_another_branch_is_kept(store):
    store_tokens(store, seq(10))
    store_tokens(store, seq(8) + [1, 2, 3])
    assert store.stats()["tail_blocks"] == 2


def test_fingerprints_never_share(store):
    store_tokens(store, seq(16))
    assert store.lookup(OTHER_FP, seq(16)).n_tokens == 0
    assert store_tokens(store, seq(16), fp=OTHER_FP) == 16 * BPT


def test_budget_is_never_exceeded_and_lru_leaves_go_first(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=40 * BPT, block_size=B)
    a = seq(16, start=1000)
    b = seq(16, start=2000)
    c = seq(16, start=3000)
    store_tokens(store, a)
    store_tokens(store, b)
    store.lookup(FP, a)  # a is now more recent than b
    store_tokens(store, c)  # 48 tokens > 40: one 8-token leaf must go, b's
    s = store.stats()
    assert s["bytes"] <= 40 * BPT
    assert restored_tokens(store, a) == a
    assert restored_tokens(store, b) == b[:8]  # b's leaf went, its root block stayed
    assert restored_tokens(store, c) == c
    store.close()


def test_active_path_is_evicted_last(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=24 * BPT, block_size=B)
    old = seq(16, start=5000)
    store_tokens(store, old)
    active = seq(24, start=7000)  # alone it fits the budget exactly; old must go entirely
    store_tokens(store, active)
    assert store.stats()["bytes"] <= 24 * BPT
    assert restored_tokens(store, active) == active
    assert restored_tokens(store, old) == []
    store.close()


def test_interior_blocks_outlive_their_descendants(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    store_tokens(store, seq(32))
    store.budget_bytes = 16 * BPT
    store.evict()
    # Only the first two blocks remain: eviction took the chain from its leaf end.
    assert restored_tokens(store, seq(32)) == seq(16)
    store.close()


def test_statistics_count_lookups_hits_and_tokens(store):
    store_tokens(store, seq(16))
    store.lookup(FP, seq(16))
    store.lookup(FP, seq(16, start=900))
    store.record_restore(16, 4)
    s = store.stats()
    assert (s["lookups"], s["hits"], s["misses"]) == (2, 1, 1)
    assert (s["tokens_restored"], s["tokens_prefilled"]) == (16, 4)
    assert s["blocks"] == 2 and s["bytes"] == 16 * BPT


def corrupt_block(path, start: int) -> None:
    """Flip one byte inside the payload of the block at token ``start``."""
    db = sqlite3.connect(path)
    (key,) = db.execute("SELECT key FROM blocks WHERE start=?", (start,)).fetchone()
    db.close()
    file = Path(f"{path}-blocks") / key.hex()
    data = bytearray(file.read_bytes())
    data[3] ^= 0xFF
    file.write_bytes(bytes(data))


def raw_bytes(folder) -> bytes:
    """Every byte of every file under ``folder`` (the index and the block files)."""
    return b"".join(p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file())


def disk_size(path) -> int:
    """The index file and its block files, in bytes."""
    blocks = Path(f"{path}-blocks")
    return Path(path).stat().st_size + sum(p.stat().st_size for p in blocks.glob("*") if p.is_file())


def test_a_bad_checksum_stops_the_restore_and_drops_the_subtree(store, tmp_path):
    toks = seq(32)
    store_tokens(store, toks)
    corrupt_block(tmp_path / "kv.sqlite3", start=8)
    payloads, bad = store.read(store.lookup(FP, toks))
    assert len(payloads) == 1 and bad == 3  # block 8 and its two descendants
    assert restored_tokens(store, toks) == seq(8)


def test_verify_reports_and_removes_damage(store, tmp_path):
    store_tokens(store, seq(32))
    store_tokens(store, seq(16) + [1] * 16)
    corrupt_block(tmp_path / "kv.sqlite3", start=16)  # two blocks start at 16: one is hit
    report = store.verify()
    assert report.checked == 6 and report.bad == 1 and report.removed == 2
    assert store.verify().bad == 0


def test_a_malformed_file_is_replaced_by_an_empty_store(tmp_path):
    path = tmp_path / "kv.sqlite3"
    path.write_bytes(b"this is not a database" * 1000)
    store = PrefixStore(path, block_size=B)
    assert store.recovered_from
    assert store.lookup(FP, seq(8)).n_tokens == 0
    store_tokens(store, seq(8))
    assert restored_tokens(store, seq(8)) == seq(8)
    store.close()


def test_clear_removes_every_block(store):
    store_tokens(store, seq(40))
    store.clear()
    assert store.stats()["blocks"] == 0
    assert store.lookup(FP, seq(40)).n_tokens == 0
    assert not any(store.files.folder.glob("*"))  # the block files are gone too


def test_clear_from_another_process_leaves_this_one_a_working_store(store, tmp_path):
    """`branchwise cache clear` while `serve` or the window has the store open: it used to
    replace the file, and every later snapshot of the running process failed ("attempt to
    write a readonly database") until it restarted."""
    store_tokens(store, seq(40))
    other = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    other.clear()
    other.close()
    assert store.lookup(FP, seq(40)).n_tokens == 0
    assert store_tokens(store, seq(24)) > 0  # the running process stores again
    assert restored_tokens(store, seq(24)) == seq(24)


# -- the file shrinks to its budget (issue 11.3) -----------------------------------------

BIG_BPT = 64 * 1024  # payload bytes per token: an 8-token block is 512 KB, like real KV


def big_payload(tokens) -> bytes:
    return np.repeat(np.asarray(tokens, dtype="<i4"), BIG_BPT // 4).tobytes()


def store_big(store: PrefixStore, tokens) -> None:
    missing, chain = store.plan(FP, tokens)
    store.put(FP, [NewBlock(b.key, b.parent, b.start, b.tokens, big_payload(b.tokens))
                   for b in missing], active_path=chain)


@pytest.mark.parametrize("budget", [5 * 1024**2, 12 * 1024**2, 1024])
def test_file_on_disk_shrinks_to_the_budget(tmp_path, budget):
    path = tmp_path / "kv.sqlite3"
    store = PrefixStore(path, budget_bytes=10**10, block_size=B)
    for i in range(8):  # 8 conversations of 32 tokens: 16 MB of blocks
        store_big(store, seq(32, start=10_000 * (i + 1)))
    assert disk_size(path) > 16 * 1024**2
    store.budget_bytes = budget
    store.evict()
    s = store.stats()
    block = B * BIG_BPT
    on_disk = disk_size(path)
    assert s["file_bytes"] == on_disk  # no WAL or journal is left behind
    assert on_disk <= budget + s["overhead_bytes"]
    assert on_disk >= budget - block  # it did not evict more than needed
    assert s["bytes"] <= budget and s["bytes"] >= budget - 2 * block
    store.close()


def test_overhead_is_the_size_of_an_empty_store(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", block_size=B)
    assert store.stats()["overhead_bytes"] == (tmp_path / "kv.sqlite3").stat().st_size
    store.close()


# -- forgetting a conversation's blocks (issue 16.4) ---------------------------------------


def test_forget_drops_unshared_blocks_and_keeps_shared_ones(tmp_path):
    path = tmp_path / "kv.sqlite3"
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    shared = seq(16, start=100)
    secret = shared + [987_654_321] * 12  # a marker token id nobody else has
    other = shared + seq(12, start=500)
    store_tokens(store, secret)
    store_tokens(store, other)
    store_tokens(store, secret, fp=OTHER_FP)  # the same tokens under another KV setting
    # Under each fingerprint: secret's block 16-24 and its tail; the shared 16 tokens stay.
    assert store.forget([secret], keep=[other]) == 2 + 2
    assert restored_tokens(store, other) == other
    assert restored_tokens(store, secret) == shared
    assert restored_tokens(store, secret, fp=OTHER_FP) == shared
    marker = np.asarray([987_654_321], dtype="<i4").tobytes()
    raw = raw_bytes(tmp_path)
    assert marker not in raw and np.asarray([500], dtype="<i4").tobytes() * 4 in raw
    assert store.forget([secret]) == 4 + 2  # nothing kept: each root's whole subtree
    assert store.stats()["blocks"] == 0
    store.close()


def test_forget_leaves_a_block_that_only_starts_the_same_way(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    secret = [1, 2, 3, 4, 5]  # shorter than a block: stored as a tail
    other = [1, 2, 3, 9, 9, 9]  # shares a "system prompt" of three tokens
    store_tokens(store, secret)
    store_tokens(store, other)
    assert store.forget([secret, secret + [6, 7]]) == 1
    assert restored_tokens(store, other) == other and restored_tokens(store, secret) == [1, 2, 3]
    store.close()


def test_evicted_blocks_leave_no_bytes_in_the_file(tmp_path):
    path = tmp_path / "kv.sqlite3"
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    marker = [987_654_321] * 8
    store_tokens(store, marker)
    store_tokens(store, seq(16, start=300))
    needle = np.asarray([987_654_321] * 4, dtype="<i4").tobytes()
    assert needle in raw_bytes(tmp_path)
    store.lookup(FP, seq(16, start=300))  # the marker is now least recently used
    store.budget_bytes = 16 * BPT
    store.evict()
    assert restored_tokens(store, marker) == [] and restored_tokens(store, seq(16, start=300))
    store.close()
    assert needle not in raw_bytes(tmp_path)


# -- block files beside the index (issue 15) -------------------------------------------------


def test_migration_from_version_3_keeps_every_block(tmp_path):
    path = tmp_path / "kv.sqlite3"
    db = sqlite3.connect(path)
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    store_tokens(store, seq(20))
    store.close()
    rows = db.execute("SELECT id, key FROM blocks").fetchall()
    db.execute("CREATE TABLE block_data(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    for rowid, key in rows:
        file = Path(f"{path}-blocks") / key.hex()
        db.execute("INSERT INTO block_data VALUES (?, ?)", (rowid, file.read_bytes()))
        file.unlink()
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    assert restored_tokens(store, seq(20)) == seq(20)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5  # 4 (block files), then 5 (checkpoint files)
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name='block_data'").fetchone()[0] == 0
    db.close()
    assert store.verify().bad == 0
    store.close()


def test_orphan_and_temporary_block_files_are_reclaimed_at_open(tmp_path):
    path = tmp_path / "kv.sqlite3"
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    store_tokens(store, seq(20))
    store.close()
    folder = Path(f"{path}-blocks")
    kept = sorted(p.name for p in folder.iterdir())
    (folder / ("ab" * 32)).write_bytes(payload_for([987_654_321] * 8))  # a write killed before its commit
    (folder / f"{'cd' * 32}.123.tmp").write_bytes(b"half a block")
    store = PrefixStore(path, budget_bytes=10**9, block_size=B)
    assert sorted(p.name for p in folder.iterdir()) == kept
    assert np.asarray([987_654_321], dtype="<i4").tobytes() not in raw_bytes(tmp_path)
    assert restored_tokens(store, seq(20)) == seq(20)
    store.close()


def test_a_missing_block_file_is_a_bad_block(store, tmp_path):
    store_tokens(store, seq(24))
    db = sqlite3.connect(tmp_path / "kv.sqlite3")
    (key,) = db.execute("SELECT key FROM blocks WHERE start=8").fetchone()
    db.close()
    (tmp_path / "kv.sqlite3-blocks" / key.hex()).unlink()
    payloads, bad = store.read(store.lookup(FP, seq(24)))
    assert [use for _, _, use in payloads] == [8] and bad == 2


def test_block_files_are_private(store, tmp_path):
    store_tokens(store, seq(20))
    folder = tmp_path / "kv.sqlite3-blocks"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o600}


def test_forget_models_deletes_every_block_and_checkpoint_of_a_fingerprint_and_no_other(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    secret = [987_654_321] * 20  # a marker token id only the removed model's blocks hold
    store_tokens(store, secret)
    store.put_checkpoint(FP, secret[:16], payload_for(secret[:16]))
    store.register_model(FP, "{}", "removed model")
    kept = seq(20, start=100)
    store_tokens(store, kept, fp=OTHER_FP)
    store.register_model(OTHER_FP, "{}", "kept model")
    assert store.stats()["checkpoints"] == 1
    assert store.forget_models([FP]) == 3  # two full blocks and a tail
    stats = store.stats()
    assert (stats["blocks"], stats["checkpoints"], stats["models"]) == (3, 0, 1)
    assert store.layout(FP) is None and store.layout(OTHER_FP) == "{}"
    assert restored_tokens(store, kept, fp=OTHER_FP) == kept
    assert restored_tokens(store, secret) == []
    assert np.asarray([987_654_321], dtype="<i4").tobytes() not in raw_bytes(tmp_path)
    assert store.forget_models([FP]) == 0 and store.forget_models([]) == 0
    store.close()
