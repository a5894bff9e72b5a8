"""Text helpers for conversations: automatic titles, search terms and search snippets."""

from __future__ import annotations

import re
import unicodedata
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


SNIPPET_CHARS: Final = 120
"""Longest search snippet, in characters, not counting the marks and ellipses."""


def search_terms(text: str) -> list[str]:
    """Split what a person typed into search terms: whitespace-separated, in order,
    duplicates (ignoring case) and terms made only of punctuation dropped. "C++",
    "苹果" and "🍎" are terms; "(", "*" and "--" are not."""
    terms: list[str] = []
    seen: set[str] = set()
    for term in text.split():
        term = term.replace("\x00", "")
        if not term or all(unicodedata.category(ch).startswith("P") for ch in term):
            continue
        if term.casefold() not in seen:
            seen.add(term.casefold())
            terms.append(term)
    return terms


def snippet(text: str, terms: list[str], marks: tuple[str, str], limit: int = SNIPPET_CHARS) -> str:
    """An excerpt of ``text`` around the first of ``terms`` (any case), every term in
    it between ``marks``; "…" shows where text was cut. Whitespace runs become one space."""
    flat = " ".join(text.split())
    pattern = re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)),
                         re.IGNORECASE) if terms else None
    first = pattern.search(flat) if pattern else None
    start = 0 if first is None else max(0, first.start() - limit // 4)
    if start:
        space = flat.find(" ", start, first.start() if first else start)
        start = space + 1 if space != -1 else start
    end = min(len(flat), start + limit)
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if first is not None and space > first.end() else end
    piece = flat[start:end]
    if pattern:
        piece = pattern.sub(lambda m: f"{marks[0]}{m.group(0)}{marks[1]}", piece)
    return ("…" if start else "") + piece + ("…" if end < len(flat) else "")
