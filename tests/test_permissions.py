"""Privacy (issue 16, items 3 and 4): who can read the data folder, and deletion that deletes.

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
    (data / "readonly").write_text("x")
    os.chmod(data / "readonly", 0o444)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chmod(outside, 0o644)
    (data / "link").symlink_to(outside)
    changed = tighten_permissions(data)
    assert stat.S_IMODE((data / "readonly").stat().st_mode) == 0o400
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    assert set(changed) == {data, data / "readonly"}


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
        fork = chats.fork(a.id)  # shares the first turn only
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
