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


def snippet_spans(text: str, terms: list[str], limit: int = SNIPPET_CHARS) -> tuple[str, list[tuple[int, int]]]:
    """An excerpt of ``text`` around the first of ``terms`` (any case), and the (start, end)
    character spans of every term in it; "…" shows where text was cut. Whitespace runs
    become one space. The excerpt is plain text: show it as text, never as markup."""
    pattern = re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)),
                         re.IGNORECASE) if terms else None
    cut_head = cut_tail = False
    if pattern and len(text) > 8 * limit:  # a long text (a pasted file): flatten only around the match
        low = text.lower()  # str.find is far faster than a case-blind regex over a megabyte
        found = [i for i in (low.find(t.lower()) for t in terms) if i >= 0]
        a = max(0, min(found) - 2 * limit) if found else 0
        b = a + 4 * limit + max(map(len, terms))
        if found and pattern.search(text, a, b):  # else (lower() changed lengths): the whole text
            cut_head, cut_tail, text = a > 0, b < len(text), text[a:b]
    flat = " ".join(text.split())
    first = pattern.search(flat) if pattern else None
    start = 0 if first is None else max(0, first.start() - limit // 4)
    if start:
        space = flat.find(" ", start, first.start() if first else start)
        start = space + 1 if space != -1 else start
    end = min(len(flat), start + limit)
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if first is not None and space > first.end() else end
    lead = "…" if start or cut_head else ""
    piece = lead + flat[start:end] + ("…" if end < len(flat) or cut_tail else "")
    spans = [(m.start() + len(lead), m.end() + len(lead)) for m in pattern.finditer(flat[start:end])] if pattern else []
    return piece, spans


def mark_spans(text: str, spans: list[tuple[int, int]], marks: tuple[str, str]) -> str:
    """``text`` with each (start, end) span of ``spans`` (in order, not overlapping) between ``marks``."""
    for a, b in reversed(spans):
        text = text[:a] + marks[0] + text[a:b] + marks[1] + text[b:]
    return text


def snippet(text: str, terms: list[str], marks: tuple[str, str], limit: int = SNIPPET_CHARS) -> str:
    """``snippet_spans`` with every term between ``marks``."""
    return mark_spans(*snippet_spans(text, terms, limit), marks)
