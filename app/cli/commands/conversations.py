"""``branchwise conversations list|show|export|delete``: the chats, read, exported (one
conversation as Markdown or Branchwise JSON; every one with ``export --all``, the backup
``branchwise import`` restores) and deleted for good."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

from app.cli import arguments, opening
from app.cli.arguments import Parser, common_options
from app.cli.storage_commands import add_delete_parser

NAME = "conversations"
LOADS_ENGINE = False
STOP_ON_TERM = False


def add_parser(sub) -> None:
    """Add ``conversations`` and its actions to ``sub`` (the CLI's subparsers)."""
    common = common_options()
    conv = sub.add_parser("conversations", help="list, show or export conversations")
    conv_sub = conv.add_subparsers(dest="action", required=True, parser_class=Parser)
    conv_sub.add_parser("list", parents=[common], help="every conversation: id, * when pinned, title")
    show = conv_sub.add_parser("show", parents=[common], help="the active branch of one conversation")
    show.add_argument("id", type=arguments.row_id)
    export = conv_sub.add_parser("export", parents=[common],
                                 help="json: the whole tree, every branch; markdown: the active branch")
    export.add_argument("id", type=arguments.row_id, nargs="?")
    export.add_argument("--format", choices=["json", "markdown"], default="markdown")
    export.add_argument("--all-branches", action="store_true", help="markdown: every message, not only the active branch")
    add_delete_parser(conv_sub, common)
    add_export_all_arguments(export)  # `export --all`: the backup `branchwise import` restores


def run(args) -> int:
    """``conversations list``, ``show``, ``export`` or ``delete``; returns the exit code."""
    from app.session.markdown_export import conversation_markdown
    from storage.importers.branchwise import conversation_json
    from app.cli.terminal_text import echo

    chats = opening.open_chats(args)
    if args.action == "list":
        rows = chats.list_conversations()
        if args.json:
            print(json.dumps([{"id": c.id, "title": c.title, "pinned": c.pinned, "updated_at": c.updated_at,
                               "messages": len(chats.tree(c.id))} for c in rows]))
        else:
            for c in rows:
                pin = "*" if c.pinned else " "
                echo(f"{c.id:>5} {pin} {' '.join(c.title.splitlines())}")  # escaped on a terminal
        return 0
    if args.action == "show":
        data = conversation_json(chats, args.id)
        if args.json:
            print(json.dumps(data, ensure_ascii=False))
        else:
            echo(conversation_markdown(data, active_only=True))
        return 0
    if args.action == "delete":
        from app.cli.storage_commands import cmd_delete

        return cmd_delete(args, chats, lambda: opening.open_store(args))
    if args.all:
        return run_export_all(args, chats)
    if args.action == "export" and args.id is None:
        raise ValueError("conversations export needs a conversation id, or --all for every conversation.")
    data = conversation_json(chats, args.id)
    if args.format == "json":
        text = json.dumps(data, ensure_ascii=False, indent=2)
    else:
        from app.cli.storage_commands import branch_note

        text = (branch_note(data, args.all_branches) + "\n\n"  # the one note on what is left out
                + conversation_markdown(data, active_only=not args.all_branches, left_out_note=False))
    if args.output:
        write_file(Path(args.output), lambda out: out.write(text + "\n"))
        print(f"Exported conversation {args.id} ({args.format}) to {args.output}.", file=sys.stderr)
    elif args.format == "json":
        print(text)
    else:
        echo(text)  # control characters escaped on a terminal
    return 0


def add_export_all_arguments(export: argparse.ArgumentParser) -> None:
    """Add ``--all`` and ``--output`` to ``conversations export``."""
    export.add_argument("--all", action="store_true",
                        help="every conversation, as one Branchwise JSON file (a backup; `branchwise import` "
                             "restores it)")
    export.add_argument("--output", "-o", metavar="FILE", help="write to FILE (mode 0600; an existing FILE is replaced) instead of standard output")


def run_export_all(args: argparse.Namespace, chats: Any) -> int:
    """Write every conversation (``export --all``, always JSON) to ``args.output`` or standard output."""
    from storage.importers.branchwise import write_export_all

    if args.output:
        count = write_file(Path(args.output), lambda out: write_export_all(chats, out))
        print(f"Exported {count} conversation{'s' * (count != 1)} to {args.output}.", file=sys.stderr)
    else:
        write_export_all(chats, sys.stdout)
    return 0


def write_file(target: Path, write: Callable[[IO[str]], Any]) -> Any:
    """Run ``write`` on a new file that then replaces ``target`` (mode 0600, as ``mkstemp``
    makes it; an existing ``target`` is replaced). Written beside the target and renamed,
    so an interrupted export leaves no half file. Returns what ``write`` returned.

    Raises:
        ValueError: the file cannot be written (the words name it; nothing was written).
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=".branchwise-export-", dir=target.parent or ".")
    except OSError as exc:
        raise ValueError(f"Cannot write {target}: {exc.strerror or exc}.") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            result = write(out)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ValueError(f"Cannot write {target}: {exc.strerror or exc}. Nothing was written.") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return result
