"""``branchwise continue ID``: a reply cut at max tokens goes on in the same message, restored
from the prefix store (the real default model, fresh processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from storage.chats import ChatStore


def bw(data_dir, *args):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def test_continue_goes_on_in_the_same_message(tmp_path):
    r = bw(tmp_path, "chat", "--json", "--temperature", "0", "--max-tokens", "10", "--ctx-size", "2048",
           "Write a short story about a lighthouse keeper.")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    mid = first["assistant_message_id"]
    assert first["stats"]["finish_reason"] == "length"
    r = bw(tmp_path, "continue", str(mid), "--json", "--temperature", "0", "--max-tokens", "10", "--ctx-size", "2048")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["assistant_message_id"] == mid and out["conversation_id"] == first["conversation_id"]
    s = out["stats"]
    assert s["prompt_tokens"] == first["stats"]["prompt_tokens"] + 10
    assert s["restored_tokens"] >= s["prompt_tokens"] - 2 and s["prefilled_tokens"] <= 2
    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        m = chats.get_message(mid)
        assert m.content == first["text"] + out["text"] and len(m.token_ids) == 10 + s["generated_tokens"]  # stats: this request's
        assert [x.role for x in chats.tree(first["conversation_id"])] == ["user", "assistant"]
    r = bw(tmp_path, "continue", str(first["user_message_id"]))  # a user message cannot go on
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "is your own message, not a reply" in r.stderr
