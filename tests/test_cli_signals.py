"""Stopping a supervised CLI command (app/cli/supervisor.py, app/cli/interrupts.py) by a
signal to the `branchwise` process alone (an IDE's stop button, `kill -INT PID`), as a
terminal's Ctrl+C to the whole process group, and by a second Ctrl+C: the words must say
what the chats really hold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

LONG = ["chat", "--temperature", "0", "--max-tokens", "400", "Write a long essay about deserts."]


def _start(tmp_path, *args, new_group=False):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=new_group,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _reply_row(data_dir: Path):
    """The first assistant message once it is stored, else None."""
    from storage.chats import ChatStore

    if not (data_dir / "chats.sqlite3").exists():
        return None
    try:
        with ChatStore(data_dir / "chats.sqlite3") as chats:
            return next((m for m in chats.tree(1) if m.role == "assistant"), None)
    except Exception:  # noqa: BLE001 - being created by the process under test
        return None


def _wait_for_reply(proc, data_dir: Path) -> None:
    deadline = time.monotonic() + 300
    while _reply_row(data_dir) is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def _finish(proc, timeout=60):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _read_at_least(proc, n: int) -> str:
    """The first ``n`` or more bytes of the streamed reply (unbuffered, so communicate() gets the rest)."""
    shown = b""
    deadline = time.monotonic() + 300
    while True:
        assert time.monotonic() < deadline and proc.poll() is None
        shown += os.read(proc.stdout.fileno(), 4096)
        if len(shown) >= n:
            try:
                return shown.decode()
            except UnicodeDecodeError:  # a character split across two reads
                continue


def _stored_reply(data_dir: Path):
    from storage.chats import ChatStore

    with ChatStore(data_dir / "chats.sqlite3") as chats:
        return chats.get_message(2)


def test_sigint_to_the_supervisor_alone_stops_the_chat_and_keeps_the_reply(tmp_path):
    proc = _start(tmp_path, *LONG)
    shown = _read_at_least(proc, 40)  # the reply is streaming
    os.kill(proc.pid, signal.SIGINT)  # the supervisor only, not the engine child
    out, err = _finish(proc)
    assert proc.returncode == 130, err
    reply = _stored_reply(tmp_path)
    assert reply.status == "stopped" and reply.content.startswith(shown.strip()[:20])
    assert reply.content == (shown + out).strip()  # what was shown is what was kept
    assert err.strip().splitlines() == [
        "branchwise: stopping… (press Ctrl+C again to end the engine at once)",
        f"branchwise: stopped. The reply so far is saved as message 2 in conversation 1 (marked stopped, "
        f"{len(reply.content):,} characters). Finish it with 'branchwise continue 2', reply with "
        "'branchwise chat --conversation 1 \"...\"', or get a new reply with 'branchwise regenerate 2'."]


def test_a_reply_stopped_by_ctrl_c_keeps_its_kv_and_continue_restores_it(tmp_path):
    proc = _start(tmp_path, *LONG)
    _read_at_least(proc, 40)
    os.kill(proc.pid, signal.SIGINT)
    _, err = _finish(proc)
    assert proc.returncode == 130, err
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "continue", "2", "--json", "--temperature", "0",
                        "--max-tokens", "4"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["stats"]
    # the prompt and the stopped reply, all but the two tokens a restore always leaves to prefill
    assert s["restored_tokens"] == s["prompt_tokens"] - 2 and s["prefilled_tokens"] == 2


def test_a_terminal_ctrl_c_reaching_both_processes_is_one_stop_and_json_says_what_was_saved(tmp_path):
    proc = _start(tmp_path, *LONG[:1], "--json", *LONG[1:], new_group=True)
    _wait_for_reply(proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C in the terminal: supervisor and child get it
    out, err = _finish(proc)
    assert proc.returncode == 130, err
    reply = _stored_reply(tmp_path)
    result = json.loads(out)
    assert result == {"error": "interrupted", "conversation_id": 1, "user_message_id": 1,
                      "assistant_message_id": 2, "status": "stopped", "text": reply.content,
                      "saved": {"user_message": True, "reply": True, "stats": True, "kv_cache": True,
                                "problems": []}}
    lines = err.strip().splitlines()
    assert lines[0].startswith("branchwise: stopping…") and lines[1].startswith("branchwise: stopped. ")
    assert len(lines) == 2 and "ended the engine" not in err


def test_sigterm_to_the_supervisor_keeps_the_reply_like_ctrl_c(tmp_path):
    proc = _start(tmp_path, *LONG)
    _read_at_least(proc, 40)
    proc.send_signal(signal.SIGTERM)
    out, err = _finish(proc)
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it
    assert _stored_reply(tmp_path).status == "stopped"
    assert "saved as message 2 in conversation 1" in err


def test_sigint_to_the_supervisor_alone_stops_serve(tmp_path):
    proc = _start(tmp_path, "serve", "--port", "0")
    deadline = time.monotonic() + 300
    while "http://" not in (line := proc.stdout.readline()):
        assert line and time.monotonic() < deadline, "serve did not start"
    os.kill(proc.pid, signal.SIGINT)
    out, err = _finish(proc, timeout=30)
    assert proc.returncode == 0, err
    assert err.strip().splitlines()[-1] == "branchwise serve: stopped"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child pid from /proc")
def test_a_second_ctrl_c_says_the_partial_reply_is_saved(tmp_path):
    proc = _start(tmp_path, *LONG, new_group=True)
    shown = _read_at_least(proc, 200)
    time.sleep(1.0)  # past the half-second save interval
    child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    os.kill(child, signal.SIGSTOP)  # an engine that does not answer the first Ctrl+C
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = _finish(proc, timeout=30)
    assert proc.returncode == 130
    reply = _stored_reply(tmp_path)
    assert reply.status == "stopped" and len(reply.content) >= 100
    assert (shown + out).startswith(reply.content)
    assert err.strip().splitlines()[-1] == (
        f"branchwise: ended the engine at the second Ctrl+C. The reply so far is saved as message 2 in "
        f"conversation 1 (marked stopped, {len(reply.content):,} characters). Go on with "
        "'branchwise chat --conversation 1 \"...\"', or get a new reply with 'branchwise regenerate 2'.")


def test_two_deliveries_of_one_stop_are_one_and_a_later_one_counts():
    from app.cli.interrupts import REPEAT_WINDOW_S, RepeatFilter

    now = [100.0]
    repeats = RepeatFilter(clock=lambda: now[0])
    assert not repeats.is_repeat()
    now[0] += 0.01  # the forwarded copy of a terminal Ctrl+C
    assert repeats.is_repeat()
    now[0] += REPEAT_WINDOW_S
    assert not repeats.is_repeat()  # a new stop


_STOP_DURING_SNAPSHOT = """
import os, signal, sys
from engine.core import Engine

