"""``branchwise import FILE...`` and ``branchwise conversations export --all``: restore and backup.

``import`` reads exports of ChatGPT, Claude, Open WebUI, LM Studio, SillyTavern
and Branchwise itself (``storage.importers``), keeping every branch; ``export
--all`` writes every conversation as one Branchwise JSON file, the backup that
``import`` restores. Hooked into ``app/cli/commands.py`` by ``add_import_parser``,
``add_export_all_arguments`` and ``run_import`` / ``run_export_all``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

from storage.importers.records import (
    FORMAT_NAMES,
    NO_KV_NOTE,
    FileStatus,
    ImportFormat,
    ImportProgress,
    ImportSummary,
)

SKIPPED_SHOWN = 10
"""Skipped items listed per file in the text output (``--json`` lists all)."""


def add_import_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``import`` subcommand to ``sub`` (the CLI's subparsers)."""
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


def add_export_all_arguments(export: argparse.ArgumentParser) -> None:
    """Add ``--all`` and ``--output`` to ``conversations export``."""
    export.add_argument("--all", action="store_true",
                        help="every conversation, as one Branchwise JSON file (a backup; `branchwise import` "
                             "restores it)")
    export.add_argument("--output", "-o", metavar="FILE", help="write to FILE (mode 0600; an existing FILE is replaced) instead of standard output")


def run_import(args: argparse.Namespace, data_dir: Path) -> int:
    """Run ``branchwise import``; return the exit code (1 if a file failed)."""
    from storage.importers import import_files
    from storage.paths import CHATS_DB

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


# -- text output ----------------------------------------------------------------------------


def _print_summary(summary: ImportSummary) -> None:
    verb = "Would import" if summary.dry_run else "Imported"
    for f in summary.files:
        name = FORMAT_NAMES.get(ImportFormat(f.format), f.format) if f.format in set(ImportFormat) else f.format
        label = f"{f.path} ({name})" if name else f.path
        if f.status == FileStatus.FAILED:
            print(f"branchwise: {f.error}. Nothing from this file was imported.", file=sys.stderr)
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
