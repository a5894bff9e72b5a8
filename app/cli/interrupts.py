"""Ctrl+C and ``kill`` in the supervised child (app/cli/supervisor.py), and what the child
tells its supervisor.

A stop can reach the child twice: a terminal Ctrl+C goes to the whole process group
(supervisor and child), and the supervisor passes every SIGINT it gets on to the child,
so that ``kill -INT <pid of branchwise>`` (an IDE's stop button) stops the engine too.
The child therefore takes SIGINTs less than ``REPEAT_WINDOW_S`` apart as one: one Ctrl+C
is one stop. A person's second Ctrl+C is counted by the supervisor, which gets each one
exactly once, and ends the child at once.

The child reports facts to the supervisor through a pipe (``REPORT_ENV`` names its file
descriptor; one JSON object a line): which conversation and messages the reply belongs
to, and the closing lines to print. The supervisor prints those lines after the child
has ended, so they always come after its own "stopping…" line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading

from engine.process_exit import REPEAT_WINDOW_S, RepeatFilter

__all__ = ["REPEAT_WINDOW_S", "REPORT_ENV", "RepeatFilter", "install_child_handlers", "read_reports",
           "report", "say_at_end", "stop_sets", "stops_held", "what_was_kept"]

REPORT_ENV = "BRANCHWISE_REPORT_FD"
"""In the child's environment: the file descriptor of the pipe to the supervisor."""

_report_fd: int | None = None
stopped_by: int = signal.SIGINT
"""The signal behind the last stop the child took (for its exit code: 128 + it)."""
_cancel: threading.Event | None = None
_held: "HeldStop | None" = None


class HeldStop:
    """What :func:`stops_held` saw: ``signum`` is the stop that arrived while it held stops
    (SIGINT or SIGTERM), or 0 when none did."""

    def __init__(self) -> None:
        self.signum = 0


@contextlib.contextmanager
def stop_sets(cancel: threading.Event):
    """While generating: a stop sets ``cancel`` (the engine checks it between prefill
    batches and between tokens, so the reply ends cleanly with every shown token kept)
    instead of raising KeyboardInterrupt wherever Python happens to be."""
    global _cancel
    _cancel = cancel
    try:
        yield cancel
    finally:
        _cancel = None


@contextlib.contextmanager
def stops_held():
    """While storing what is already done (the KV snapshot after a finished reply): a stop
    is remembered instead of raising KeyboardInterrupt, so the work ends whole and the
    caller then stops. Yields a :class:`HeldStop`. A second Ctrl+C is not held: the
    supervisor counts it and ends the child at once (the snapshot is then lost, the reply
    is not: it was saved before)."""
    global _held
    held = HeldStop()
    _held = held
    try:
        yield held
    finally:
        _held = None


def install_child_handlers(graceful_term: bool) -> None:
    """In the child: take the report pipe from the environment, and make a SIGINT one stop
    (repeats within ``REPEAT_WINDOW_S`` are dropped): it sets the event of ``stop_sets``
    while one is active, else raises KeyboardInterrupt. With ``graceful_term`` a SIGTERM
    does the same, so ``kill PID`` keeps the reply streamed so far as a Ctrl+C does
    (chat, regenerate)."""
    global _report_fd
    fd = os.environ.pop(REPORT_ENV, "")  # not passed on: a command that runs branchwise again
    if fd.isdigit():
        _report_fd = int(fd)
        with contextlib.suppress(OSError):
            os.set_inheritable(_report_fd, False)
    repeats = RepeatFilter()

    def stop(signum, _frame):
        global stopped_by
        if repeats.is_repeat():
            return
        stopped_by = signum
        if _cancel is not None:
            _cancel.set()
            return
        if _held is not None:
            _held.signum = signum
            return
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread (tests run commands inline)
        signal.signal(signal.SIGINT, stop)
        if graceful_term:
            signal.signal(signal.SIGTERM, stop)


def report(**facts) -> None:
    """Tell the supervisor ``facts`` (JSON values); nothing when there is no supervisor."""
    if _report_fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(_report_fd, (json.dumps(facts) + "\n").encode())


def say_at_end(line: str) -> None:
    """Print ``line`` on stderr after the supervisor's own lines (through the supervisor
    when there is one, else now)."""
    if _report_fd is not None:
        report(say=line)
    else:
        print(line, file=sys.stderr)


def read_reports(fd: int) -> dict:
    """In the supervisor, after the child ended: the facts it reported, merged (later
    ones win), and ``say``: the lines to print, in order. Closes ``fd``."""
    os.set_blocking(fd, False)  # a grandchild could hold the write end open
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    os.close(fd)
    facts: dict = {"say": []}
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if "say" in item:
                facts["say"].append(str(item.pop("say")))
            facts.update(item)
    return facts


def what_was_kept(conversation_id: int | None, user_id: int | None, reply_id: int | None,
                  reply_chars: int | None = None, can_continue: bool = False) -> str:
    """Words for what a stopped turn left in the chats and how to go on from it
    (``can_continue``: the reply was saved with its token ids, so ``continue`` works)."""
    if reply_id is not None:
        size = f", {reply_chars:,} characters" if reply_chars is not None else ""
        go_on = (f"Finish it with 'branchwise continue {reply_id}', reply with" if can_continue
                 else "Go on with")
        return (f"The reply so far is saved as message {reply_id} in conversation {conversation_id} "
                f"(marked stopped{size}). {go_on} 'branchwise chat --conversation {conversation_id} \"...\"', "
                f"or get a new reply with 'branchwise regenerate {reply_id}'.")
    if user_id is not None:
        return (f"No reply text had been generated; your message was saved (message {user_id}); "
                f"answer it with 'branchwise regenerate {user_id}'.")
    return "Nothing was saved."
