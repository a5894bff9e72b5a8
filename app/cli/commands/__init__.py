"""The ``branchwise`` subcommands, one module each, listed once in :data:`COMMANDS`.

A command module has:

* ``NAME``: the subcommand (``branchwise NAME ...``);
* ``add_parser(subparsers)``: adds its parser (and any actions under it);
* ``run(args) -> int``: runs it and returns the exit code; an error a person can cause is
  raised as ``ValueError``, ``StorageError``, ``EngineError`` or ``ServeError`` and
  printed by app/cli/main.py as one line;
* ``LOADS_ENGINE``: True when it loads llama.cpp, so it runs in a supervised child
  (app/cli/supervisor.py) that turns a native crash into words;
* ``STOP_ON_TERM``: True when a SIGTERM stops it as Ctrl+C does, keeping what was streamed.

app/cli/main.py builds the parser from :data:`COMMANDS`, in this order (the order
``branchwise --help`` lists them), and runs ``by_name(args.command)``.
"""

from __future__ import annotations

from types import ModuleType

from app.cli.commands import (
    bench,
    cache,
    chat,
    continue_reply,
    conversations,
    gui,
    import_chats,
    models,
    regenerate,
    serve,
)

COMMANDS: tuple[ModuleType, ...] = (chat, regenerate, continue_reply, serve, conversations, import_chats, cache,
                                    bench, gui, models)

DEFAULT = gui
"""What ``branchwise`` with no command runs."""


def by_name(name: str | None) -> ModuleType:
    """The command module called ``name`` (:data:`DEFAULT` for None).

    Raises:
        KeyError: no command has that name (argparse refuses it before this).
    """
    if name is None:
        return DEFAULT
    return {command.NAME: command for command in COMMANDS}[name]
