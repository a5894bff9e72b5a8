"""``branchwise import`` and ``branchwise conversations export --all`` in fresh processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "import"
SAMPLES = sorted(p for p in DATA.iterdir() if p.suffix in (".json", ".jsonl"))


def bw(data_dir: Path, *args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_import_every_sample_then_again(tmp_path: Path) -> None:
    r = bw(tmp_path, "import", *SAMPLES, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["conversations"], out["messages"], out["failed_files"]) == (5, 6 + 5 + 7 + 8 + 8, 0)
    assert sorted(f["format"] for f in out["files"]) == sorted(
        ["chatgpt", "claude", "openwebui", "lmstudio", "sillytavern"])
    assert "first turn" in out["note"]
    r = bw(tmp_path, "import", *SAMPLES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(": nothing new (1 conversation already imported).") == 5
    listed = json.loads(bw(tmp_path, "conversations", "list", "--json").stdout)
    assert len(listed) == 5


def test_text_summary_and_a_failing_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('[{"title": "x", "mapping": {')
    chatgpt = DATA / "chatgpt_conversations.json"
    r = bw(tmp_path / "data", "import", chatgpt, bad)
    assert r.returncode == 1
    assert f"Imported {chatgpt} (ChatGPT): 1 conversation, 6 messages, 3 branches." in r.stdout
    assert "no KV cache yet" in r.stdout
    assert r.stderr.startswith(f"branchwise: {bad}: it is not valid JSON")
    assert "Nothing from this file was imported." in r.stderr
    assert "Traceback" not in r.stderr


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    bw(tmp_path, "import", DATA / "claude_conversations.json")
    before = dump(tmp_path / "chats.sqlite3")
    r = bw(tmp_path, "import", "--dry-run", *SAMPLES)
    assert r.returncode == 0, r.stderr
    assert "Would import" in r.stdout and "no KV cache yet" not in r.stdout
    assert dump(tmp_path / "chats.sqlite3") == before


def test_export_all_is_the_backup_import_restores(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    assert bw(first, "import", *SAMPLES).returncode == 0
    backup = tmp_path / "backup.json"
    r = bw(first, "conversations", "export", "--all", "--output", backup)
    assert r.returncode == 0, r.stderr
    assert "Exported 5 conversations" in r.stderr
    r = bw(second, "import", backup, "--json")
    assert json.loads(r.stdout)["files"][0]["format"] == "branchwise"
    stdout_export = bw(second, "conversations", "export", "--all").stdout
    a, b = json.loads(backup.read_text()), json.loads(stdout_export)
    assert [c["title"] for c in a["conversations"]] == [c["title"] for c in b["conversations"]]
    assert [[m["content"] for m in c["messages"]] for c in a["conversations"]] == \
        [[m["content"] for m in c["messages"]] for c in b["conversations"]]


def test_export_without_an_id_says_what_to_do(tmp_path: Path) -> None:
    r = bw(tmp_path, "conversations", "export")
    assert r.returncode == 2  # a usage error
    assert "give a conversation id, or --all for every conversation" in r.stderr


def test_export_to_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    r = bw(tmp_path, "conversations", "export", "--all", "-o", tmp_path / "no" / "such" / "dir" / "b.json")
    assert r.returncode == 1
    assert r.stderr.startswith("branchwise: Cannot write") and "Traceback" not in r.stderr


def test_an_imported_chat_continues_on_the_default_model(tmp_path: Path) -> None:
    """No KV for an imported chat: the first turn prefills all of it; the next one restores, and
    its reply equals the same turn computed without the store (temperature 0)."""
    assert bw(tmp_path, "import", DATA / "claude_conversations.json").returncode == 0
    common = ("--json", "--temperature", "0", "--max-tokens", "12", "--ctx-size", "2048")
    r = bw(tmp_path, "chat", "--conversation", 1, *common, "Say it once more.")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    s = first["stats"]
    assert s["restored_tokens"] == 0 and s["prefilled_tokens"] == s["prompt_tokens"] > 50
    r = bw(tmp_path, "chat", "--conversation", 1, *common, "Thanks. One word?")
    assert r.returncode == 0, r.stderr
    cached = json.loads(r.stdout)
    assert cached["stats"]["restored_tokens"] > s["prompt_tokens"] - 5
    r = bw(tmp_path, "chat", "--parent", first["assistant_message_id"], "--no-cache", *common, "Thanks. One word?")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == cached["text"]
