"""``branchwise cache stats|verify|clear``: the KV prefix store."""

from __future__ import annotations

import argparse
import json

from app.cli import opening
from app.cli.arguments import Parser, common_options, parse_size

NAME = "cache"
LOADS_ENGINE = False
STOP_ON_TERM = False


def add_parser(sub) -> None:
    """Add ``cache`` and its actions to ``sub`` (the CLI's subparsers)."""
    common = common_options()
    cache = sub.add_parser("cache", help="the KV prefix store")
    cache_sub = cache.add_subparsers(dest="action", required=True, parser_class=Parser)
    for name, text in (("stats", "sizes and hit counts"), ("verify", "check every block's checksum, remove bad ones"),
                       ("clear", "remove every block")):
        c = cache_sub.add_parser(name, parents=[common], help=text)
        c.add_argument("--cache-budget", type=parse_size, default=None, help=argparse.SUPPRESS)


def run(args) -> int:
    """``cache stats``, ``verify`` or ``clear``; returns the exit code."""
    from storage.prefix_store import StoreFull

    try:
        store = opening.open_store(args)
    except StoreFull:
        if args.action != "clear":
            raise
        from app.cli.storage_commands import clear_on_full_disk
        from storage.paths import KVCACHE_DB

        # The one command that frees space must work on a full disk: the block files go first.
        store = clear_on_full_disk(opening.data_dir(args) / KVCACHE_DB, lambda: opening.open_store(args))
    if args.action == "clear":
        store.clear()
        result = {"cleared": True, **store.stats()}
    elif args.action == "verify":
        report = store.verify()
        result = {"checked": report.checked, "bad": report.bad, "removed": report.removed, **store.stats()}
    else:
        result = store.stats()
    if store.recovered_from:
        result["recovered_from"] = store.recovered_from
    if args.json:
        print(json.dumps(result))
        return 0
    if args.action == "verify":
        print(f"checked {report.checked} blocks: {report.bad} failed their checksum; "
              f"{report.removed} blocks removed (with their descendants)")
    elif args.action == "clear":
        print("prefix store cleared")
    if store.recovered_from:
        print(f"the cache file was damaged ({store.recovered_from}) and has been replaced by an empty one")
    from app.cli.storage_commands import stats_text

    print(stats_text(result))
    return 0
