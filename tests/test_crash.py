"""A native engine crash in the CLI: one readable line, the message kept, the next command works."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
