"""Text helpers for conversations: automatic titles and safe full-text queries."""

from __future__ import annotations

from typing import Final

TITLE_LIMIT: Final = 48
"""Longest automatic title, in characters, ellipsis included."""


def auto_title(text: str, limit: int = TITLE_LIMIT) -> str:
    """Make a conversation title from the first user message.

    Takes the first non-blank line, collapses runs of whitespace, and if it is
    longer than ``limit`` characters cuts it at a word boundary and adds "…"
    (the result is at most ``limit`` characters). Returns "" for blank text.
    """
    line = next((line for line in text.splitlines() if line.strip()), "")
    line = " ".join(line.split())
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    if line[limit - 1] != " ":  # the cut falls inside a word: back up to its start
        space = head.rfind(" ")
        if space >= limit // 2:
            head = head[:space]
    return head.rstrip(" ,.;:-") + "…"


def fts_query(text: str) -> str:
    """Turn what a person typed into a safe FTS5 MATCH expression.

    Every whitespace-separated term is quoted (so ``AND``, ``(``, ``"``, ``*``
    or ``:`` are plain text, never syntax) and the last term matches as a
    prefix, so results appear while typing. Terms without a letter or digit
    are dropped. Returns "" when nothing is left to search for.
    """
    terms = [term for term in text.split() if any(ch.isalnum() for ch in term)]
    quoted = ['"' + term.replace('"', '""') + '"' for term in terms]
    if quoted:
        quoted[-1] += "*"
    return " ".join(quoted)
