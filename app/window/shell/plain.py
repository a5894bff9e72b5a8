"""Text from a user, a model or a model file, shown as plain text.

Qt guesses whether a string is HTML (``Qt::mightBeRichText``) wherever a widget's text
format is ``AutoText``, and tooltips have no other mode. A title such as
``<img src="/dev/zero">`` would then be loaded as an image on hover. So:

* labels that may show such text call :func:`plain_label` (``Qt.PlainText``);
* tooltips go through :func:`tooltip`, which escapes the text and wraps it in ``<qt>`` so
  Qt renders the escaped characters literally, and caps its length;
* menu and button texts go through :func:`menu_text` (``&`` is a mnemonic there);
* a name from outside (a file, a chat title, an MCP server or tool, a model) inside text
  the app composes goes through :func:`isolate`, so its direction controls (U+202E
  RIGHT-TO-LEFT OVERRIDE...) and right-to-left letters cannot reorder the app's own words.
"""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

TOOLTIP_CHARS = 600
"""The longest tooltip shown (characters); longer text ends in "…"."""


BIDI_CONTROLS = {chr(c): f"[U+{c:04X}]" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
"""The embedding, override and isolate controls (LRE RLE PDF LRO RLO, LRI RLI FSI PDI),
each as the visible text :func:`isolate` shows instead, e.g. "[U+202E]"."""

_BIDI_TABLE = str.maketrans(BIDI_CONTROLS)


def isolate(name: str) -> str:
    """``name`` (untrusted: a file name, a chat title, a tool or server name) ready to be put
    inside the app's own text: wrapped in FIRST STRONG ISOLATE (U+2068) ... POP DIRECTIONAL
    ISOLATE (U+2069), so its own direction stays inside it, with its embedding, override and
    isolate controls shown as "[U+202E]" (an unmatched PDI in it would end the isolate early).
    Marks (U+200E, U+200F, U+061C) stay: inside an isolate they affect only the name."""
    return "\u2068" + name.translate(_BIDI_TABLE) + "\u2069"


_MARK_RUN = re.compile("([\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]{%d})"
                       "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+" % 4)


def displayable(text: str) -> str:
    """``text`` (a message body: untrusted) as it may be drawn: its embedding, override and
    isolate controls shown as "[U+202E]" (an override spelled "evil.exe" as "exe.live"),
    and combining marks past the fourth on one letter left out (a letter with dozens of
    them drew over the lines above). Copying a message copies it as stored, not this."""
    return _MARK_RUN.sub(r"\1", text.translate(_BIDI_TABLE))


def plain_label(label: QLabel) -> QLabel:
    """Make ``label`` show its text literally (``Qt.PlainText``); returns it."""
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label


def elide(text: str, limit: int = TOOLTIP_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in "…" when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tooltip(text: str, limit: int = TOOLTIP_CHARS) -> str:
    """A tooltip string that Qt shows as the plain ``text`` (lines kept, at most ``limit``
    characters, escaped; nothing in it is interpreted or loaded). "" stays "" (no tooltip)."""
    if not text:
        return ""
    body = html.escape(elide(text, limit)).replace("\n", "<br>")
    return f"<qt>{body}</qt>"


def menu_text(text: str) -> str:
    """``text`` for a QAction or button label: ``&`` doubled so it is not a mnemonic."""
    return text.replace("&", "&&")
