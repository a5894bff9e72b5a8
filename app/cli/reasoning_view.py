"""A reasoning model's thinking in ``branchwise chat`` and ``regenerate``.

On a terminal the thinking streams dimmed (SGR 2, faint) before the answer, with a blank
line between them; ``--reasoning hide`` leaves it out and ``--reasoning show`` prints it
also to a pipe (plain, no escape codes). The text itself goes through
``terminal_text.for_stream``, so a model cannot send control sequences of its own.
"""

from __future__ import annotations

import argparse
import sys

DIM, RESET = "\x1b[2m", "\x1b[0m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--reasoning show|hide`` and ``--thinking-budget N`` (for chat and regenerate)."""
    parser.add_argument("--reasoning", choices=["show", "hide"], default=None,
                        help="a reasoning model's thinking: shown dimmed before the answer on a "
                             "terminal, left out of pipes (default); show or hide it")
    parser.add_argument("--thinking-budget", type=_tokens, default=None, metavar="N",
                        help="end a reasoning model's thinking after N tokens and let it answer (default: no limit)")


def _tokens(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens") from None
    if n < 0:
        raise argparse.ArgumentTypeError("the thinking budget is 0 or more tokens")
    return n


class ReasoningPrinter:
    """Writes streamed reasoning before the answer. ``shown`` decides from ``--reasoning``
    (None: on a terminal only) whether anything is printed."""

    def __init__(self, choice: str | None, stream: bool, out=None):
        self.out = out or sys.stdout
        tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.shown = stream and (choice == "show" or (choice is None and tty))
        self.dim = tty
        self._open = False

    def reasoning(self, text: str, _tok: int = -1) -> None:
        """A piece of the thinking."""
        if not self.shown or not text:
            return
        from app.cli.terminal_text import for_stream

        if not self._open:
            self._open = True
            if self.dim:
                self.out.write(DIM)
        self.out.write(for_stream(text))
        self.out.flush()

    def answer_starts(self) -> None:
        """Close the dimmed thinking before the first piece of the answer."""
        if self._open:
            self._open = False
            self.out.write((RESET if self.dim else "") + "\n\n")
            self.out.flush()
