"""Privacy (issue 16, items 3 and 4): who can read the data folder, and deletion that deletes.
Issue 30: only what Branchwise made is ever re-permissioned; a folder of other files is
refused on the command line and asked about in the window.

* After a CLI chat turn, the data folder is 0700 and every file in it 0600; the window's
  ``logs/`` and ``settings.json`` too; an older install (0755 / 0644) is tightened at start.
* ``branchwise conversations delete ID`` leaves no byte of the conversation in
  chats.sqlite3 (nor its WAL, nor the search index) and drops its KV blocks, keeping
  another conversation's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from storage.chats import ChatStore
from storage.paths import CHATS_DB, KVCACHE_DB, resolve_data_dir, tighten_permissions

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes; Windows uses ACLs")

ENGINE = ["--temperature", "0", "--max-tokens", "12", "--ctx-size", "512"]


def bw(data_dir, *args):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def modes(folder: Path) -> dict[str, int]:
    """Relative path -> permission bits of the folder and everything below it."""
    out = {".": stat.S_IMODE(folder.stat().st_mode)}
    for path in folder.rglob("*"):
        out[str(path.relative_to(folder))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.fixture
def umask_022():
    """Run with the common umask 022 (files 0644) and restore the test process's umask."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_chat_turn_leaves_only_private_files(tmp_path, umask_022):
    data = tmp_path / "fresh" / "Branchwise"
    r = bw(data, "chat", "--json", *ENGINE, "Hello")
    assert r.returncode == 0, r.stderr
    found = modes(data)
    assert {CHATS_DB, KVCACHE_DB} <= set(found)
    assert found == {name: (0o700 if name == "." or (data / name).is_dir() else 0o600)
                     for name in found}
    assert found["."] == 0o700 and all(m & 0o077 == 0 for m in found.values())


def test_window_files_and_sqlite_sidecars_are_private(tmp_path, umask_022):
    from app.window.settings.app_settings import AppSettings
    from app.window.shell.gui import setup_logging

    data = resolve_data_dir(str(tmp_path / "w"))
    log_file = setup_logging(data)
    import logging

    logging.getLogger("test").warning("a line")
    AppSettings().save(data)
    with ChatStore(data / CHATS_DB) as chats:  # open: -wal and -shm exist now
        chats.create_conversation()
        found = modes(data)
    for handler in list(logging.getLogger().handlers):
        if getattr(handler, "baseFilename", None) == str(log_file):
            logging.getLogger().removeHandler(handler)
            handler.close()
    assert {"logs", "logs/app.log", "settings.json", CHATS_DB, CHATS_DB + "-wal",
            CHATS_DB + "-shm"} <= set(found)
    assert found["."] == found["logs"] == 0o700
    assert all(m == 0o600 for name, m in found.items() if name not in (".", "logs")), found


def test_an_older_install_is_tightened_at_start(tmp_path, umask_022):
    data = tmp_path / "old"
    (data / "logs").mkdir(parents=True)
    for name in ("settings.json", "logs/app.log", "logs/app.log.1"):
        (data / name).write_text("{}")
    with ChatStore(data / CHATS_DB):
        pass
    os.chmod(data, 0o755)
    os.chmod(data / "logs", 0o755)
    for path in data.rglob("*"):
        if path.is_file():
            os.chmod(path, 0o644)
    assert modes(data)["."] == 0o755
    r = bw(data, "conversations", "list")
    assert r.returncode == 0, r.stderr
    found = modes(data)
    assert found["."] == 0o700 and found["logs"] == 0o700
    assert all(m == 0o600 for name, m in found.items() if name not in (".", "logs")), found


