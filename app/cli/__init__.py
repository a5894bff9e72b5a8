"""The ``branchwise`` command (``app.cli:main``): the window by default, a headless CLI otherwise.

``main`` builds the parser and runs a command; ``commands/`` holds one module per
subcommand, listed once in ``commands.COMMANDS``; ``opening`` opens the data folder, the
chats, the prefix store and the engine for them; ``arguments`` holds the argument types
and shared options; ``reply`` is one turn of ``chat`` or ``regenerate``; ``supervisor``
runs the commands that load llama.cpp in a child. Nothing in this package imports Qt;
``branchwise`` with no subcommand hands over to ``app.window.shell.gui``.
"""

from app.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
