"""The text of one message bubble: a word-wrapped rich-text label whose height for a width
is computed once per text and width.

``QLabel.heightForWidth`` lays the whole rich-text document out again at every call (at the
asked width, then back at its own), and the transcript's layout asks every bubble each time
any bubble changes size: a new bubble, a streamed reply growing by a line. With a 10,000-
character message on the path that was 10-40 ms per ask, several asks per change, so every
flush of a streaming reply and every send stalled the window (and took CPU from the engine).
The answer depends only on the text, the width, the font and the style, so it is kept until
one of them changes.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QLabel

CACHED_WIDTHS = 4
"""Widths remembered per text (a layout pass asks for one or two; a resize adds one)."""


class MessageBody(QLabel):
    """A ``QLabel`` (word wrap on) that remembers ``heightForWidth`` (pixels) per width until
    its text, font or style changes. ``hfw_computed`` counts the real computations (tests)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self._heights: dict[int, int] = {}
        self.hfw_computed = 0
        self.setWordWrap(True)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt name
        self._heights.clear()
        super().setText(text)

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        height = self._heights.get(width)
        if height is None:
            height = super().heightForWidth(width)
            self.hfw_computed += 1
            if len(self._heights) >= CACHED_WIDTHS:
                self._heights.pop(next(iter(self._heights)))
            self._heights[width] = height
        return height

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._heights.clear()
        super().changeEvent(event)