store_kv = Engine.snapshot

def stopped_while_storing(self, stats=None):
    os.kill(os.getpid(), signal.SIGTERM)  # `kill PID` lands while the reply's KV is being stored
    return store_kv(self, stats)

Engine.snapshot = stopped_while_storing
from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_while_the_kv_is_stored_finishes_storing_it_first(tmp_path):
    """Issue #27, item 5: `kill` right after a reply, while its KV snapshot is written, used
    to end the child inside the snapshot (KeyboardInterrupt), so the next turn prefilled the
    whole reply again. Now the snapshot ends whole, then the command stops (143)."""
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path), "BRANCHWISE_SUPERVISED": str(os.getpid())}
    first = subprocess.run([sys.executable, "-c", _STOP_DURING_SNAPSHOT, "chat", "--json", "--temperature", "0",
                            "--max-tokens", "48", "Name three deserts."], capture_output=True, text=True,
                           env=env, timeout=300)
    assert first.returncode == 143, first.stderr
    assert "the reply and its KV cache were saved first" in first.stderr
    turn = json.loads(first.stdout)
    assert turn["saved"]["kv_cache"] is True, turn
    reply_end = turn["stats"]["prompt_tokens"] + turn["stats"]["generated_tokens"]
    env.pop("BRANCHWISE_SUPERVISED")
    follow = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--json", "--conversation", "1",
                             "--temperature", "0", "--max-tokens", "4", "Which is largest?"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert follow.returncode == 0, follow.stderr
    restored = json.loads(follow.stdout)["stats"]["restored_tokens"]
    assert restored >= reply_end - 2, (restored, reply_end)  # the reply's KV came back (the template may re-render its end)
