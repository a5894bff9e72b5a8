"""``branchwise gui`` (and ``branchwise`` with no command): open the window."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli.arguments import DATA_DIR_HELP
from app.cli.exit_codes import EXIT_ERROR

NAME = "gui"
LOADS_ENGINE = False
"""The window runs its engine in a process of its own (engine/worker.py)."""
STOP_ON_TERM = False


def add_parser(sub) -> None:
    """Add ``gui`` to ``sub`` (the CLI's subparsers)."""
    gui = sub.add_parser("gui", help="open the window (the default)")
    gui.add_argument("--data-dir", help=DATA_DIR_HELP)
    gui.add_argument("--model", dest="gui_model", metavar="PATH", default=argparse.SUPPRESS,
                     help="open the window on this GGUF model (default: the last one opened, else the embedded "
                          "SmolLM2-135M-Instruct)")


def run(args) -> int:
    """Open the window on ``--model`` and the data folder (``--screenshot PNG``: offscreen, save,
    exit); returns its exit code, or 1 with one line on stderr when there is no display."""
    from app.window.shell.gui import run

    if args.screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    elif _no_display():
        print("branchwise: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset). "
              "Use the command line (branchwise --help) or set QT_QPA_PLATFORM=offscreen.",
              file=sys.stderr)
        return EXIT_ERROR
    data_dir = getattr(args, "data_dir", None) or args.gui_data_dir
    code = run(data_dir, args.gui_model, screenshot=args.screenshot)
    if code in (130, 143):  # Ctrl+C or SIGTERM closed the window the way its close button does
        how = "Ctrl+C" if code == 130 else "a stop signal (SIGTERM)"
        print(f"branchwise: the window was closed by {how}; your chats and their KV cache are saved.",
              file=sys.stderr)
    return code


def _no_display() -> bool:
    return (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"))
