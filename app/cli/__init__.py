"""The ``branchwise`` command (``app.cli:main``): the window by default, a headless CLI otherwise.

``commands`` holds the argument parser and the subcommands. Nothing in this package
imports Qt; ``branchwise`` with no subcommand hands over to ``app.window.shell.gui``.
"""

from app.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
