"""Never touch what isn't ours (issue 30, item 1): a symlinked blocks folder, a block file
that is a symlink or a hard link, and a stranger's file in the blocks folder leave a
scratch *victim* folder (made here, with marker files) exactly as it was, through
``chat``, ``cache stats|verify|clear``, ``conversations delete`` and the store's open as
the window's engine does it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from storage.paths import BLOCKS_DIR, KVCACHE_DB

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX symlinks and modes")

ENGINE = ["--temperature", "0", "--max-tokens", "6", "--ctx-size", "512"]
ORPHAN = "ab" * 32  # a block-file name no row has


def bw(data_dir, *args):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def make_victim(folder: Path) -> Path:
    """A folder of someone else's files: text, a 0755 script, a read-only file, a sub-folder."""
    folder.mkdir()
    (folder / "a.txt").write_text("marker a\n")
    (folder / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(folder / "run.sh", 0o755)
    (folder / "ro.dat").write_bytes(b"\x01\x02" * 3000)
    os.chmod(folder / "ro.dat", 0o444)
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.txt").write_text("marker deep\n")
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Relative path -> (mode bits, content) of the folder and everything in it."""
    out = {".": (stat.S_IMODE(folder.lstat().st_mode), None)}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (stat.S_IMODE(st.st_mode),
                                          p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def first_chat(data: Path, text: str = "Name a colour.") -> dict:
    r = bw(data, "chat", "--json", *ENGINE, text)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r


def test_a_symlinked_blocks_folder_is_used_but_never_swept(tmp_path):
    victim = make_victim(tmp_path / "victim")
    data = tmp_path / "data"
    first = first_chat(data)
    blocks = data / BLOCKS_DIR
    for f in blocks.iterdir():  # the cache moved to "another disk", with the user's files
        shutil.move(str(f), victim / f.name)
    blocks.rmdir()
    blocks.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    moved = {n for n in before if len(n) == 64}
    assert moved, before

    ok(bw(data, "cache", "stats"))
    assert snapshot(victim) == before  # today: every file in the victim folder is gone
    again = json.loads(ok(bw(data, "chat", "--json", *ENGINE, "--parent", first["assistant_message_id"],
                             "And another?")).stdout)
    assert again["stats"]["restored_tokens"] > 0  # read through the link
    after = snapshot(victim)
    assert {k: v for k, v in after.items() if len(k) != 64} == {k: v for k, v in before.items() if len(k) != 64}
    assert any(len(k) == 64 for k in set(after) - set(before))  # and new blocks written there too
    ok(bw(data, "cache", "verify"))
    ok(bw(data, "conversations", "delete", first["conversation_id"]))
    ok(bw(data, "cache", "clear"))
    final = snapshot(victim)
    assert {k: v for k, v in final.items() if len(k) != 64} == {k: v for k, v in before.items() if len(k) != 64}
    assert not any(len(k) == 64 for k in final)  # the blocks went, the link and its target stay
    assert blocks.is_symlink()


def test_a_block_file_that_is_a_link_is_unlinked_never_written_through(tmp_path):
    victim = make_victim(tmp_path / "victim")
    data = tmp_path / "data"
    first = first_chat(data, "The river town kept its bridges in good repair. " * 12 + "Why?")
    blocks = data / BLOCKS_DIR
    names = sorted(p.name for p in blocks.iterdir())
    assert len(names) >= 2
    for name, target in zip(names, ("a.txt", "run.sh")):  # two real blocks become links
        (blocks / name).unlink()
        (blocks / name).symlink_to(victim / target)
    (blocks / ORPHAN).symlink_to(victim / "ro.dat")  # an orphan link: reclaimed at open
    os.link(victim / "sub" / "deep.txt", blocks / ("cd" * 32))  # an orphan hard link
    (blocks / "notes.txt").write_text("the user's note\n")  # not a block name: left alone
    before = snapshot(victim)

    ok(bw(data, "cache", "stats"))
    assert snapshot(victim) == before
    assert not (blocks / ORPHAN).exists() and not (blocks / ORPHAN).is_symlink()
    assert not (blocks / ("cd" * 32)).exists()
    ok(bw(data, "cache", "verify"))  # today: the links' targets are zeroed
    assert snapshot(victim) == before
    assert not any((blocks / n).is_symlink() for n in names)
    for name, target in zip(names, ("a.txt", "run.sh")):  # again, for chat's own drop of a bad block
        (blocks / name).unlink(missing_ok=True)
        (blocks / name).symlink_to(victim / target)
    ok(bw(data, "chat", "--json", *ENGINE, "--parent", first["assistant_message_id"], "More?"))
    assert snapshot(victim) == before
    for name, target in zip(names, ("a.txt", "run.sh")):
        (blocks / name).unlink(missing_ok=True)
        (blocks / name).symlink_to(victim / target)
    ok(bw(data, "conversations", "delete", first["conversation_id"]))
    ok(bw(data, "cache", "clear"))
    assert snapshot(victim) == before
    assert (blocks / "notes.txt").read_text() == "the user's note\n"


def test_the_window_engines_open_and_reset_spare_strangers(tmp_path):
    """The engine child opens ``data / kvcache.sqlite3`` (engine/worker.py); a damaged
    index is replaced, which removes the store's files: only its own."""
    from storage.prefix_store import PrefixStore

    victim = make_victim(tmp_path / "victim")
    data = tmp_path / "data"
    data.mkdir()
    PrefixStore(data / KVCACHE_DB).close()
    blocks = data / BLOCKS_DIR
    blocks.symlink_to(victim, target_is_directory=True)
    (blocks / ORPHAN).symlink_to(victim / "a.txt")
    before = snapshot(victim)
    store = PrefixStore(data / KVCACHE_DB)  # reclaims orphans
    store.close()
    assert snapshot(victim) == {k: v for k, v in before.items() if k != ORPHAN}
    assert (victim / "a.txt").read_text() == "marker a\n"
    (data / KVCACHE_DB).write_bytes(b"not a database" * 100)  # damaged: the store starts over
    store = PrefixStore(data / KVCACHE_DB)
    assert store.recovered_from
    store.close()
    assert snapshot(victim) == {k: v for k, v in before.items() if k != ORPHAN}
    assert blocks.is_symlink()


def test_a_symlinked_stream_lock_folder_is_neither_written_nor_emptied(tmp_path) -> None:
    """The reply-stream locks (storage/chats/live_streams.py) create and delete
    ``<id>.lock`` files; a lock folder that is a symbolic link to a victim folder is left
    exactly as it was, and the reply still streams (without a lock)."""
    from storage.chats.live_streams import STREAMS_SUFFIX, LiveStreams

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "5.lock").write_text("not Branchwise's")
    data = tmp_path / "data"
    data.mkdir()
    (data / ("chats.sqlite3" + STREAMS_SUFFIX)).symlink_to(victim)
    streams = LiveStreams(data / "chats.sqlite3")
    streams.claim(5)
    streams.claim(6)
    assert not streams.is_live(6)  # not claimed: nothing was written into the victim
    streams.forget(5)
    streams.release(5)
    streams.close()
    assert sorted(p.name for p in victim.iterdir()) == ["5.lock"]
    assert (victim / "5.lock").read_text() == "not Branchwise's"
