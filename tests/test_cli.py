"""The ``branchwise`` CLI in fresh processes, as a user (or the issue's checks) would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

STORY = ("The river town kept its bridges in good repair, and every spring the mayor walked "
         "across each one to count the loose stones. ") * 8


def bw(data_dir, *args, check=True):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    r = subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def chat_json(data_dir, *args):
    r = bw(data_dir, "chat", "--json", "--temperature", "0", "--max-tokens", "24", *args)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def convo(tmp_path_factory):
    """A conversation with one turn, made by one process."""
    d = tmp_path_factory.mktemp("cli")
    first = chat_json(d, STORY + "How often did the mayor count stones?")
    return d, first


def test_resume_in_a_new_process_restores_and_matches_no_cache(convo):
    d, first = convo
    s1 = first["stats"]
    assert s1["restored_tokens"] + s1["prefilled_tokens"] == s1["prompt_tokens"]
    cid, leaf = first["conversation_id"], first["assistant_message_id"]
    resumed = chat_json(d, "--parent", leaf, "Why did he do it?")
    cold = chat_json(d, "--parent", leaf, "--no-cache", "Why did he do it?")
    s = resumed["stats"]
    assert resumed["conversation_id"] == cid
    assert s["restored_tokens"] >= s1["prompt_tokens"] + s1["generated_tokens"] - 1
    assert s["prefilled_tokens"] < 20
    assert s["restored_tokens"] + s["prefilled_tokens"] == s["prompt_tokens"]
    assert cold["stats"]["restored_tokens"] == 0
    assert resumed["text"] == cold["text"]
    assert set(s) >= {"prompt_tokens", "restored_tokens", "prefilled_tokens", "generated_tokens", "restore_ms",
                      "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "snapshot_bytes_written"}


def test_regenerate_makes_a_sibling_with_the_same_greedy_text(convo):
    d, first = convo
    r = json.loads(bw(d, "regenerate", "--json", "--temperature", "0", "--max-tokens", "24",
                      first["assistant_message_id"]).stdout)
    assert r["assistant_message_id"] != first["assistant_message_id"]
    assert r["user_message_id"] == first["user_message_id"]
    assert r["text"] == first["text"]
    assert r["stats"]["restored_tokens"] == r["stats"]["prompt_tokens"] - 2
    shown = json.loads(bw(d, "conversations", "show", first["conversation_id"], "--json").stdout)
    siblings = [m for m in shown["messages"] if m["parent_id"] == first["user_message_id"]]
    assert len(siblings) == 2


def test_conversations_list_and_export(convo):
    d, first = convo
    listed = json.loads(bw(d, "conversations", "list", "--json").stdout)
    assert first["conversation_id"] in [c["id"] for c in listed]
    md = bw(d, "conversations", "export", first["conversation_id"], "--format", "markdown").stdout
    assert "How often did the mayor count stones?" in md and first["text"].strip()[:20] in md
    data = json.loads(bw(d, "conversations", "export", first["conversation_id"], "--format", "json").stdout)
    assert data["messages"][0]["role"] == "user"


def test_unknown_ids_fail_with_one_readable_line(tmp_path):
    r = bw(tmp_path, "chat", "--conversation", "999", "hello", check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == "branchwise: There is no conversation with id 999 (it may have been deleted)."
    r = bw(tmp_path, "regenerate", "12345", check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "12345" in r.stderr


def test_bad_model_file_fails_cleanly_and_stores_nothing(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(4000))
    data = tmp_path / "data"  # a folder of its own: tmp_path holds the model file
    r = bw(data, "chat", "--model", bad, "hello", check=False)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "broken.gguf" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(bw(data, "conversations", "list", "--json").stdout) == []


def test_budget_is_respected_after_every_turn(tmp_path):
    budget = 3_000_000  # about 130 tokens of KV for the default model
    for text in ("Tell me about owls.", "Tell me about foxes and their dens in winter."):
        chat_json(tmp_path, "--cache-budget", budget, text)
        stats = json.loads(bw(tmp_path, "cache", "stats", "--json", "--cache-budget", budget).stdout)
        assert 0 < stats["bytes"] <= budget


def test_cache_verify_finds_and_removes_damage(tmp_path):
    chat_json(tmp_path, STORY + "Summarise.")
    import sqlite3

    db = sqlite3.connect(tmp_path / "kvcache.sqlite3")
    (key,) = db.execute("SELECT key FROM blocks ORDER BY id LIMIT 1").fetchone()
    db.close()
    file = tmp_path / "kvcache.sqlite3-blocks" / key.hex()
    data = file.read_bytes()
    file.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    report = json.loads(bw(tmp_path, "cache", "verify", "--json").stdout)
    assert report["bad"] == 1 and report["removed"] >= 1
    assert json.loads(bw(tmp_path, "cache", "verify", "--json").stdout)["bad"] == 0


def test_a_killed_chat_keeps_the_streamed_text(tmp_path):
    import signal
    import time

    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", "--temperature", "0", "--max-tokens", "400",
                             "Write a long story about a dragon who collects teapots."],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    shown = b""
    deadline = time.monotonic() + 300
    while len(shown) < 200 and time.monotonic() < deadline:
        shown += os.read(proc.stdout.fileno(), 4096)
    time.sleep(1.0)  # past the half-second save interval
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    data = json.loads(bw(tmp_path, "conversations", "export", "1", "--format", "json").stdout)
    reply = [m for m in data["messages"] if m["role"] == "assistant"]
    assert len(reply) == 1
    assert reply[0]["status"] == "stopped"  # marked when the store was next opened
    assert len(reply[0]["content"]) >= 100 and shown.decode(errors="ignore").startswith(reply[0]["content"][:50])


def test_nonsense_limits_are_refused(tmp_path):
    r = bw(tmp_path, "chat", "--max-tokens", "0", "hi", check=False)
    assert r.returncode == 2 and "at least 1" in r.stderr
    r = bw(tmp_path, "chat", "--cache-budget", "-5", "hi", check=False)
    assert r.returncode == 2 and "positive" in r.stderr


def test_parent_must_be_an_assistant_reply(convo):
    d, first = convo
    r = bw(d, "chat", "--parent", first["user_message_id"], "hi", check=False)
    assert r.returncode == 1
    assert f"Message {first['user_message_id']} is your own message" in r.stderr


def test_usage_errors_are_one_line(tmp_path):
    r = bw(tmp_path, "chat", "--kv-type", "q4_0", "hi", check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "q4_0" in r.stderr


def test_a_message_that_does_not_fit_is_not_stored(tmp_path):
    first = chat_json(tmp_path, "hi")
    r = bw(tmp_path, "chat", "--conversation", first["conversation_id"], "--ctx-size", "256",
           "word " * 400, check=False)
    assert r.returncode == 1 and "--ctx-size" in r.stderr
    shown = json.loads(bw(tmp_path, "conversations", "show", first["conversation_id"], "--json").stdout)
    assert len(shown["messages"]) == 2  # the oversized message left no trace


def test_chat_refuses_to_put_a_second_question_under_one_with_no_reply(tmp_path):
    """Two `chat --conversation N` at once: the second one found the first one's question as
    the leaf and stacked its own under it (two questions in a row, the first answer on
    another branch). It now refuses and says what to do; nothing is written."""
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        conv = chats.create_conversation(title="busy")
        q = chats.add_message(conv.id, None, "user", "question A")  # being answered elsewhere
    r = bw(tmp_path, "chat", "--conversation", conv.id, "question B", check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"branchwise: Conversation {conv.id} ends on your message {q.id}, which has no reply yet (another "
        "branchwise may be answering it right now). Wait for that reply, answer it with "
        f"'branchwise regenerate {q.id}', or branch from an earlier reply with --parent ID.")
    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        assert [m.content for m in chats.tree(conv.id)] == ["question A"]


def test_export_of_one_conversation_writes_the_file_given_by_o(convo, tmp_path):
    d, first = convo
    cid = first["conversation_id"]
    for fmt in ("markdown", "json"):
        target = tmp_path / f"c1.{fmt}"
        target.write_text("old")  # replaced, as `export --all -o` replaces it
        r = bw(d, "conversations", "export", cid, "--format", fmt, "-o", target)
        assert r.stdout == ""
        assert r.stderr.strip() == f"Exported conversation {cid} ({fmt}) to {target}."
        assert target.read_text() == bw(d, "conversations", "export", cid, "--format", fmt).stdout
        assert target.stat().st_mode & 0o777 == 0o600


def test_model_before_the_command_is_honoured_or_refused(tmp_path):
    missing = tmp_path / "missing.gguf"
    r = bw(tmp_path, "--model", missing, "chat", "hi", check=False)  # was ignored: the default model answered
    assert r.returncode == 1 and "missing.gguf" in r.stderr and "Traceback" not in r.stderr
    r = bw(tmp_path, "--model", missing, "cache", "stats", check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == "branchwise: --model does not apply to 'cache' (see 'branchwise --help')"


def test_the_stats_line_says_a_reply_was_cut_by_max_tokens(tmp_path):
    r = bw(tmp_path, "chat", "--temperature", "0", "--max-tokens", "5", "Write a long story about owls.")
    stats = r.stderr.strip().splitlines()[-1]
    assert stats.startswith("[conversation 1 · message 2 · ")
    assert stats.endswith(" · cut at the --max-tokens limit (5 tokens)]")


def test_small_cli_mistakes_and_help(tmp_path):
    r = bw(tmp_path, "chat", "--temperature", "-1", "hi", check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == ("branchwise: argument --temperature: must be between 0 and 2; got -1 "
                                "(see 'branchwise chat --help')")  # the bound serve applies too (engine/limits.py)
    conv_help = bw(tmp_path, "conversations", "--help").stdout
    assert "every conversation: id, * when pinned, title" in conv_help
    assert "the active branch of one conversation" in conv_help
    assert "print the figures as one JSON object" in bw(tmp_path, "bench", "--help").stdout


def test_the_stats_line_words_a_first_turn_as_the_window_does(tmp_path):
    from app.session import restored_words

    assert restored_words(39, first_turn=True) == "reused 39 cached"
    assert restored_words(3774, first_turn=False) == "restored 3,774"
    first = bw(tmp_path, "chat", "--temperature", "0", "--max-tokens", "4", "Hello!").stderr.strip().splitlines()[-1]
    assert " · reused " in first and " cached tokens in " in first and "restored" not in first
    later = bw(tmp_path, "chat", "--conversation", "1", "--temperature", "0", "--max-tokens", "4",
               "And again.").stderr.strip().splitlines()[-1]
    assert " · restored " in later and "reused" not in later


def test_a_conversation_continues_on_its_own_model_when_the_file_is_there(tmp_path, model_path):
    """`chat --conversation N` without --model loads the model N last ran on (schema 6's
    conversations.model_path) and says so in one line; a file that is gone is said too."""
    import shutil

    from storage.chats import ChatStore

    mine = tmp_path / "models" / "mine.gguf"
    mine.parent.mkdir()
    shutil.copyfile(model_path, mine)
    d = tmp_path / "data"

    def ran_on(cid):
        with ChatStore(d / "chats.sqlite3") as chats:
            return chats.models.of(cid).path

    cid = chat_json(d, "--model", mine, "--max-tokens", "4", "Hello.")["conversation_id"]
    assert ran_on(cid) == str(mine)
    again = bw(d, "chat", "--max-tokens", "4", "--conversation", cid, "And then?")
    assert again.stderr.splitlines()[0] == f"branchwise: conversation {cid} runs on mine ({mine}); loading it."
    assert ran_on(cid) == str(mine)  # the reply was made by mine.gguf, not the default
    reply_id = json.loads(bw(d, "chat", "--json", "--max-tokens", "4", "--conversation", cid, "Go on.").stdout)[
        "assistant_message_id"]
    regen = bw(d, "regenerate", "--max-tokens", "4", reply_id)  # regenerate too
    assert regen.stderr.splitlines()[0] == f"branchwise: conversation {cid} runs on mine ({mine}); loading it."
    assert ran_on(cid) == str(mine)
    other = bw(d, "chat", "--max-tokens", "4", "--model", model_path, "--conversation", cid, "More?")
    assert "runs on" not in other.stderr and ran_on(cid) == str(model_path)  # --model wins, nothing said
    with ChatStore(d / "chats.sqlite3") as chats:
        chats.models.remember(cid, str(mine), "mine")
    mine.unlink()
    gone = bw(d, "chat", "--max-tokens", "4", "--conversation", cid, "Still there?")
    assert gone.stderr.splitlines()[0] == (f"branchwise: conversation {cid} last ran on mine ({mine}), which is "
                                           "not there any more; using the default model.")
    assert ran_on(cid) == str(model_path)


def test_chat_refuses_to_answer_under_a_reply_another_process_is_still_streaming(tmp_path):
    """Two `chat --conversation N` at once, the second started while the first streamed its
    reply: the second marked that reply stopped and answered under its half-written text
    (its prompt held part of the reply, the tree said all of it). It now refuses, names
    the reply, writes nothing, and leaves the reply streaming for its writer."""
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "chats.sqlite3") as chats:  # the writer: holds the reply's stream lock
        conv = chats.create_conversation(title="busy")
        q = chats.add_message(conv.id, None, "user", "Tell me a long story about a fox")
        a = chats.add_message(conv.id, q.id, "assistant", "Once upon a", status="streaming")
        for args in (("--conversation", conv.id), ("--parent", a.id)):
            r = bw(tmp_path, "chat", *args, "And then?", check=False)
            assert r.returncode == 1
            assert r.stderr.strip() == (
                f"branchwise: Reply {a.id} in conversation {conv.id} is still being written (another "
                "branchwise is streaming it right now). Wait for that reply to finish, or branch from an "
                "earlier reply with --parent ID.")
        assert [(m.content, m.status) for m in chats.tree(conv.id)] == [
            ("Tell me a long story about a fox", "complete"), ("Once upon a", "streaming")]
        chats.update_message(a.id, content="Once upon a time.", status="complete")
    r = bw(tmp_path, "chat", "--conversation", conv.id, "--max-tokens", "4", "--temperature", "0", "And then?")
    with ChatStore(tmp_path / "chats.sqlite3") as chats:  # the finished reply is answered under
        assert [m.parent_id for m in chats.tree(conv.id)][2] == a.id
        assert not (tmp_path / "chats.sqlite3-streams" / f"{a.id}.lock").exists()


def test_a_usage_error_with_json_puts_one_error_object_on_stdout(tmp_path):
    r = bw(tmp_path, "chat", "--json", "--temperature", "9", "x", check=False)
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"error": "argument --temperature: must be between 0 and 2; got 9 "
                                             "(see 'branchwise chat --help')", "saved": None}
    assert r.stderr == "branchwise: argument --temperature: must be between 0 and 2; got 9 (see 'branchwise chat " \
                       "--help')\n"
    r = bw(tmp_path, "chat", "--temperature", "9", "x", check=False)  # without --json: stderr only
    assert r.returncode == 2 and r.stdout == ""


def _two_chats(data_dir):
    """Two conversations written straight to the chats (no model): the second has two
    replies to its question, the later one active."""
    from storage.chats import ChatStore

    with ChatStore(data_dir / "chats.sqlite3") as chats:
        a = chats.create_conversation(title="Bridges")
        q = chats.add_message(a.id, None, "user", "How many bridges?")
        chats.add_message(a.id, q.id, "assistant", "Three.")
        b = chats.create_conversation(title="Stones")
        q = chats.add_message(b.id, None, "user", "How many stones?")
        chats.add_message(b.id, q.id, "assistant", "Nine.")
        chats.add_message(b.id, q.id, "assistant", "Ninety.")
    return a.id, b.id


def test_export_all_as_markdown_writes_every_conversation(tmp_path):
    _two_chats(tmp_path)
    target = tmp_path / "all.md"
    r = bw(tmp_path, "conversations", "export", "--all", "--format", "markdown", "-o", target)
    assert r.stderr == f"Exported 2 conversations (markdown) to {target}.\n"
    md = target.read_text()
    assert md.index("# Bridges") < md.index("\n---\n") < md.index("# Stones")
    assert "```text\nHow many bridges?\n```" in md and "Ninety." in md and "Nine.\n" not in md  # active branches
    assert json.loads(bw(tmp_path, "conversations", "export", "--all").stdout)["branchwise_export"] == 1  # json


def test_every_branch_in_markdown_says_what_each_reply_answers(tmp_path):
    _, b = _two_chats(tmp_path)
    md = bw(tmp_path, "conversations", "export", b, "--all-branches").stdout
    assert "## Assistant (branch 1/2) · message 4 · in reply to message 3" in md
    assert "## Assistant (branch 2/2) · message 5 · in reply to message 3" in md
    assert "## User · message 3\n" in md  # a root follows nothing


def test_export_needs_exactly_one_of_an_id_and_all(tmp_path):
    a, _ = _two_chats(tmp_path)
    r = bw(tmp_path, "conversations", "export", check=False)
    assert r.returncode == 2 and r.stderr == ("branchwise: give a conversation id, or --all for every conversation "
                                              "(see 'branchwise conversations export --help')\n")
    r = bw(tmp_path, "conversations", "export", a, "--all", check=False)
    assert r.returncode == 2 and "not both" in r.stderr


def test_models_list_shows_the_built_in_model(tmp_path):
    out = bw(tmp_path, "models", "list").stdout.splitlines()
    assert out[0].startswith("No models downloaded yet")
    assert "SmolLM2-135M-Instruct.Q4_1 (built-in)" in out[1] and out[1].endswith("[embedded in Branchwise]")
    data = json.loads(bw(tmp_path, "models", "list", "--json").stdout)
    assert data["models"] == [] and [m["origin"] for m in data["builtin"]] == ["built-in"]


def test_a_turn_larger_than_the_cache_budget_says_so(tmp_path):
    r = bw(tmp_path, "chat", "--json", "--cache-budget", "3M", "--max-tokens", "8", "--temperature", "0",
           "Tell me about the river town and its bridges. " * 30)
    saved = json.loads(r.stdout)["saved"]
    assert saved["kv_cache"] is False
    assert saved["problems"][0].startswith("the KV cache was not saved: this conversation's ")
    assert "MiB of KV are more than the cache budget of 3.0 MiB (--cache-budget)" in saved["problems"][0]


def test_edit_rephrases_the_first_message_beside_it(tmp_path):
    first = chat_json(tmp_path, "Name a river.")
    r = bw(tmp_path, "chat", "--json", "--temperature", "0", "--max-tokens", "8", "--edit",
           first["user_message_id"], "Name a mountain.")
    second = json.loads(r.stdout)
    assert second["conversation_id"] == first["conversation_id"]
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        roots = [m for m in chats.tree(first["conversation_id"]) if m.parent_id is None]
        assert [m.content for m in roots] == ["Name a river.", "Name a mountain."]  # the original stays
        path = chats.active_path(first["conversation_id"])
        assert [m.id for m in path] == [second["user_message_id"], second["assistant_message_id"]]
    r = bw(tmp_path, "chat", "--edit", first["assistant_message_id"], "x", check=False)
    assert r.returncode == 1 and "--edit takes your own message" in r.stderr
    r = bw(tmp_path, "chat", "--parent", first["user_message_id"], "x", check=False)
    assert r.returncode == 1 and f"use --edit {first['user_message_id']}" in r.stderr
