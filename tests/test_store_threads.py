"""The prefix store's two-thread paths (storage/parallel.py): checksums and block writes
split across a helper thread, and block files kept mapped between restores. Payloads here
are large enough (8 MB per conversation) to take the two-thread path; each token's bytes
encode its id, so a read can be checked."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import xxhash

from storage import parallel
from storage.block_files import BlockFiles
from storage.prefix_store import NewBlock, PrefixStore, StoreFull

FP = b"F" * 32
B = 8  # tokens per block
BPT = 64 * 1024  # payload bytes per token: 512 KB blocks, 16 of them for 128 tokens


def payload_for(tokens) -> bytes:
    return np.repeat(np.asarray(tokens, dtype="<i4"), BPT // 4).tobytes()


def store_tokens(store: PrefixStore, tokens) -> int:
    missing, chain = store.plan(FP, tokens)
    return store.put(FP, [NewBlock(b.key, b.parent, b.start, b.tokens, payload_for(b.tokens)) for b in missing],
                     active_path=chain)


def restored(store: PrefixStore, tokens) -> tuple[list[int], int]:
    payloads, bad = store.read(store.lookup(FP, tokens))
    ids: list[int] = []
    for data, _count, use in payloads:
        ids += np.frombuffer(data, dtype="<i4")[:: BPT // 4][:use].tolist()
    return ids, bad


def corrupt(path: Path, start: int) -> None:
    """Flip one byte of the block at token ``start``, in place (the same file)."""
    db = sqlite3.connect(path)
    (key,) = db.execute("SELECT key FROM blocks WHERE start=?", (start,)).fetchone()
    db.close()
    with open(Path(f"{path}-blocks") / key.hex(), "r+b") as f:
        f.seek(BPT * 3 + 5)
        byte = f.read(1)
        f.seek(BPT * 3 + 5)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.fixture
def store(tmp_path):
    s = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10**9, block_size=B)
    yield s
    s.close()


TOKENS = list(range(1000, 1128))  # 16 blocks, 8 MB


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, (1 << 20) + 3])
def test_xxh3_equals_the_xxhash_module(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert parallel.xxh3_64(data) == xxhash.xxh3_64_intdigest(data.tobytes())
    words = data[: size // 4 * 4].view("<i4").reshape(-1, 1)  # a 2-D int32 buffer: read as bytes
    assert parallel.xxh3_64(words) == xxhash.xxh3_64_intdigest(words.tobytes())


def test_in_halves_keeps_order_and_raises_after_both_halves(monkeypatch):
    if parallel._helper() is None:
        pytest.skip("one CPU: no helper thread")
    items = list(range(10))
    assert parallel.in_halves(lambda part: [i * i for i in part], items, 1 << 30) == [i * i for i in items]
    seen: list[int] = []

    def fail_first_half(part):
        if 0 in part:
            raise OSError(errno.ENOSPC, "full")
        seen.extend(part)
        return list(part)

    with pytest.raises(OSError):
        parallel.in_halves(fail_first_half, items, 1 << 30)
    assert seen == [5, 6, 7, 8, 9]  # the second half ran to its end


@pytest.mark.parametrize("bad_starts, good", [([96], 96), ([24, 96], 24), ([0], 0)])
def test_the_first_bad_block_stops_the_restore_wherever_it_is(store, tmp_path, bad_starts, good):
    store_tokens(store, TOKENS)
    assert restored(store, TOKENS) == (TOKENS, 0)  # maps every file (kept for the next read)
    for start in bad_starts:
        corrupt(tmp_path / "kv.sqlite3", start)
    ids, bad = restored(store, TOKENS)
    assert ids == TOKENS[:good]
    assert bad == (128 - good) // B  # the bad block and every block after it
    assert store.stats()["blocks"] == good // B


def test_a_failed_write_on_either_thread_leaves_no_row_and_no_file(store, tmp_path, monkeypatch):
    missing, chain = store.plan(FP, TOKENS)
    real = store.files.write

    def full_disk(key, data):
        if key == missing[12].key:  # in the helper thread's half or the caller's: one of them
            raise OSError(errno.ENOSPC, "No space left on device")
        real(key, data)

    monkeypatch.setattr(store.files, "write", full_disk)
    with pytest.raises(StoreFull):
        store_tokens(store, TOKENS)
    assert store.stats()["blocks"] == 0
    assert store.files.names() == []
    monkeypatch.undo()
    assert store_tokens(store, TOKENS) == len(TOKENS) * BPT
    assert restored(store, TOKENS) == (TOKENS, 0)


def test_a_callable_payload_is_made_once_on_the_writing_thread(store):
    missing, chain = store.plan(FP, TOKENS)
    calls: list[int] = []

    def later(b):
        def make():
            calls.append(b.start)
            return payload_for(b.tokens)
        return make

    blocks = [NewBlock(b.key, b.parent, b.start, b.tokens, later(b), B * BPT) for b in missing]
    assert store.put(FP, blocks, active_path=chain) == len(TOKENS) * BPT
    assert sorted(calls) == list(range(0, 128, B))
    assert restored(store, TOKENS) == (TOKENS, 0)


@pytest.mark.skipif(os.name != "posix", reason="mappings are not kept on Windows")
def test_a_kept_mapping_never_serves_a_replaced_or_scrubbed_file(tmp_path):
    files = BlockFiles(tmp_path / "blocks")
    key = b"k" * 32
    files.write(key, b"a" * 4096)
    first = files.map(key)
    assert files.map(key) is first  # kept: no new mapping
    files.write(key, b"b" * 4096)  # a new file under the same name (a new inode)
    assert bytes(files.map(key)) == b"b" * 4096
    assert bytes(first) == b"a" * 4096  # an old view still reads what it mapped
    files.scrub([key])
    assert files.map(key) is None
    assert files.map(key, cache=False) is None


def test_a_block_file_is_not_zeroed_while_a_restore_copies_it(tmp_path):
    """A restore checks a mapped block, then copies it; zeroing it in between (a scrub in
    another process: eviction, forget, delete) made a restore copy zeros (a tester's race).
    The scrub now waits for the restore's shared lock (``BlockFiles.reading``)."""
    import threading
    import time

    files = BlockFiles(tmp_path / "kvcache.sqlite3-blocks")
    key = bytes(range(32))
    files.write(key, b"\x07" * 65536)
    other = BlockFiles(tmp_path / "kvcache.sqlite3-blocks")  # another process's view of the folder
    done = threading.Event()
    with files.reading():
        view = files.map(key)
        scrub = threading.Thread(target=lambda: (other.scrub([key]), done.set()))
        scrub.start()
        time.sleep(0.3)
        assert not done.is_set() and bytes(view[:4]) == b"\x07" * 4  # still the checked bytes
    scrub.join(10)
    assert done.is_set() and not files.path(key).exists()
    lock = tmp_path / "kvcache.sqlite3-blocks.lock"
    assert lock.is_file() and lock.stat().st_mode & 0o777 == 0o600


def test_a_link_planted_as_the_lock_is_not_followed(tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("not Branchwise's")
    (tmp_path / "kvcache.sqlite3-blocks.lock").symlink_to(target)
    files = BlockFiles(tmp_path / "kvcache.sqlite3-blocks")
    key = bytes(range(32))
    files.write(key, b"\x01" * 100)
    with files.reading():
        pass
    files.scrub([key])  # no lock to take: the scrub goes on, the link's target untouched
    assert target.read_text() == "not Branchwise's" and not files.path(key).exists()
