"""The one fixed form an attachment takes in the prompt.

An attached file goes into its user message, before the question, as this block (README,
"Chat with your documents"; the format is part of the prompt, so changing it changes the
tokens of every stored conversation with an attachment, and their KV blocks are no longer
found):

    [Attached file: report.pdf (PDF, 3 pages)]
    [Page 1]
    …the text of page 1…
    [Page 2]
    …
    [End of report.pdf]

    The question.

A file without pages (text, Markdown, DOCX, HTML, CSV, JSON) has no ``[Page N]`` lines. Two
files are two blocks, in the order attached, separated by a blank line. A document searched
instead of sent whole (``engine.documents.passages``) shows the passages chosen when the
message was sent, each under ``[Passage N, page P]``, and its header says so. Nothing in a
block depends on the time, the turn or the conversation: the same file under the same name
makes the same text, so the same tokens, in every turn, branch and restart, and its KV is
restored from the prefix store rather than computed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_UNSAFE = {ord(c): " " for c in "\n\r\t\x0b\x0c[]"}


@dataclass(frozen=True)
class Passage:
    """A piece of a document: ``number`` (1-based, in document order), ``page`` (1-based,
    None for a file without pages) and its ``text``."""

    number: int
    page: int | None
    text: str


@dataclass(frozen=True)
class AttachedText:
    """What a block is made of: the file ``name``, ``kind`` ("PDF", "DOCX", "Markdown", …),
    the ``pages`` (one string each; one string for a file without pages, ``paged`` False),
    and ``passages``: None to send the whole text, else the passages sent instead."""

    name: str
    kind: str
    pages: tuple[str, ...]
    paged: bool
    passages: tuple[Passage, ...] | None = None


def safe_name(name: str) -> str:
    """``name`` on one line without brackets, so it cannot end the header early."""
    return " ".join(name.translate(_UNSAFE).split()) or "attachment"


def header(doc: AttachedText) -> str:
    """The block's first line, e.g. ``[Attached file: report.pdf (PDF, 3 pages)]``."""
    pages = len(doc.pages)
    what = f"{doc.kind}, {pages} page{'s' if pages != 1 else ''}" if doc.paged else doc.kind
    if doc.passages is not None:
        n = len(doc.passages)
        what += f"; {n} passage{'s' if n != 1 else ''} found by search, not the whole text"
    return f"[Attached file: {safe_name(doc.name)} ({what})]"


def render_block(doc: AttachedText) -> str:
    """One attachment's block (the module docstring's form), without a trailing newline."""
    lines = [header(doc)]
    if doc.passages is not None:
        for p in doc.passages:
            where = f", page {p.page}" if p.page is not None else ""
            lines += [f"[Passage {p.number}{where}]", p.text.strip("\n")]
    elif doc.paged:
        for number, text in enumerate(doc.pages, 1):
            lines.append(f"[Page {number}]")
            if text:
                lines.append(text)
    else:
        lines.append(doc.pages[0] if doc.pages else "")
    lines.append(f"[End of {safe_name(doc.name)}]")
    return "\n".join(lines)


def render_message(question: str, docs: Sequence[AttachedText]) -> str:
    """The user message the model reads: each block, a blank line, then ``question``
    (the text the person typed, unchanged). With no ``docs``, ``question`` itself."""
    if not docs:
        return question
    return "\n\n".join([render_block(d) for d in docs] + [question])
