"""Pygments lexers compiled before they are needed, off the UI thread: ``warm_up``.

The first use of a Pygments lexer compiles its regular expressions (the Python lexer's
took 160-350 ms on a busy 2-core machine), and the first ``guess_lexer`` imports every
lexer module. On the UI thread that was a stall the first time a chat with code opened or
a reply streamed its first code block. ``warm_up`` does it once per process on a daemon
thread (``tasks.run_detached``: no window waits for it); a language not in ``COMMON`` still
compiles on first use.
"""

from __future__ import annotations

import threading

from app.window.workers.tasks import run_detached

COMMON = ("python", "bash", "javascript", "typescript", "json", "c", "cpp", "rust", "go", "java",
          "html", "css", "sql", "yaml", "toml", "diff")
"""The languages whose lexers are compiled ahead (code-block tags as models write them)."""

_lock = threading.Lock()
_thread: threading.Thread | None = None


def warm_up() -> threading.Thread:
    """Start compiling the lexers of ``COMMON`` (and importing all lexers, for guessing) on a
    daemon thread, the first time it is called; returns that thread (join it to wait)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = run_detached(_compile, "lexer-warm-up")
        return _thread


def _compile() -> None:
    """On the thread: compile ``COMMON``'s lexers; an error is logged (``run_detached``) and
    the UI thread compiles on first use instead."""
    from pygments.lexers import get_lexer_by_name, guess_lexer

    for name in COMMON:
        get_lexer_by_name(name)  # a lexer's regular expressions compile on first instantiation
    guess_lexer("#!/bin/sh\necho warm\n")  # imports every lexer module
