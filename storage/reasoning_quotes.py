"""Reasoning kept beside a message's answer, and the quote form older imports wrote.

Before schema 4 the importers put a reply's reasoning into its text as a block quote under
a bold title (``storage.importers.parts.reasoning``)::

    > **Reasoning**
    >
    > First line of the thinking.
    >
    > Second paragraph.

    The answer.

:func:`split_reasoning_quotes` takes such quotes out of the text again: the importers now
store the reasoning in ``messages.reasoning`` (the writer calls it on every assistant
message), and migration 4 (``storage.chat_schema``) moves it there for messages imported
before. Only a paragraph that is entirely quoted and starts with a bold title line and a
bare ``>`` line counts; any other quote stays in the text.
"""

from __future__ import annotations

import re

_TITLE = re.compile(r"^> \*\*[^\n]*\*\*$")


def _is_quote_block(lines: list[str]) -> bool:
    return (len(lines) >= 3 and _TITLE.match(lines[0]) is not None and lines[1] == ">"
            and all(line == ">" or line.startswith("> ") for line in lines))


def _unquote(lines: list[str]) -> str:
    return "\n".join("" if line == ">" else line[2:] for line in lines[2:])


def split_reasoning_quotes(text: str) -> tuple[str | None, str]:
    """``(reasoning, answer)``: the reasoning quotes of ``text`` unquoted (joined by a blank
    line; None when there are none) and the rest of the text, its paragraphs joined as
    before. Text without such a quote comes back unchanged, as ``(None, text)``."""
    if "> **" not in text:
        return None, text
    paragraphs = text.split("\n\n")
    found: list[str] = []
    kept: list[str] = []
    for para in paragraphs:
        lines = para.split("\n")
        if _is_quote_block(lines):
            found.append(_unquote(lines))
        else:
            kept.append(para)
    if not found:
        return None, text
    return "\n\n".join(found), "\n\n".join(kept)
