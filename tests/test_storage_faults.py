"""Storage and the CLI under faults (issue 11): a full disk at four levels, a refused
message, input too long for a command line, a model path that is not UTF-8, and the
Markdown export's note on the branches it leaves out.

The full-disk tests need a small file system: a 4 MB tmpfs mounted for the test (this
needs root, which the test machine and CI have). A data folder holding two
conversations and a valid KV cache is copied onto it, a filler file leaves 8 KB, 40 KB,
200 KB or 1 MB free, and ``chat --conversation 1 "Continue please"`` runs on the
default model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import pytest

from storage.chats import ChatStore
from storage.errors import StorageFullError
from storage.paths import CHATS_DB, KVCACHE_DB
from storage.prefix_store import PrefixStore, StoreFull

FS_BYTES = 4 * 1024**2
ENGINE = ["--temperature", "0", "--max-tokens", "6", "--ctx-size", "512"]


def bw(data_dir, *args, stdin: bytes | None = None, timeout: float = 600):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          env=env, timeout=timeout, input=stdin)


def _mount_tmpfs(size: int) -> Path | None:
    """A fresh tmpfs of ``size`` bytes, or None when this process may not mount one."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
        return None
    where = Path(tempfile.mkdtemp(prefix="bw-small-fs-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                       capture_output=True)
    if r.returncode != 0:
        where.rmdir()
        return None
    return where


def _umount(where: Path) -> None:
    subprocess.run(["umount", str(where)], check=False)
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def small_fs():
    where = _mount_tmpfs(FS_BYTES)
    if where is None:
        pytest.skip("mounting a 4 MB tmpfs needs root (mount -t tmpfs); run as root, as CI does")
    yield where
    _umount(where)


@pytest.fixture(scope="module")
def two_conversations(tmp_path_factory):
    """A data folder made by the CLI: conversation 1 (one turn, its KV in the cache) and
    conversation 2 (stored directly)."""
    d = tmp_path_factory.mktemp("full-disk-source")
    r = bw(d, "chat", "--json", *ENGINE, "Name three rivers in Europe.")
    assert r.returncode == 0, r.stderr.decode()
    with ChatStore(d / CHATS_DB) as chats:
        other = chats.create_conversation(title="Second")
        chats.add_message(other.id, None, "user", "Another question")
    with closing(sqlite3.connect(d / CHATS_DB)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return d


def _fill(folder: Path, leave: int) -> None:
    """Write a filler file so that about ``leave`` bytes stay free on ``folder``'s disk."""
    free = shutil.disk_usage(folder.parent).free
    with open(folder.parent / "filler", "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
        except OSError:  # leave == 0: the disk is full now
            pass
    assert abs(shutil.disk_usage(folder.parent).free - leave) <= 8192


def _blocks(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT count(*) FROM blocks").fetchone()[0]


@pytest.mark.parametrize("free_kb", [8, 40, 200, 1024])
def test_full_disk_is_named_and_only_the_cache_is_touched(small_fs, two_conversations, free_kb):
    data = small_fs / "data"
    shutil.copytree(two_conversations, data)
    blocks_before = _blocks(data / KVCACHE_DB)
    assert blocks_before > 0
    _fill(data, free_kb * 1024)
    r = bw(data, "chat", "--json", "--conversation", "1", *ENGINE, "Continue please")
    out, err = r.stdout.decode(), r.stderr.decode()
    assert "Traceback" not in err
    assert "may be damaged" not in out + err and "disk I/O error" not in out + err
    result = json.loads(out)  # exactly one JSON object, whatever happened
    assert out.strip().count("\n") == 0
    # The valid cache is never deleted for lack of space.
    assert (data / KVCACHE_DB).exists() and _blocks(data / KVCACHE_DB) >= 1
    (data.parent / "filler").unlink()
    with ChatStore(data / CHATS_DB) as chats:
        path = [m.content for m in chats.active_path(1)]
        assert len(chats.list_conversations()) == 2  # nothing lost
    if r.returncode == 0:
        assert result["saved"]["reply"] is True and result["text"]
        assert path[-2:] == ["Continue please", result["text"]]
    else:
        assert result["saved"] is None or result["saved"]["reply"] is False
        assert "is full" in result["error"] and str(data) in result["error"]
        assert " free)" in result["error"]
        assert path[-1] != "Continue please" or result["saved"]  # no unanswered message
    if free_kb >= 200:  # room for the reply: the turn is answered and says so
        assert r.returncode == 0, err
        assert result["saved"]["user_message"] and result["saved"]["reply"]
    if free_kb == 8:  # not even the chat database's shared-memory file fits
        assert r.returncode == 1
        assert re.search(r"is full \(\d[\d.]* (bytes|KB|MB) free\)", result["error"])


def test_on_a_full_disk_the_chats_can_still_be_read_and_exported(small_fs, two_conversations):
    """Opening the chat database needs room for SQLite's WAL index, so on a disk with 0 bytes
    free `conversations list` failed, and the chats could not even be exported to make room.
    It is now opened read-only there (chats.sqlite3 is whole on its own after a clean close):
    list, show and export work; a change says the disk is full, with the free space."""
    data = small_fs / "data"
    shutil.copytree(two_conversations, data)
    _fill(data, 0)
    try:
        listed = bw(data, "conversations", "list")
        shown = bw(data, "conversations", "show", "2")
        exported = bw(data, "conversations", "export", "--all")
        deleted = bw(data, "conversations", "delete", "2")
    finally:
        (data.parent / "filler").unlink()
    assert listed.returncode == 0 and listed.stdout.decode().splitlines()[0].endswith("Second")
    assert shown.returncode == 0 and "Another question" in shown.stdout.decode()
    assert exported.returncode == 0 and len(json.loads(exported.stdout)["conversations"]) == 2
    assert deleted.returncode == 1 and deleted.stderr.decode().startswith(
        f"branchwise: The disk holding {data} is full (0 bytes free)")
    assert "Traceback" not in deleted.stderr.decode()
    assert bw(data, "conversations", "show", "2").returncode == 0  # nothing was changed


def test_cache_clear_works_on_a_full_disk(small_fs, two_conversations):
    """The one command that frees space (issue 30, item 10): it used to refuse with "the KV
    cache is not used this time" because opening the store needs a little room."""
    data = small_fs / "data"
    shutil.copytree(two_conversations, data)
    blocks = data / (KVCACHE_DB + "-blocks")
    held = sum(p.stat().st_size for p in blocks.iterdir())
    assert held > 100_000 and _blocks(data / KVCACHE_DB) > 0
    _fill(data, 0)
    r = bw(data, "cache", "clear")
    err, out = r.stderr.decode(), r.stdout.decode()
    assert r.returncode == 0, err
    assert out.startswith("prefix store cleared\nblocks           0 ") and "Traceback" not in err
    assert not list(blocks.glob("*"))
    assert shutil.disk_usage(data).free >= held - 8192  # the block files' room is free again
    assert _blocks(data / KVCACHE_DB) == 0
    (data.parent / "filler").unlink()
    with ChatStore(data / CHATS_DB) as chats:  # the conversations were not touched
        assert len(chats.list_conversations()) == 2


def test_prefix_store_on_a_full_disk_keeps_the_file(small_fs, tmp_path):
    path = small_fs / KVCACHE_DB
    store = PrefixStore(path, block_size=4)
    store.register_model(b"F" * 32, "{}", "m")
    _fill(small_fs / "x", 0)
    with pytest.raises(StoreFull) as info:  # a write on the full disk
        store.register_model(b"G" * 32, "{" + " " * 200_000 + "}", "m")
    assert isinstance(info.value, StorageFullError)
    assert "is full" in str(info.value) and str(small_fs) in str(info.value)
    store.close()
    size = path.stat().st_size
    with pytest.raises(StoreFull):  # opening needs a little room too: refused, not "repaired"
        PrefixStore(path, block_size=4)
    assert path.stat().st_size == size
    (small_fs / "filler").unlink()
    store = PrefixStore(path, block_size=4)
    assert store.recovered_from is None and store.layout(b"F" * 32) == "{}"
    store.close()


def test_chat_database_full_disk_is_named(small_fs):
    with ChatStore(small_fs / CHATS_DB) as chats:
        conv = chats.create_conversation()
        _fill(small_fs / "x", 0)
        with pytest.raises(StorageFullError) as info:
            chats.add_message(conv.id, None, "user", "x" * 500_000)
    assert "is full" in str(info.value) and str(small_fs) in str(info.value)
    assert "free)" in str(info.value)


# -- item 4: a refused message changes nothing -------------------------------------------


def test_a_refused_message_leaves_no_new_chat(tmp_path):
    long = " ".join(["word"] * 300)
    r = bw(tmp_path, "chat", "--ctx-size", "256", long)
    assert r.returncode == 1 and b"context window" in r.stderr
    with ChatStore(tmp_path / CHATS_DB) as chats:
        assert chats.list_conversations() == []


# -- item 6: a message from stdin or a file ----------------------------------------------


def test_chat_reads_a_long_message_from_stdin_and_from_a_file(tmp_path):
    data = tmp_path / "data"  # a folder of its own: tmp_path holds the message file
    big = ("a line of text that repeats " * 5000)[:140_000]  # over 128 KB: too long for argv
    (tmp_path / "msg.txt").write_text(big + "END", encoding="utf-8")
    for args, stdin in ((["-"], (big + "END").encode()), (["--file", tmp_path / "msg.txt"], None)):
        r = bw(data, "chat", "--ctx-size", "256", *args, stdin=stdin)
        # The model cannot take it (256 tokens), but the whole text was read:
        assert r.returncode == 1 and b"context window" in r.stderr, r.stderr
        assert b"tokens long" in r.stderr
    r = bw(data, "chat", "--json", *ENGINE, "-", stdin="Say hi to 苹果".encode())
    assert r.returncode == 0, r.stderr
    with ChatStore(data / CHATS_DB) as chats:
        assert chats.branches.path_to(json.loads(r.stdout)["user_message_id"])[-1].content == "Say hi to 苹果"
    r = bw(data, "chat", "--file", tmp_path / "missing.txt")
    assert r.returncode == 1 and str(tmp_path / "missing.txt").encode() in r.stderr
    assert b"no such file" in r.stderr


# -- item 7: misleading errors and silent omissions --------------------------------------


def test_a_model_path_that_is_not_utf8_is_named_as_the_cause(tmp_path, model_path):
    folder = os.fsencode(tmp_path) + b"/models-\xff"
    os.mkdir(folder)
    target = folder + b"/model.gguf"
    os.symlink(os.fsencode(model_path), target)
    r = subprocess.run([os.fsencode(sys.executable), b"-m", b"app.cli", b"chat", b"--model", target,
                        b"--data-dir", os.fsencode(tmp_path / "data"), b"hello"],
                       capture_output=True, timeout=600)
    assert r.returncode == 1
    assert b"not UTF-8" in r.stderr and b"damaged" not in r.stderr
    assert b"\\xff" in r.stderr


def test_markdown_export_names_its_branch_and_offers_all_branches(tmp_path):
    with ChatStore(tmp_path / CHATS_DB) as chats:
        conv = chats.create_conversation(title="Branches")
        u = chats.add_message(conv.id, None, "user", "question")
        chats.add_message(conv.id, u.id, "assistant", "first answer")
        second = chats.add_message(conv.id, u.id, "assistant", "second answer")
        chats.add_message(conv.id, second.id, "user", "follow-up")
        chats.set_active_leaf(conv.id, second.id)
    r = bw(tmp_path, "conversations", "export", conv.id)
    text = r.stdout.decode()
    assert r.returncode == 0
    assert "2 of 4 messages" in text and "2 messages on other branches are not shown" in text
    assert "--all-branches" in text and "first answer" not in text
    assert text.count("not shown") == 1  # said once, above the title
    r = bw(tmp_path, "conversations", "export", conv.id, "--all-branches")
    text = r.stdout.decode()
    assert "all 4 messages" in text and "first answer" in text and "follow-up" in text


# -- item 3: cache stats in human units ---------------------------------------------------


def test_cache_stats_shows_the_budget_in_human_units(tmp_path):
    from storage.paths import human_bytes

    assert [human_bytes(n) for n in (812, 40 * 1024, 5 * 1024**2, 5 * 1024**3 // 2)] == [
        "812 bytes", "40.0 KB", "5.0 MB", "2.50 GB"]
    r = bw(tmp_path, "cache", "stats", "--cache-budget", "5M")
    text = r.stdout.decode()
    assert r.returncode == 0 and "budget 5.0 MB" in text and "GiB" not in text
    s = json.loads(bw(tmp_path, "cache", "stats", "--json", "--cache-budget", "5M").stdout)
    assert s["budget_bytes"] == 5 * 1024**2
    assert s["file_bytes"] == (tmp_path / KVCACHE_DB).stat().st_size == s["overhead_bytes"]
