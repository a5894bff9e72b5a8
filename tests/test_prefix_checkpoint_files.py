"""Checkpoints as files (schema 5, issue #26): written inside their row's transaction,
verified on read, zeroed before they are unlinked, reclaimed when orphaned, migrated from
the BLOBs of schema 4; and the eviction policy by name. No model needed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from storage.block_hash import chain_keys
from storage.prefix.eviction import Leaf, least_recently_used_leaves
from storage.prefix_store import NewBlock, PrefixStore

FP = b"f" * 32
TOKENS = list(range(200))
MARK = b"\x5a\xa5checkpoint-bytes\xa5\x5a"  # to find in raw files


def payload(n: int, fill: bytes = MARK) -> bytes:
    return (fill * (n // len(fill) + 1))[:n]


def folder(path: Path) -> Path:
    return Path(f"{path}-checkpoints")


def raw_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "kv.sqlite3"


def test_a_checkpoint_is_a_private_file_and_not_a_blob(path):
    store = PrefixStore(path, budget_bytes=10**9)
    key, written = store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    assert written == 5000 and store.put_checkpoint(FP, TOKENS[:130], payload(5000)) == (key, 0)
    file = folder(path) / key.hex()
    assert file.read_bytes() == payload(5000)
    assert file.stat().st_mode & 0o777 == 0o600 and folder(path).stat().st_mode & 0o777 == 0o700
    db = sqlite3.connect(path)
    assert "data" not in {r[1] for r in db.execute("PRAGMA table_info(checkpoints)")}
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    db.close()
    assert MARK not in path.read_bytes()  # the payload is only in its file
    ref = store.lookup_checkpoint(FP, TOKENS)
    assert store.read_checkpoint(ref) == payload(5000)
    assert store.stats()["checkpoint_bytes"] == 5000
    store.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_checkpoint_file_is_dropped_on_read(path, damage):
    store = PrefixStore(path, budget_bytes=10**9)
    key, _ = store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    file = folder(path) / key.hex()
    if damage == "flip":
        data = bytearray(file.read_bytes())
        data[100] ^= 0xFF
        file.write_bytes(bytes(data))
    elif damage == "truncate":
        file.write_bytes(file.read_bytes()[:4000])
    else:
        file.unlink()
    ref = store.lookup_checkpoint(FP, TOKENS)
    assert ref is not None and store.read_checkpoint(ref) is None
    assert store.lookup_checkpoint(FP, TOKENS) is None and not file.exists()
    assert store.stats()["checkpoints"] == 0
    store.close()


def test_verify_drops_a_damaged_checkpoint_and_keeps_a_good_one(path):
    store = PrefixStore(path, budget_bytes=10**9)
    bad, _ = store.put_checkpoint(FP, TOKENS[:130], payload(3000))
    good, _ = store.put_checkpoint(FP, TOKENS[:20], payload(3000, b"other"))
    (folder(path) / bad.hex()).write_bytes(b"\0" * 3000)
    store.verify()
    assert store.stats()["checkpoints"] == 1
    assert store.read_checkpoint(store.lookup_checkpoint(FP, TOKENS)) == payload(3000, b"other")
    assert sorted(p.name for p in folder(path).iterdir()) == [good.hex()]
    store.close()


def test_evicted_forgotten_and_cleared_checkpoints_leave_no_bytes(path):
    store = PrefixStore(path, budget_bytes=12_000)
    first, _ = store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    store.put_checkpoint(FP, TOKENS[:150], payload(5000, b"second"))
    store.put_checkpoint(FP, TOKENS[:170], payload(5000, b"third"))  # over budget: the oldest goes
    assert store.stats()["evicted_checkpoints"] == 1
    assert not (folder(path) / first.hex()).exists() and MARK not in raw_bytes(path.parent)
    # A checkpoint goes with the block it hangs off: its file too.
    k0 = chain_keys(FP, TOKENS, 64)[0]
    store.put(FP, [NewBlock(k0, FP, 0, np.asarray(TOKENS[:64], dtype=np.int32), b"b" * 640)])
    hanging, _ = store.put_checkpoint(FP, TOKENS[:70], payload(100, b"hanging"))
    assert (folder(path) / hanging.hex()).exists()
    assert store.forget([TOKENS[:64]]) == 1
    assert not (folder(path) / hanging.hex()).exists() and b"hanging" not in raw_bytes(path.parent)
    store.clear()
    assert list(folder(path).iterdir()) == [] and store.stats()["checkpoints"] == 0
    assert b"second" not in raw_bytes(path.parent) and b"third" not in raw_bytes(path.parent)
    store.close()


def test_a_failed_write_leaves_neither_row_nor_file(path, monkeypatch):
    store = PrefixStore(path, budget_bytes=10**9)
    real_touch = store.checkpoints.touch

    def fail_after_the_file(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store.checkpoints, "touch", fail_after_the_file)
    with pytest.raises(Exception, match="full"):
        store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    monkeypatch.setattr(store.checkpoints, "touch", real_touch)
    assert store.stats()["checkpoints"] == 0 and list(folder(path).iterdir()) == []
    store.close()


def test_orphaned_checkpoint_files_are_reclaimed_at_open(path):
    store = PrefixStore(path, budget_bytes=10**9)
    key, _ = store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    store.close()
    (folder(path) / ("ab" * 32)).write_bytes(b"a checkpoint killed before its commit")
    (folder(path) / f"{'cd' * 32}.123.tmp").write_bytes(b"half a checkpoint")
    store = PrefixStore(path, budget_bytes=10**9)
    assert sorted(p.name for p in folder(path).iterdir()) == [key.hex()]
    assert b"killed" not in raw_bytes(path.parent) and b"half a" not in raw_bytes(path.parent)
    assert store.read_checkpoint(store.lookup_checkpoint(FP, TOKENS)) == payload(5000)
    store.close()


def test_schema_4_checkpoint_blobs_move_to_files(path):
    store = PrefixStore(path, budget_bytes=10**9)
    key, _ = store.put_checkpoint(FP, TOKENS[:130], payload(5000))
    k0 = chain_keys(FP, TOKENS, 64)[0]
    store.put(FP, [NewBlock(k0, FP, 0, np.asarray(TOKENS[:64], dtype=np.int32), b"b" * 640)])
    store.close()
    # Back to schema 4: the payload in checkpoints.data, no checkpoint file.
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE checkpoints ADD COLUMN data BLOB NOT NULL DEFAULT x''")
    db.execute("UPDATE checkpoints SET data=? WHERE key=?", ((folder(path) / key.hex()).read_bytes(), key))
    db.execute("PRAGMA user_version=4")
    db.commit()
    db.close()
    (folder(path) / key.hex()).unlink()
    store = PrefixStore(path, budget_bytes=10**9)
    assert store.read_checkpoint(store.lookup_checkpoint(FP, TOKENS)) == payload(5000)
    assert (folder(path) / key.hex()).read_bytes() == payload(5000)
    assert store.lookup(FP, TOKENS[:64]).n_tokens == 64  # the blocks stay
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    assert "data" not in {r[1] for r in db.execute("PRAGMA table_info(checkpoints)")}
    db.close()
    assert store.verify().bad == 0 and store.stats()["checkpoints"] == 1
    store.close()


def leaf(key: bytes, last_access: float, depth: int = 0, is_checkpoint: bool = False) -> Leaf:
    return Leaf(key, 10, last_access, is_checkpoint, depth)


def test_the_policy_evicts_least_recently_used_leaves_first_and_the_active_path_last():
    a, b, c, d = leaf(b"a", 3.0), leaf(b"b", 1.0), leaf(b"c", 2.0, depth=64), leaf(b"d", 2.0, depth=128, is_checkpoint=True)
    assert [x.key for x in least_recently_used_leaves([a, b, c, d], set())] == [b"b", b"d", b"c", b"a"]
    # Protected leaves wait while anything else is left.
    assert [x.key for x in least_recently_used_leaves([a, b, c, d], {b"b", b"d"})] == [b"c", b"a"]
    # When every leaf is protected, they go in the same order.
    assert [x.key for x in least_recently_used_leaves([a, b], {b"a", b"b"})] == [b"b", b"a"]
    assert least_recently_used_leaves([], {b"a"}) == []