def test_tightening_never_adds_permissions_or_follows_links(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    os.chmod(data, 0o755)  # mkdir's mode is cut by the umask, which the app sets to 077
    (data / "settings.json").write_text("x")
    os.chmod(data / "settings.json", 0o444)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chmod(outside, 0o644)
    (data / "cpu-verdict.json").symlink_to(outside)  # one of its names, but a link
    outside_dir = tmp_path / "elsewhere"
    outside_dir.mkdir()
    os.chmod(outside_dir, 0o755)
    (data / "logs").symlink_to(outside_dir, target_is_directory=True)
    changed = tighten_permissions(data)
    assert stat.S_IMODE((data / "settings.json").stat().st_mode) == 0o400
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    assert stat.S_IMODE(outside_dir.stat().st_mode) == 0o755
    assert set(changed) == {data, data / "settings.json"}


def _user_tree(root: Path) -> Path:
    """A folder of the user's: a 0755 script, a 1777 shared folder, a 0644 note, a 0755 folder."""
    root.mkdir()
    (root / "deploy.sh").write_text("#!/bin/sh\necho deployed\n")
    os.chmod(root / "deploy.sh", 0o755)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o1777)
    (root / "shared" / "note.txt").write_text("a note")
    os.chmod(root / "shared" / "note.txt", 0o644)
    (root / "project").mkdir()
    os.chmod(root / "project", 0o755)
    (root / "project" / "build.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "project" / "build.sh", 0o755)
    os.chmod(root, 0o755)
    return root


def _all_modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.lstat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def test_data_dir_on_a_folder_of_other_files_is_refused_and_changes_nothing(tmp_path):
    tree = _user_tree(tmp_path / "home")
    before = _all_modes(tree)
    r = subprocess.run([sys.executable, "-m", "app.cli", "conversations", "list", "--data-dir", str(tree)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"branchwise: The data folder {tree} (set by --data-dir) already holds other files and no "
        "Branchwise database, and Branchwise keeps its files in a folder of its own: pass a new or "
        f"empty folder, for example {tree / 'Branchwise'}."]
    assert _all_modes(tree) == before  # today: 0700 / 0600 everywhere, the script not runnable
    assert sorted(p.name for p in tree.iterdir()) == ["deploy.sh", "project", "shared"]
    r = subprocess.run([str(tree / "deploy.sh")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "deployed\n"


def test_a_folder_of_downloads_and_desktop_litter_is_still_ours(tmp_path):
    """A first `models download` makes models/ and hub-token before any database; a file
    manager leaves .DS_Store: neither makes the data folder someone else's."""
    from storage.paths import is_data_folder

    d = tmp_path / "data"
    (d / "models").mkdir(parents=True)
    (d / "models" / "SmolLM2.gguf").write_bytes(b"GGUF")
    (d / "hub-token").write_text("t")
    (d / ".DS_Store").write_bytes(b"\0")
    assert is_data_folder(d)
    (d / "notes.txt").write_text("mine")
    assert not is_data_folder(d)


def test_a_data_folder_the_user_also_keeps_files_in_changes_only_ours(tmp_path, umask_022):
    tree = _user_tree(tmp_path / "mixed")
    with ChatStore(tree / CHATS_DB):
        pass
    os.chmod(tree / CHATS_DB, 0o644)
    user_modes = {k: v for k, v in _all_modes(tree).items() if not k.startswith(CHATS_DB)}
    r = bw(tree, "chat", "--json", *ENGINE, "Hello")
    assert r.returncode == 0, r.stderr
    found = _all_modes(tree)
    assert {k: found[k] for k in user_modes} == user_modes  # the folder itself keeps 0755 too
    ours = {k: m for k, m in found.items() if k not in user_modes}
    assert CHATS_DB in ours and KVCACHE_DB in ours
    assert all(m == (0o700 if (tree / k).is_dir() else 0o600) for k, m in ours.items()), ours


def test_the_window_asks_before_using_a_folder_of_other_files(tmp_path):
    from app.window.shell.gui import open_data_dir

    tree = _user_tree(tmp_path / "docs")
    before = _all_modes(tree)
    asked: list[str] = []
    assert open_data_dir(str(tree), ask=lambda text: asked.append(text) or False) is None
    assert len(asked) == 1 and "already holds other files" in asked[0]
    assert _all_modes(tree) == before and len(list(tree.iterdir())) == 3
    assert open_data_dir(str(tree), ask=lambda text: True) == tree
    assert _all_modes(tree) == before  # used as it is: nothing of the user's re-permissioned
    fresh = tmp_path / "fresh"
    assert open_data_dir(str(fresh), ask=lambda text: pytest.fail("asked for a new folder")) == fresh


# -- deletion that deletes (issue 16.4) ---------------------------------------------------

MARKER = "ZQXW-bank-PIN-7391"


def _raw(folder: Path, name: str) -> bytes:
    """The bytes of ``name`` and its sidecars, and of the files in its folders (the
    prefix store's ``kvcache.sqlite3-blocks/``)."""
    files = [p for top in folder.glob(name + "*") for p in (top.rglob("*") if top.is_dir() else [top])]
    return b"".join(p.read_bytes() for p in sorted(files) if p.is_file())


def _run(token_ids) -> bytes:
    return np.asarray(token_ids, dtype="<i4").tobytes()


def test_delete_leaves_no_marker_in_either_database(tmp_path):
    data = tmp_path / "data"
    first = json.loads(bw(data, "chat", "--json", *ENGINE,
                          f"My secret is {MARKER}. Repeat it back to me.").stdout)
    keep = json.loads(bw(data, "chat", "--json", *ENGINE, "Name a colour of the sky.").stdout)
    with ChatStore(data / CHATS_DB) as chats:
        secret_reply = list(chats.get_message(first["assistant_message_id"]).token_ids)
        kept_reply = list(chats.get_message(keep["assistant_message_id"]).token_ids)
    assert len(secret_reply) >= 4 and len(kept_reply) >= 4
    assert MARKER.encode() in _raw(data, CHATS_DB)  # the test can fail: the bytes are there
    assert _run(secret_reply[:4]) in _raw(data, KVCACHE_DB)
    r = bw(data, "conversations", "delete", first["conversation_id"], "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["deleted"] == first["conversation_id"] and result["kv_blocks_dropped"] >= 1
    assert result["problem"] is None
    chats_bytes, kv_bytes = _raw(data, CHATS_DB), _raw(data, KVCACHE_DB)
    for piece in (MARKER, MARKER[:8], MARKER[-8:]):
        assert piece.encode() not in chats_bytes, piece
    assert _run(secret_reply[:4]) not in kv_bytes
    assert _run(kept_reply[:4]) in kv_bytes  # the other conversation's blocks stay
    with ChatStore(data / CHATS_DB) as chats:
        assert [c.id for c in chats.list_conversations()] == [keep["conversation_id"]]
        assert chats.search(MARKER) == [] and chats.search("secret") == []
        assert [c.id for c, _ in chats.search("sky")] == [keep["conversation_id"]]
    again = json.loads(bw(data, "chat", "--json", *ENGINE, "--parent", keep["assistant_message_id"],
                          "And at night?").stdout)
    assert again["stats"]["restored_tokens"] > 0  # the kept conversation still resumes


def _char_build(messages, add_generation_prompt: bool) -> list[int]:
    """A stand-in for PromptBuilder.build: one token per character, a header per turn."""
    ids: list[int] = []
    for m in messages:
        ids += [1, {"system": 2, "user": 3, "assistant": 4}[m.role]]
        ids += list(m.token_ids) if m.token_ids else [ord(ch) for ch in m.content]
    return ids + ([1, 4] if add_generation_prompt else [])


def test_delete_and_forget_keeps_what_a_fork_shares(tmp_path):
    from engine.forget import conversation_token_paths, delete_and_forget
    from storage.prefix_store import NewBlock, PrefixStore

    fp = b"K" * 32
    with ChatStore(tmp_path / CHATS_DB) as chats:
        store = PrefixStore(tmp_path / KVCACHE_DB, block_size=8)
        conv = chats.create_conversation(system_prompt="Be brief and kind.")
        u = chats.add_message(conv.id, None, "user", "A long shared opening question?")
        a = chats.add_message(conv.id, u.id, "assistant", "ok", token_ids=[900, 901, 902])
        u2 = chats.add_message(conv.id, a.id, "user", "Secret follow-up 7391")
        fork = chats.copies.fork(a.id)  # shares the first turn only
        unrelated = chats.create_conversation(title="Other")
        chats.add_message(unrelated.id, None, "user", "Hello")
        for cid in (conv.id, fork.id, unrelated.id):
            for tokens in conversation_token_paths(chats, cid, _char_build):
                missing, chain = store.plan(fp, tokens)
                store.put(fp, [NewBlock(b.key, b.parent, b.start, b.tokens, b"p" * len(b.tokens))
                               for b in missing], active_path=chain)
        secret = conversation_token_paths(chats, conv.id, _char_build)[-1]
        shared = conversation_token_paths(chats, fork.id, _char_build)[-1]
        before = store.coverage(fp, secret)
        assert before == len(secret)
        dropped = delete_and_forget(chats, store, conv.id, _char_build)
        assert dropped >= 1
        assert store.coverage(fp, shared) == len(shared)  # the fork's blocks stay
        assert store.coverage(fp, secret) < len(secret)
        assert store.coverage(fp, secret) <= len(shared) + 1
        other = conversation_token_paths(chats, unrelated.id, _char_build)[-1]
        assert store.coverage(fp, other) == len(other)
        assert [c.id for c in chats.list_conversations()] == [unrelated.id, fork.id]
        assert u2.id not in {m.id for c in chats.list_conversations() for m in chats.tree(c.id)}
        store.close()


# -- a delete while the reply streams (issue 30, item 5) -----------------------------------

STREAM_MARKER = "QJVX-passport-5518"


def _streaming(data: Path, cid: int) -> bool:
    import sqlite3
    from contextlib import closing

    try:
        with closing(sqlite3.connect(f"file:{data / CHATS_DB}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute("SELECT count(*) FROM messages WHERE conversation_id = ? AND role = 'assistant'"
                                " AND status = 'streaming'", (cid,)).fetchone()[0] > 0
    except sqlite3.Error:
        return False


def test_a_delete_during_a_stream_stops_it_and_nothing_is_kept(tmp_path):
    import time

    data = tmp_path / "data"
    first = json.loads(bw(data, "chat", "--json", *ENGINE, f"My secret is {MARKER}. Keep it safe.").stdout)
    cid = first["conversation_id"]
    with ChatStore(data / CHATS_DB) as chats:
        first_reply = list(chats.get_message(first["assistant_message_id"]).token_ids)
    assert _run(first_reply[:4]) in _raw(data, KVCACHE_DB)  # the test can fail: the blocks are there
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data)}
    chat = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "chat", "--conversation", str(cid), "--temperature", "0",
         "--max-tokens", "1500", "--ctx-size", "4096",  # a long story: minutes on this model
         f"Passport {STREAM_MARKER}. Now write a long story about owls and foxes in the winter forest."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not _streaming(data, cid):  # the reply's row exists: it is streaming now
            assert chat.poll() is None, chat.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = bw(data, "conversations", "delete", cid, "--json")
        assert r.returncode == 0, r.stderr
        out, err = chat.communicate(timeout=300)
    finally:
        if chat.poll() is None:
            chat.kill()
    assert chat.returncode == 1, (out, err)
    assert err.strip().splitlines()[-1] == (f"branchwise: Conversation {cid} was deleted while the reply was "
                                            "being written; nothing was kept.")
    assert "There is no message" not in err and "Traceback" not in err
    chats_bytes, kv_bytes = _raw(data, CHATS_DB), _raw(data, KVCACHE_DB)
    for piece in (MARKER, STREAM_MARKER, STREAM_MARKER[:8], STREAM_MARKER[-8:]):
        assert piece.encode() not in chats_bytes, piece
        assert piece.encode() not in kv_bytes, piece
    assert _run(first_reply[:4]) not in kv_bytes  # the prompt's token ids are in no block
    stats = json.loads(bw(data, "cache", "stats", "--json").stdout)
    assert stats["blocks"] == 0 and stats["checkpoints"] == 0  # it was the only conversation
    assert not list((data / (KVCACHE_DB + "-blocks")).glob("*"))
    with ChatStore(data / CHATS_DB) as chats:
        assert chats.list_conversations() == [] and chats.search(STREAM_MARKER) == []
