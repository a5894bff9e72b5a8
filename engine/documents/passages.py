"""Cutting a document into passages, and the search query a question makes.

Passages are what the document search (``storage.attachments``, SQLite FTS5 with the
trigram tokenizer and BM25) ranks. They are consecutive slices of each page's text, so the
page is the passages of that page joined: the text is stored once, as passages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.documents.render import Passage

PASSAGE_CHARS = 1_200
"""Longest passage, in characters (about 300 tokens of English): long enough to hold a
paragraph's context, short enough that a dozen fit in a 4,096-token prompt."""

SEARCH_CHARS_PER_TOKEN = 3.0
"""Characters per token assumed when filling a prompt's room with passages (English is
3.5-4.5; the chosen passages are then counted exactly and the last ones dropped until they fit)."""

_MIN_CUT = PASSAGE_CHARS // 2
_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")


def cut_page(text: str) -> list[str]:
    """Cut ``text`` into slices of at most PASSAGE_CHARS, each ending after a paragraph
    break where there is one in its second half, else a line break, a sentence end, a
    comma or a space (a hard cut only in a run without any). ``"".join(result) == text``."""
    out: list[str] = []
    start = 0
    while len(text) - start > PASSAGE_CHARS:
        window = text[start:start + PASSAGE_CHARS]
        cut = PASSAGE_CHARS
        for mark in _BREAKS:
            at = window.rfind(mark, _MIN_CUT)
            if at >= 0:
                cut = at + len(mark)
                break
        out.append(text[start:start + cut])
        start += cut
    if start < len(text) or not out:
        out.append(text[start:])
    return out


def cut(pages: Sequence[str], paged: bool) -> list[Passage]:
    """Every page cut into passages, numbered from 1 in document order, each with its page
    (None when the file has no pages). An empty page keeps one empty passage, so the
    page count survives the round trip."""
    out: list[Passage] = []
    for page_number, text in enumerate(pages, 1):
        for piece in cut_page(text):
            out.append(Passage(len(out) + 1, page_number if paged else None, piece))
    return out


def pages_of(passages: Sequence[Passage], paged: bool) -> tuple[str, ...]:
    """The pages again from ``cut``'s passages (the inverse of ``cut``)."""
    if not paged:
        return ("".join(p.text for p in passages),)
    pages: dict[int, list[str]] = {}
    for p in passages:
        pages.setdefault(p.page or 1, []).append(p.text)
    return tuple("".join(pages[n]) for n in sorted(pages))


_WORD = re.compile(r"\w[\w'’.-]*\w|\w", re.UNICODE)
STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself
just me more most my myself no nor not now of off on once only or other our ours ourselves out
over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves tell say says said
document file page pages text please explain describe give show find mentioned mention
""".split())


def query_terms(question: str, limit: int = 24) -> list[str]:
    """The words of ``question`` worth searching for: three characters or more (the
    trigram index finds nothing shorter), not a stop word, lowercased, without repeats, in
    order, at most ``limit``."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(question.lower()):
        word = word.strip(".-'’")
        if len(word) >= 3 and word not in STOP_WORDS:
            seen.setdefault(word, None)
    return list(seen)[:limit]
