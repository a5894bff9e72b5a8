"""Run the CLI's engine commands in a child process, so a native crash becomes words.

llama.cpp can die by a signal (a segmentation fault in a CPU kernel, an abort on a
failed assertion); Python cannot catch that in the process it happens in. So
``branchwise chat`` (and ``regenerate``, ``bench``, ``serve``, ``--self-test``) re-runs
itself as a child with the same arguments and the same terminal, and this parent only
waits, passing SIGINT and SIGTERM on to the child (so ``kill -INT`` of ``branchwise``
stops it as a terminal Ctrl+C does; app/cli/interrupts.py takes a doubled Ctrl+C as one)
and printing the child's closing lines after its own. When the child dies by a signal the parent prints one line that says what
happened, where the stack at the crash is (``faulthandler`` in the child writes every
thread's Python stack to ``<data dir>/logs/cli.log``), which message was kept and what to do, remembers the crash
for this machine when weight repacking was on (engine/cpu.py), and exits 70.

Cost: one more interpreter start before the model loads (README, "CPU support").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.cli.exit_codes import EXIT_CRASHED, EXIT_INTERRUPTED
from app.cli.interrupts import REPORT_ENV, read_reports, what_was_kept
from engine.cpu import CRASH_ENV  # a debug switch that makes the engine crash
from engine.process_exit import crash_name

CHILD_ENV = "BRANCHWISE_SUPERVISED"
"""Set in the child's environment to the parent's pid: the child runs the command itself."""
LOG_NAME = "cli.log"


def in_child() -> bool:
    """True in the child process that actually runs the command."""
    return bool(os.environ.get(CHILD_ENV))


def crash_description(returncode: int) -> str | None:
    """Words for an exit code that means the process crashed ("a segmentation fault
    (SIGSEGV)"), or None when it exited or was stopped normally (engine/process_exit.py)."""
    name = crash_name(returncode)
    if name is None:
        return None
    if returncode < 0:
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({signal.Signals(-returncode).name})"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} (0x{returncode & 0xFFFFFFFF:08X})"


def child_command(argv: list[str]) -> list[str]:
    """The command line that re-runs ``branchwise`` with ``argv`` in a child."""
    if getattr(sys, "frozen", False):  # PyInstaller: the executable is branchwise itself
        return [sys.executable, *argv]
    return [sys.executable, "-m", "app.cli", *argv]


def run_supervised(argv: list[str], data_dir: Path, repack_setting: str) -> int:
    """Run ``branchwise argv`` in a child process and return its exit code.

    Args:
        argv: the arguments as given (without the program name).
        data_dir: the data folder the command uses (for the log and the crash verdict).
        repack_setting: the ``--repack`` value, to tell whether repacking was on.

    Returns:
        The child's exit code, 70 after a crash, or 130 when a second Ctrl+C ended the
        child (with one line on stderr).
    """
    env = dict(os.environ, **{CHILD_ENV: str(os.getpid())})
    started = time.time()
    report_r, report_w = os.pipe() if os.name == "posix" else (None, None)
    if report_w is not None:
        env[REPORT_ENV] = str(report_w)
    proc = subprocess.Popen(child_command(argv), env=env, pass_fds=(report_w,) if report_w is not None else ())
    if report_w is not None:
        os.close(report_w)
    interrupts, killed = 0, False

    forwarded: set[int] = set()

    def forward(signum, _frame=None):  # `kill PID` of branchwise ends the child the same way
        forwarded.add(signum)
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    def interrupt(signum, _frame):
        # The first SIGINT is passed on to the child, which stops between two prefill batches
        # or tokens and saves what it has. After a terminal Ctrl+C the child gets it twice
        # (from the terminal and from here) and takes the two as one (app/cli/interrupts.py).
        # A second SIGINT here ends the child at once.
        nonlocal interrupts, killed
        interrupts += 1
        if interrupts == 1:
            print("branchwise: stopping… (press Ctrl+C again to end the engine at once)", file=sys.stderr)
            forward(signum)
        elif proc.poll() is None:
            killed = True
            proc.kill()

    previous = signal.signal(signal.SIGINT, interrupt)
    previous_term = signal.signal(signal.SIGTERM, forward)
    try:
        returncode = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    facts = read_reports(report_r) if report_r is not None else {"say": []}
    for line in facts["say"]:  # the child's closing lines, after ours
        print(line, file=sys.stderr)
    if killed:
        print(ended_message(data_dir, started, facts), file=sys.stderr)
        return EXIT_INTERRUPTED
    what = crash_description(returncode)
    if what is None and returncode < 0 and -returncode not in forwarded:  # SIGKILL: the OOM killer, kill -9
        print(killed_message(-returncode, data_dir, started, facts), file=sys.stderr)
        return 128 - returncode
    if what is None:  # a normal exit, or ended by a signal that is no crash (SIGTERM: 128 + 15)
        return 128 - returncode if returncode < 0 else returncode
    print(crash_message(what, data_dir, repack_setting, started, facts.get("repack")), file=sys.stderr)
    return EXIT_CRASHED


def ended_message(data_dir: Path, started: float, facts: dict | None = None) -> str:
    """The line printed after a second Ctrl+C ended the engine: what the chats hold now
    (``facts``: what the child reported, app/cli/interrupts.py)."""
    facts = facts or {}
    reply_id, chars = facts.get("reply"), None
    if reply_id is not None:
        chars = _saved_reply_chars(data_dir, reply_id)
        if chars is None:  # not in the chats after all
            reply_id = None
    user_id = facts.get("user")
    if user_id is None:
        user_id = _unanswered_message(data_dir, started)
    kept = what_was_kept(facts.get("conversation"), user_id, reply_id, chars)
    return f"branchwise: ended the engine at the second Ctrl+C. {kept}"


def killed_message(signum: int, data_dir: Path, started: float, facts: dict | None = None) -> str:
    """The line printed when the child was ended by a signal nobody here sent (SIGKILL from
    the kernel's out-of-memory killer or ``kill -9``): what the chats hold now."""
    from app.cli.interrupts import what_was_kept

    facts = facts or {}
    reply_id, chars = facts.get("reply"), None
    if reply_id is not None:
        chars = _saved_reply_chars(data_dir, reply_id)
        if chars is None:
            reply_id = None
    user_id = facts.get("user")
    if user_id is None:
        user_id = _unanswered_message(data_dir, started)
    kept = what_was_kept(facts.get("conversation"), user_id, reply_id, chars)
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = " (by the system's out-of-memory killer, or by another program)" if signum == getattr(
        signal, "SIGKILL", 9) else ""
    return f"branchwise: the engine was ended by {name}{why}. {kept}"


def _saved_reply_chars(data_dir: Path, message_id: int) -> int | None:
    """How many characters of reply ``message_id`` are saved (it is marked stopped now), or None."""
    from storage.paths import CHATS_DB

    path = Path(data_dir) / CHATS_DB
    if not path.exists():
        return None
    from storage.chats import ChatStore

    with contextlib.suppress(Exception), ChatStore(path) as chats:
        chats.mark_interrupted_streams()  # the killed child left it "streaming"
        return len(chats.get_message(message_id).content)
    return None


def crash_message(what: str, data_dir: Path, repack_setting: str, started: float,
                  repack: bool | None = None) -> str:
    """The one line printed after a crash (and the verdict recorded, when it applies).
    ``repack``: whether the crashed engine loaded its model with repacking on, as it reported
    (None: it crashed before saying; then the decision is made again without the model)."""
    log_path = Path(data_dir) / "logs" / LOG_NAME
    parts = [f"branchwise: the engine crashed inside llama.cpp with {what}."]
    kept = _unanswered_message(data_dir, started)
    if kept is not None:
        parts.append(f"Your message was saved (message {kept}); answer it with 'branchwise regenerate {kept}'.")
    if os.environ.get(CRASH_ENV):
        parts.append(f"(The crash was forced by {CRASH_ENV}.)")
    elif repack if repack is not None else _repack_was_on(data_dir, repack_setting):
        from engine.cpu import remember_crash

        remember_crash(data_dir, what)
        parts.append("Weight repacking was on; it is now off on this machine, so the next command should work "
                     "(BRANCHWISE_REPACK=on brings it back).")
    else:
        parts.append("Try a smaller --ctx-size or --threads 1, or another model file.")
    parts.append(f"The stack at the crash is in {log_path}; please attach it and the output of "
                 "'branchwise --version' to a bug report.")
    return " ".join(parts)


def _repack_was_on(data_dir: Path, repack_setting: str) -> bool:
    from engine.cpu import ENV_VAR, CrashVerdict, decide_repack, system_info

    with contextlib.suppress(ValueError):
        return decide_repack(repack_setting, os.environ.get(ENV_VAR), system_info(),
                             CrashVerdict.applies(data_dir)).repack
    return False


def _unanswered_message(data_dir: Path, since: float) -> int | None:
    """The id of the user message the crashed command saved and left unanswered, if any."""
    from storage.paths import CHATS_DB

    path = Path(data_dir) / CHATS_DB
    if not path.exists():
        return None
    from storage.chats import ChatStore

    with contextlib.suppress(Exception), ChatStore(path) as chats:
        return chats.branches.newest_unanswered_user_message(since)
    return None


def exit_with_parent() -> None:
    """In the child: die with the parent, so killing ``branchwise`` ends the generation
    (Linux: ``PR_SET_PDEATHSIG``; other POSIX systems: a thread that watches the parent).
    The parent's pid comes in ``BRANCHWISE_SUPERVISED``; any other value (tests set
    "inline" to run a command in their own process) watches nothing."""
    try:
        parent = int(os.environ.get(CHILD_ENV, ""))
    except ValueError:
        return
    # Not inherited: a command that runs branchwise again (bench) must supervise its own child.
    del os.environ[CHILD_ENV]
    if os.name != "posix":
        return
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1  # linux/prctl.h
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(EXIT_CRASHED)
    if sys.platform.startswith("linux"):
        return
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(EXIT_CRASHED)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def enable_crash_log(data_dir: Path):
    """In the child: write Python's and the native stack of every thread to ``logs/cli.log``
    when the process dies by a signal (``faulthandler``). Returns the open file (keep it),
    or None when the log cannot be written (a full disk: the command goes on without it)."""
    import faulthandler

    logs = Path(data_dir) / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(logs / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        f = os.fdopen(fd, "a", encoding="utf-8")
    except OSError:
        return None
    try:
        f.write(f"--- branchwise {' '.join(sys.argv[1:2])} pid {os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
    except OSError:
        pass  # the header is lost, not the log
    faulthandler.enable(file=f, all_threads=True)
    return f

