"""The remote engine (``--engine-url``) against real OpenAI-compatible servers started
here: ``branchwise serve`` and llama-cpp-python's own ``python -m llama_cpp.server``.
The conversation tree stays local; only the replies come from the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from serve_procs import BranchwiseServe, LlamaCppServer, free_port

SAMPLING = ("--temperature", "0", "--max-tokens", "16")
COUNT = "Count from 1 to 400, one number per line, with nothing else."


def bw(data_dir, *args, check=True):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    r = subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def chat(data_dir, remote: tuple, *args) -> dict:
    return json.loads(bw(data_dir, "chat", "--json", *SAMPLING, *remote, *args).stdout)


def conversation_script(data_dir, remote: tuple = ()) -> tuple[dict, list[dict]]:
    """Two turns, an edit of the second message (a sibling under the first reply) and a
    regenerate of the edited turn's reply. Returns the exported tree and the results."""
    a = chat(data_dir, remote, "--system", "You answer in one sentence.", "What is a bridge?")
    cid = a["conversation_id"]
    b = chat(data_dir, remote, "--conversation", cid, "What is it made of?")
    c = chat(data_dir, remote, "--parent", a["assistant_message_id"], "Who builds them?")
    d = json.loads(bw(data_dir, "regenerate", "--json", *SAMPLING, *remote, c["assistant_message_id"]).stdout)
    tree = json.loads(bw(data_dir, "conversations", "export", cid, "--format", "json").stdout)
    return tree, [a, b, c, d]


def shape(tree: dict, with_replies: bool) -> list[tuple]:
    """The tree without ids, times, stats and token ids: (role, content, parent index, status)."""
    index = {m["id"]: i for i, m in enumerate(tree["messages"])}
    return [(m["role"], m["content"] if with_replies or m["role"] == "user" else bool(m["content"].strip()),
             index.get(m["parent_id"]), m["status"]) for m in tree["messages"]] + [
        ("active", [index[i] for i in tree["active_path"]]), ("system", tree["system_prompt"])]


@pytest.fixture(scope="module")
def local_tree(tmp_path_factory):
    tree, _ = conversation_script(tmp_path_factory.mktemp("local"))
    return tree


def test_against_branchwise_serve_the_tree_equals_a_local_run(tmp_path, local_tree):
    (tmp_path / "server").mkdir()
    with BranchwiseServe(tmp_path / "server") as server:
        server.start()
        tree, results = conversation_script(tmp_path / "client", ("--engine-url", server.url))
    assert shape(tree, with_replies=True) == shape(local_tree, with_replies=True)
    assert all(m["token_ids"] is None for m in tree["messages"])  # the server sends text, not ids
    assert {m["model"] for m in tree["messages"] if m["role"] == "assistant"} == {"SmolLM2-135M-Instruct.Q4_1"}
    second = results[1]["stats"]  # the server restored the first turn and reported it
    assert second["restore_source"] == "server" and second["reported"]
    assert second["restored_tokens"] >= results[0]["stats"]["prompt_tokens"]
    assert second["prefilled_tokens"] == second["prompt_tokens"] - second["restored_tokens"] < 20
    # the regenerate resends the edited turn's prompt: all of it but 2 tokens is cached
    assert results[3]["stats"]["restored_tokens"] == results[3]["stats"]["prompt_tokens"] - 2
    assert not (tmp_path / "server" / "chats.sqlite3").exists()  # served chats are not saved


def test_against_llama_cpp_server_the_tree_round_trips(tmp_path, local_tree, model_path):
    with LlamaCppServer(model_path, tmp_path) as server:
        server.start()
        tree, results = conversation_script(tmp_path / "client", ("--engine-url", server.url))
        regen = results[3]
    assert shape(tree, with_replies=False) == shape(local_tree, with_replies=False)
    assert regen["stats"]["restore_source"] == "server" and regen["text"].strip()


def _kill_mid_reply(tmp_path, server, remote_args) -> None:
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path / "client")}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", "--temperature", "0", "--max-tokens", "1500",
                             *remote_args, COUNT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    shown = b""
    while len(shown) < 24:  # some of the reply has been printed
        byte = proc.stdout.read(1)
        assert byte, proc.stderr.read().decode()
        shown += byte
    server.kill()
    out, err = proc.communicate(timeout=120)
    shown += out
    err = err.decode()
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert lines[-1].startswith("branchwise: The server at 127.0.0.1:") and "mid-reply" in lines[-1], err
    assert "partial reply is kept" in lines[-1] and "Traceback" not in err
    tree = json.loads(bw(tmp_path / "client", "conversations", "export", "1", "--format", "json").stdout)
    user, reply = tree["messages"]
    assert user["content"] == COUNT
    assert reply["status"] == "stopped" and reply["content"].strip()
    assert shown.decode() == reply["content"] + "\n"  # all that was shown is kept, and nothing else
    md = bw(tmp_path / "client", "conversations", "export", "1").stdout
    assert "*(stopped)*" in md


def test_killing_branchwise_serve_mid_reply_keeps_the_partial_reply(tmp_path):
    (tmp_path / "server").mkdir()
    with BranchwiseServe(tmp_path / "server", "--threads", "1") as server:
        server.start()
        _kill_mid_reply(tmp_path, server, ("--engine-url", server.url))


def test_killing_llama_cpp_server_mid_reply_keeps_the_partial_reply(tmp_path, model_path):
    with LlamaCppServer(model_path, tmp_path) as server:
        server.start()
        _kill_mid_reply(tmp_path, server, ("--engine-url", server.url, "--engine-model", "smollm"))


def test_no_server_is_one_line_and_the_message_is_kept(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = bw(tmp_path, "chat", "--engine-url", url, "--engine-model", "m", "Hello there", check=False)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Could not connect to the server at 127.0.0.1:" in r.stderr, r.stderr
    tree = json.loads(bw(tmp_path, "conversations", "export", "1", "--format", "json").stdout)
    assert [(m["role"], m["content"]) for m in tree["messages"]] == [("user", "Hello there")]


def test_a_wrong_key_is_one_line_and_the_message_is_kept(tmp_path):
    (tmp_path / "server").mkdir()
    with BranchwiseServe(tmp_path / "server", "--api-key", "right") as server:
        server.start()
        r = bw(tmp_path / "c", "chat", "--engine-url", server.url, "--engine-key", "wrong", "Hello", check=False)
        # the kept message has no reply: a new one is not stacked under it, it is answered in place
        stacked = bw(tmp_path / "c", "chat", "--engine-url", server.url, "--engine-key", "right",
                     "--conversation", "1", "Hello again", check=False)
        ok = json.loads(bw(tmp_path / "c", "regenerate", "1", "--json", *SAMPLING, "--engine-url", server.url,
                           "--engine-key", "right").stdout)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "refused the API key (401)" in r.stderr and "--engine-key" in r.stderr
    assert stacked.returncode == 1 and "'branchwise regenerate 1'" in stacked.stderr
    assert ok["text"].strip() and ok["user_message_id"] == 1
    tree = json.loads(bw(tmp_path / "c", "conversations", "export", "1", "--format", "json").stdout)
    assert [(m["role"], m["content"]) for m in tree["messages"]][0] == ("user", "Hello")
    assert [m["role"] for m in tree["messages"]] == ["user", "assistant"]


def test_a_bad_url_is_a_usage_error(tmp_path):
    r = bw(tmp_path, "chat", "--engine-url", "ftp://example/v1", "Hello", check=False)
    assert r.returncode == 1 and "must be an http:// or https:// URL" in r.stderr
