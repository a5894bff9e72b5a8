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
    export.add_argument("--format", choices=["json", "markdown"],
                        help="markdown (the default for one conversation) or json (the default with --all)")
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
        if args.id is not None:
            Parser(prog="branchwise conversations export").error("give a conversation id or --all, not both")
        return run_export_all(args, chats)
    if args.id is None:
        Parser(prog="branchwise conversations export").error("give a conversation id, or --all for every conversation")
    args.format = args.format or "markdown"
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
    """Write every conversation (``export --all``) to ``args.output`` or standard output:
    one Branchwise JSON file (the default: the backup ``branchwise import`` restores), or
    with ``--format markdown`` each conversation's Markdown one after the other, oldest
    first, a rule between them."""
    from storage.importers.branchwise import write_export_all

    write = write_export_all if (args.format or "json") == "json" else (
        lambda chats, out: write_markdown_all(chats, out, args.all_branches))
    if args.output:
        count = write_file(Path(args.output), lambda out: write(chats, out))
        print(f"Exported {count} conversation{'s' * (count != 1)} ({args.format or 'json'}) to {args.output}.",
              file=sys.stderr)
    elif (args.format or "json") == "json":
        write(chats, sys.stdout)
    else:
        from app.cli.terminal_text import for_stream

        class _Escaped:  # control characters escaped on a terminal, as a single export is
            def write(self, text: str) -> None:
                sys.stdout.write(for_stream(text))

        write(chats, _Escaped())
    return 0


def write_markdown_all(chats: Any, out: Any, all_branches: bool = False) -> int:
    """Write the Markdown of every conversation to ``out`` (its ``write``), one at a time,
    oldest first; returns how many were written."""
    from app.cli.storage_commands import branch_note
    from app.session.markdown_export import conversation_markdown
    from storage.importers.branchwise import conversation_json

    ids = sorted(c.id for c in chats.list_conversations())
    for n, conversation_id in enumerate(ids):
        data = conversation_json(chats, conversation_id)
        out.write(("\n---\n\n" if n else "") + branch_note(data, all_branches) + "\n\n"
                  + conversation_markdown(data, active_only=not all_branches, left_out_note=False) + "\n")
    return len(ids)


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
