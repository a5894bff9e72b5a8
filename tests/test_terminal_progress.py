"""Progress on the terminal (issue 17): a bar on stderr when it is a terminal, nothing
with --json, --quiet, or when stderr is a pipe; a phase shorter than the delay draws
nothing."""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from app.cli.progress import TerminalProgress, wanted

STORY = ("The river town kept its bridges in good repair, and every spring the mayor walked "
         "across each one to count the loose stones. ") * 14  # about 350 tokens to prefill


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_wanted_only_on_a_terminal_without_json_or_quiet() -> None:
    tty, pipe = FakeTTY(), io.StringIO()
    assert wanted(SimpleNamespace(json=False, quiet=False), tty)
    assert not wanted(SimpleNamespace(json=True, quiet=False), tty)
    assert not wanted(SimpleNamespace(json=False, quiet=True), tty)
    assert not wanted(SimpleNamespace(json=False, quiet=False), pipe)


def test_a_short_phase_draws_nothing_and_a_long_one_draws_a_bar() -> None:
    out = FakeTTY()
    progress = TerminalProgress(True, out, delay_s=0.2)
    progress.on_progress("restore", 0, 500)  # a restore that ends at once
    progress.on_progress("prefill", 0, 1000)
    assert out.getvalue() == ""
    time.sleep(0.3)  # the prefill is still running after the delay: it is drawn
    progress.on_progress("prefill", 400, 1000)
    time.sleep(0.3)
    progress.stop()
    text = out.getvalue()
    assert "Reading the prompt (prefill)" in text and "400 / 1,000 tokens" in text
    assert "Restoring" not in text


def test_disabled_progress_writes_nothing() -> None:
    out = FakeTTY()
    progress = TerminalProgress(False, out, delay_s=0)
    with progress.loading():
        progress.hashing(10, 100)
    progress.on_progress("prefill", 5, 10)
    progress.stop()
    assert out.getvalue() == ""


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_bars_reach_the_terminal_while_a_model_load_points_stderr_at_dev_null() -> None:
    """llama-cpp-python sends descriptor 2 to /dev/null while it loads a model; a bar first
    drawn then used to decide "no terminal" and stay blank for the whole command (CI)."""
    master, slave = os.openpty()
    terminal = os.fdopen(slave, "w", encoding="utf-8")
    progress = TerminalProgress(True, terminal, delay_s=0)
    saved = os.dup(slave)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), slave)  # what llama_cpp._utils.suppress_stdout_stderr does to fd 2
    try:
        progress.update("load", 0, None)
        progress.on_progress("prefill", 512, 733)
    finally:
        os.dup2(saved, slave)
        os.close(saved)
    seen = b""
    while select.select([master], [], [], 0.5)[0]:
        seen += os.read(master, 65536)
        if b"512 / 733 tokens" in seen:
            break
    progress.stop()
    terminal.close()
    os.close(master)
    assert b"Reading the prompt (prefill)" in seen and b"512 / 733 tokens" in seen


def _run_in_pty(data_dir, *args) -> tuple[int, bytes, bytes]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe."""
    master, slave = os.openpty()
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir), "TERM": "xterm", "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    stdout = proc.stdout.read()
    proc.wait(600)
    os.close(master)
    return proc.returncode, stdout, seen


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_chat_shows_a_bar_on_a_terminal_and_json_prints_only_json(tmp_path) -> None:
    engine = ["--temperature", "0", "--max-tokens", "4", "--ctx-size", "1024", "--no-cache"]
    # about 760 prompt tokens: two prefill batches of at most 512, so the bar is also drawn
    # from a progress update, not only from its timer (a busy machine may delay the timer)
    code, stdout, terminal = _run_in_pty(tmp_path, "chat", *engine, STORY * 2 + "Who counted?")
    assert code == 0, terminal.decode(errors="replace")
    assert b"Reading the prompt (prefill)" in terminal
    assert b"tokens" in terminal and b"Reading the prompt" not in stdout
    code, stdout, terminal = _run_in_pty(tmp_path, "chat", "--json", *engine, STORY + "Who counted?")
    assert code == 0
    assert json.loads(stdout)["text"]  # stdout is exactly one JSON object
    assert stdout.strip().count(b"\n") == 0
    assert b"Reading the prompt" not in terminal and b"\x1b[?25l" not in terminal
