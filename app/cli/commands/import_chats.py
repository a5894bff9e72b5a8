"""``branchwise import FILE...``: restore chats from exports.

It reads exports of ChatGPT, Claude, Open WebUI, LM Studio, SillyTavern and Branchwise
itself (``storage.importers``), keeping every branch; a Branchwise file is what
``conversations export --all`` (app/cli/commands/conversations.py) writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli import opening
from app.cli.arguments import common_options
from storage.importers.records import (
    FORMAT_NAMES,
    NO_KV_NOTE,
    FileStatus,
    ImportFormat,
    ImportProgress,
    ImportSummary,
)

NAME = "import"
LOADS_ENGINE = False
STOP_ON_TERM = False

SKIPPED_SHOWN = 10
"""Skipped items listed per file in the text output (``--json`` lists all)."""


def add_parser(sub: Any) -> None:
    """Add the ``import`` subcommand to ``sub`` (the CLI's subparsers)."""
    common = common_options()
    p = sub.add_parser(
        "import", parents=[common],
        help="import chats from ChatGPT, Claude, Open WebUI, LM Studio, SillyTavern or a Branchwise export",
        description="Import exported chats with every branch (edits, regenerations, swipes) kept. "
                    "FILE may be the .zip the service emails you, or a folder of chat files. Importing the same file again adds "
                    "nothing twice; a file with an error imports nothing and says why.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="conversations.json, an export .zip, an Open WebUI / LM Studio / Branchwise .json, "
                        "or a SillyTavern .jsonl")
    p.add_argument("--format", choices=[f.value for f in ImportFormat], default="auto",
                   help="the app that wrote the files (default: recognise each file)")
    p.add_argument("--dry-run", action="store_true", help="check the files and count what would be imported; "
                                                          "change nothing")


def run(args: argparse.Namespace) -> int:
    """Run ``branchwise import``; return the exit code (1 if a file failed)."""
    from storage.importers import import_files
    from storage.paths import CHATS_DB

    data_dir = opening.data_dir(args)
    bar = None if args.json or not sys.stderr.isatty() else _Bar()
    try:
        summary = import_files([Path(f) for f in args.files], data_dir / CHATS_DB, format=args.format,
                               dry_run=args.dry_run, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    if args.json:
        print(json.dumps(summary.to_dict(), ensure_ascii=False))
    else:
        _print_summary(summary)
    return 1 if summary.failed else 0


# -- text output ----------------------------------------------------------------------------


def _print_summary(summary: ImportSummary) -> None:
    verb = "Would import" if summary.dry_run else "Imported"
    for f in summary.files:
        name = FORMAT_NAMES.get(ImportFormat(f.format), f.format) if f.format in set(ImportFormat) else f.format
        label = f"{f.path} ({name})" if name else f.path
        if f.status == FileStatus.FAILED:
            print(f"branchwise: {f.error.rstrip('.')}. Nothing from this file was imported.", file=sys.stderr)
            continue
        if f.status == FileStatus.CANCELLED:
            print(f"{f.path}: cancelled; nothing from this file was imported.")
            continue
        parts = []
        if f.conversations_added:
            parts.append(f"{_n(f.conversations_added, 'conversation')}, {_n(f.messages, 'message')}, "
                         f"{_n(f.branches, 'branch', 'branches')}")
        if f.conversations_updated:
            parts.append(f"{_n(f.conversations_updated, 'conversation')} imported before got new messages")
        if f.conversations_unchanged:
            parts.append(f"{_n(f.conversations_unchanged, 'conversation')} already imported")
        if f.status == FileStatus.UNCHANGED:
            print(f"{label}: nothing new ({'; '.join(parts) or 'no conversations in it'}).")
        else:
            print(f"{verb} {label}: {'; '.join(parts)}.")
        for s in f.skipped[:SKIPPED_SHOWN]:
            print(f"  skipped: {s.where}: {s.reason}")
        if len(f.skipped) > SKIPPED_SHOWN:
            print(f"  … and {len(f.skipped) - SKIPPED_SHOWN} more skipped items (--json lists them all)")
    if summary.conversations and not summary.dry_run:
        print(NO_KV_NOTE)


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


class _Bar:
    """A rich progress bar on stderr: bytes read of the current file."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TextColumn("{task.fields[conversations]:,} conversations"),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.progress.start()
        self.tasks: dict[int, Any] = {}

    def update(self, p: ImportProgress) -> None:
        task = self.tasks.get(p.file_index)
        if task is None:
            task = self.tasks[p.file_index] = self.progress.add_task(
                f"Importing {p.path.name}", total=p.bytes_total or None, conversations=0)
        self.progress.update(task, completed=p.bytes_done, conversations=p.conversations)

    def close(self) -> None:
        self.progress.stop()
