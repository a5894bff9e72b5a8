"""A native engine crash in the CLI: one readable line, the message kept, the next command works."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli.supervisor import EXIT_CRASHED


def _bw(data_dir, *args, env_extra=None):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600)


def test_a_forced_segfault_is_one_line_keeps_the_message_and_the_next_command_answers(tmp_path):
    crashed = _bw(tmp_path, "chat", "--temperature", "0", "--max-tokens", "8", "Name a colour.",
                  env_extra={"BRANCHWISE_DEBUG_CRASH": "before-first-token"})
    assert crashed.returncode == EXIT_CRASHED
    lines = crashed.stderr.strip().splitlines()
    assert len(lines) == 1, crashed.stderr
    line = lines[0]
    assert line.startswith("branchwise: the engine crashed inside llama.cpp with a segmentation fault")
    log = tmp_path / "logs" / "cli.log"
    assert str(log) in line and "message 1" in line and "branchwise regenerate 1" in line
    assert "Fatal Python error: Segmentation fault" in log.read_text()
    assert "Traceback" not in crashed.stderr and crashed.stdout == ""

    tree = json.loads(_bw(tmp_path, "conversations", "export", "1", "--format", "json").stdout)
    assert [(m["role"], m["content"]) for m in tree["messages"]] == [("user", "Name a colour.")]
    # a forced crash is not the CPU's fault: no verdict is remembered
    assert not (tmp_path / "cpu-verdict.json").exists()

    answered = _bw(tmp_path, "regenerate", "1", "--temperature", "0", "--max-tokens", "8", "--json")
    assert answered.returncode == 0, answered.stderr
    reply = json.loads(answered.stdout)
    assert reply["conversation_id"] == 1 and reply["user_message_id"] == 1 and reply["text"].strip()
    tree = json.loads(_bw(tmp_path, "conversations", "export", "1", "--format", "json").stdout)
    assert [(m["role"], m["parent_id"]) for m in tree["messages"]] == [("user", None), ("assistant", 1)]

    # the same reply as an uncrashed run from scratch
    cold = _bw(tmp_path / "cold", "chat", "--temperature", "0", "--max-tokens", "8", "--json", "--no-cache",
               "Name a colour.")
    assert json.loads(cold.stdout)["text"] == reply["text"]


def test_version_names_the_builds_and_the_repacking_decision(tmp_path):
    r = _bw(tmp_path, "--version", env_extra={"BRANCHWISE_REPACK": "off"})
    assert r.returncode == 0, r.stderr
    fields = dict(line.split(None, 1) if not line.startswith(("llama", "weight", "data")) else
                  (line[:18].strip(), line[18:]) for line in r.stdout.splitlines())
    import llama_cpp

    assert fields["llama-cpp-python"] == llama_cpp.__version__
    assert fields["llama.cpp system"].startswith("CPU :")
    assert fields["weight repacking"].startswith("off (environment: BRANCHWISE_REPACK=off is set)")
    assert _bw(tmp_path, "--version", env_extra={"BRANCHWISE_REPACK": "maybe"}).returncode == 2


def test_a_supervised_child_does_not_pass_its_supervision_on(tmp_path):
    """A command that runs branchwise again (bench does, for each turn) must give that run
    its own supervisor: a grandchild that inherited the variable saw a parent pid that was
    not its parent and exited 70 without a word (`branchwise bench --model` failed so)."""
    script = (
        "import os, subprocess, sys\n"
        "from app.cli import supervisor\n"
        "supervisor.exit_with_parent()\n"
        "out = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"BRANCHWISE_SUPERVISED\"))'],"
        " capture_output=True, text=True).stdout.strip()\n"
        "print(out)\n"
    )
    env = {**os.environ, "BRANCHWISE_SUPERVISED": str(os.getpid())}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the child pid from /proc")
def test_a_second_ctrl_c_ends_an_engine_that_does_not_stop(tmp_path):
    """The CLI's half of the watchdog behind Stop (issue #16): the first Ctrl+C asks the
    engine to stop between steps; when it cannot answer (frozen here with SIGSTOP, as one
    stuck in native code would be), the second ends it, with one line and exit code 130."""
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", "--temperature", "0", "--max-tokens", "400",
                             "Write a long story about a lighthouse keeper."],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group, as a terminal gives it
    try:
        deadline = time.monotonic() + 120
        while not _unanswered(tmp_path):  # the message is stored: the engine is generating
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(child, signal.SIGSTOP)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C in the terminal
        time.sleep(1.0)
        assert proc.poll() is None  # the frozen engine did not stop
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130
    lines = err.strip().splitlines()
    assert lines[0] == "branchwise: stopping… (press Ctrl+C again to end the engine at once)"
    assert lines[-1].startswith("branchwise: ended the engine at the second Ctrl+C. ")
    reply = _reply(tmp_path)
    if reply is None:  # frozen before the first token
        assert lines[-1].endswith("your message was saved (message 1); answer it with 'branchwise regenerate 1'.")
    else:  # the words say what the chats hold (tests/test_cli_signals.py checks the text)
        assert "saved as message 2 in conversation 1 (marked stopped" in lines[-1] and reply.status == "stopped"
    assert "Traceback" not in err
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


@pytest.mark.skipif(os.name != "posix", reason="process groups")
def test_one_ctrl_c_stops_the_reply_and_keeps_it(tmp_path):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "chat", "--temperature", "0", "--max-tokens", "400",
                             "Write a long story about a lighthouse keeper."],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        first = proc.stdout.read(40)  # the reply is streaming
        os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "ended the engine" not in err
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        reply = chats.get_message(2)
    assert reply.status == "stopped" and reply.content.startswith(first.strip()[:20])


def _default_sigint() -> None:
    """In the child before exec: Ctrl+C as a terminal delivers it. A shell starts background
    jobs with SIGINT ignored, and Python keeps an inherited SIG_IGN, so under `.ci/run &`
    the command would never see the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _reply(data_dir: Path):
    from storage.chats import ChatStore

    with ChatStore(data_dir / "chats.sqlite3") as chats:
        return next((m for m in chats.tree(1) if m.role == "assistant"), None)


def _unanswered(data_dir: Path) -> bool:
    from storage.chats import ChatStore

    if not (data_dir / "chats.sqlite3").exists():
        return False
    try:
        with ChatStore(data_dir / "chats.sqlite3") as chats:
            return chats.branches.newest_unanswered_user_message(0) is not None
    except Exception:  # noqa: BLE001 - being created by the process under test
        return False


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_kill_ends_a_supervised_command_with_the_shell_s_code_for_the_signal(tmp_path):
    """`kill PID` (SIGTERM) of a running `branchwise serve`: the child ends the same way and
    the parent exits 143 (128 + 15), as a shell reports it, not 241 (-15 & 0xff)."""
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while "http://" not in (line := proc.stdout.readline()):
            assert line and time.monotonic() < deadline, "serve did not start"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
