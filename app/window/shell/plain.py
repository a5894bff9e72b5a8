"""Text from a user, a model or a model file, shown as plain text.

Qt guesses whether a string is HTML (``Qt::mightBeRichText``) wherever a widget's text
format is ``AutoText``, and tooltips have no other mode. A title such as
``<img src="/dev/zero">`` would then be loaded as an image on hover. So:

* labels that may show such text call :func:`plain_label` (``Qt.PlainText``);
* tooltips go through :func:`tooltip`, which escapes the text and wraps it in ``<qt>`` so
  Qt renders the escaped characters literally, and caps its length;
* menu and button texts go through :func:`menu_text` (``&`` is a mnemonic there).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

TOOLTIP_CHARS = 600
"""The longest tooltip shown (characters); longer text ends in "…"."""


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
