"""The ``branchwise`` command: the window by default, and a headless CLI for everything else.

:func:`build_parser` asks each command module of :data:`app.cli.commands.COMMANDS` for its
parser; :func:`main` runs the chosen one, in a supervised child when it loads llama.cpp
(app/cli/supervisor.py). No Qt is imported on the CLI paths; ``branchwise`` with no
subcommand opens the window. Every failure a person can cause (a bad model file, an
unknown id, a full disk) ends with one readable line on stderr and a non-zero exit code;
tracebacks go to the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from app.cli import commands, opening, supervisor
from app.cli.arguments import Parser
from app.cli.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE

log = logging.getLogger("branchwise")

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the window's own options, then each command of
    :data:`app.cli.commands.COMMANDS` as a subcommand."""
    p = Parser(
        prog="branchwise",
        description="Branchwise: chat with local models; never read the same tokens twice.",
    )
    p.add_argument("--data-dir", dest="gui_data_dir", help=argparse.SUPPRESS)
    p.add_argument("--model", dest="gui_model", metavar="PATH", help="open the window on this GGUF model")
    p.add_argument("--self-test", action="store_true", help="run one turn and one resume on the bundled model, then exit")
    p.add_argument("--version", action="store_true",
                   help="print the versions, llama.cpp's CPU features and the weight-repacking decision")
    p.add_argument("--screenshot", metavar="PNG", help="open the window offscreen, save a screenshot, exit")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for command in commands.COMMANDS:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``branchwise argv`` (default: ``sys.argv[1:]``); returns the exit code (0; 1 for an
    error, said in one line; 2 for a usage error; 70 after a crash in llama.cpp; 128 plus
    the signal after Ctrl+C or ``kill``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    Parser.json_errors = "--json" in argv
    args = parser.parse_args(argv)
    command = commands.by_name(args.command)
    _model_before_command(parser, args)
    _setup_logging(args)
    from storage.errors import StorageError

    crash_log = None
    if args.self_test or command.LOADS_ENGINE:
        # Decided before anything heavy is imported: the parent only waits (app/cli/supervisor.py).
        try:
            data_dir = opening.data_dir(args)
        except StorageError as exc:
            print(f"branchwise: {exc}", file=sys.stderr)
            return EXIT_ERROR
        if not supervisor.in_child():
            return supervisor.run_supervised(argv, data_dir, getattr(args, "repack", "auto"))
        crash_log = supervisor.enable_crash_log(data_dir)
        supervisor.exit_with_parent()
        from app.cli.interrupts import install_child_handlers

        install_child_handlers(graceful_term=command.STOP_ON_TERM)

    import sqlite3

    from app.serve import ServeError
    from engine.errors import EngineError

    try:
        if args.version:
            return _print_version(args)
        if args.self_test:
            from app.cli.self_test import run_self_test

            return run_self_test()
        return command.run(args)
    except (EngineError, StorageError, ServeError, ValueError) as exc:
        log.debug("command failed", exc_info=True)
        print(f"branchwise: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            from app.cli.storage_commands import error_json

            print(error_json(exc))
        return EXIT_ERROR
    except sqlite3.DatabaseError as exc:
        log.debug("database error", exc_info=True)
        from storage.errors import is_disk_full

        from storage.paths import disk_full_message, free_space

        low = free_space(opening.data_dir(args))
        if is_disk_full(exc) or (low is not None and low < 1024**2):  # not damage: a full disk

            print(f"branchwise: {disk_full_message(opening.data_dir(args), 'the last change was not saved')}",
                  file=sys.stderr)
            return EXIT_ERROR
        print(f"branchwise: the chat database could not be read ({exc}). It may be damaged: "
              "move chats.sqlite3 out of the data folder to start afresh; nothing was changed.",
              file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # before a reply started (a stopped reply is handled in app/cli/reply.py)
        from app.cli import interrupts

        interrupts.say_at_end("branchwise: interrupted")
        if getattr(args, "json", False):
            print(json.dumps({"error": "interrupted", "saved": None}))
        return 128 + interrupts.stopped_by
    except BrokenPipeError:
        return EXIT_ERROR
    finally:
        if crash_log is not None:
            import faulthandler

            faulthandler.disable()
            try:
                crash_log.close()
            except OSError:  # a full disk: the log's last line is lost, not the command's result
                pass


def _model_before_command(parser, args) -> None:
    """``branchwise --model X chat ...``: the window's ``--model`` placed before a command
    counts as the command's own ``--model``; a command without models refuses it (exit 2)."""
    if not args.gui_model or commands.by_name(args.command) is commands.DEFAULT:
        return
    if not hasattr(args, "model"):
        parser.error(f"--model does not apply to '{args.command}'")
    if args.model and args.model != args.gui_model:
        parser.error(f"--model is given twice ({args.gui_model} before '{args.command}', {args.model} after it)")
    args.model = args.gui_model


def _setup_logging(args) -> None:
    level = getattr(logging, os.environ.get("BRANCHWISE_LOG", "WARNING").upper(), logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the window logs INFO to its file, not here
        handler.setLevel(level)


def _print_version(args) -> int:
    """What a bug report needs: versions, llama.cpp's system info, the repacking decision."""
    from engine import cpu

    versions = cpu.build_versions()
    info = cpu.system_info()
    data_dir = opening.data_dir(args)
    try:
        decision = cpu.decide_repack("auto", os.environ.get(cpu.ENV_VAR), info, cpu.CrashVerdict.applies(data_dir))
    except ValueError as exc:
        print(f"branchwise: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for name, value in versions.items():
        print(f"{name:<18}{value}")
    print(f"{'llama.cpp system':<18}{info}")
    print(f"{'weight repacking':<18}{'on' if decision.repack else 'off'} ({decision.source}: {decision.reason})")
    print(f"{'data folder':<18}{data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
