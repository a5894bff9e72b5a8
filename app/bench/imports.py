"""Time and peak memory of importing a synthetic ChatGPT export: ``python -m app.bench.imports``.

Writes a ``conversations.json`` shaped like ChatGPT's (a root node, the empty
hidden system message, a chain of user/assistant turns, a regenerated answer
every few turns), imports it into an empty ``chats.sqlite3`` and prints:
the file size, the wall time and messages per second (a run without
tracemalloc), and the peak memory of a second run (tracemalloc's peak of
Python allocations, and the process's ru_maxrss). Memory should stay flat as
the file grows: the import streams one conversation at a time.

    python -m app.bench.imports                      # 50,000 messages
    python -m app.bench.imports --messages 500000    # ten times more: the peak should not follow
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import IO

from storage.importers import import_files

TURNS_PER_CONVERSATION = 100
BRANCH_EVERY = 10


def write_synthetic_chatgpt(out: IO[str], conversations: int, turns: int, branch_every: int = BRANCH_EVERY) -> int:
    """Write a ChatGPT ``conversations.json`` to ``out``, one conversation at a time.

    Each conversation has ``turns`` chained messages and, every ``branch_every``
    turns, a second (regenerated) assistant answer. Returns the number of
    messages written (that an import adds: the root and system nodes hold none).
    """
    total = 0
    out.write("[")
    for c in range(conversations):
        mapping = {"root": {"id": "root", "message": None, "parent": None, "children": ["sys"]},
                   "sys": {"id": "sys", "parent": "root", "children": [], "message": {
                       "id": "sys", "author": {"role": "system"},
                       "content": {"content_type": "text", "parts": [""]},
                       "metadata": {"is_visually_hidden_from_conversation": True}}}}
        parent = "sys"
        for t in range(turns):
            mid = f"{c}-{t}"
            role = "user" if t % 2 == 0 else "assistant"
            mapping[mid] = _node(mid, parent, role, f"Message {t} of conversation {c}: "
                                 "a paragraph of ordinary text about the weather, trains and 東京. " * 3)
            mapping[parent]["children"].append(mid)
            total += 1
            if role == "assistant" and branch_every and t % branch_every == 1:
                alt = f"{mid}-alt"
                mapping[alt] = _node(alt, parent, "assistant", f"A regenerated answer {t}.")
                mapping[parent]["children"].append(alt)
                total += 1
            parent = mid
        conv = {"title": f"Conversation {c}", "create_time": 1.7e9 + c, "update_time": 1.7e9 + c + turns,
                "conversation_id": f"bench-{c}", "current_node": parent, "default_model_slug": "gpt-4o",
                "mapping": mapping}
        out.write(("," if c else "") + "\n" + json.dumps(conv, ensure_ascii=False))
    out.write("\n]\n")
    return total


def _node(mid: str, parent: str, role: str, text: str) -> dict:
    return {"id": mid, "parent": parent, "children": [], "message": {
        "id": mid, "author": {"role": role}, "create_time": 1.7e9,
        "content": {"content_type": "text", "parts": [text]}, "metadata": {}, "recipient": "all"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.imports", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=50_000, help="about how many messages (default 50,000)")
    p.add_argument("--keep", metavar="DIR", help="write the files here and keep them")
    args = p.parse_args(argv)
    conversations = max(1, round(args.messages / (TURNS_PER_CONVERSATION * 1.05)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "conversations.json"
        with open(source, "w", encoding="utf-8") as out:
            written = write_synthetic_chatgpt(out, conversations, TURNS_PER_CONVERSATION)
        size = source.stat().st_size
        rss_before = _maxrss_mb()

        start = time.perf_counter()
        summary = import_files([source], folder / "timed.sqlite3")
        seconds = time.perf_counter() - start
        if summary.failed:
            print(summary.failed[0].error, file=sys.stderr)
            return 1

        tracemalloc.start()
        import_files([source], folder / "traced.sqlite3")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_after = _maxrss_mb()

    print(f"Import bench · synthetic ChatGPT export · {conversations:,} conversations, {written:,} messages, "
          f"{size / 1e6:,.1f} MB")
    print(f"  time           {seconds:,.2f} s ({summary.messages / seconds:,.0f} messages/s), "
          f"{summary.branches:,} branches")
    print(f"  peak memory    {peak / 2**20:,.1f} MiB of Python allocations (tracemalloc, second run)")
    print(f"  process RSS    {rss_after:,.0f} MiB high-water mark ({rss_before:,.0f} MiB before importing)")
    return 0


def _maxrss_mb() -> float:
    try:
        import resource  # not on Windows
    except ImportError:
        return float("nan")
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)


if __name__ == "__main__":
    sys.exit(main())
