"""Long messages shown collapsed: a 20,000-line paste is drawn as its first lines and a
"Show all 20,000 lines" button, never as one rich-text label (laying that out froze the
window for seconds). "Show all" opens the whole text in a read-only plain-text view, which
lays out only what is on screen; "Show less" folds it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

COLLAPSE_CHARS = 20_000
"""A message longer than this (characters) is shown collapsed..."""
COLLAPSE_LINES = 300
"""... as is one of more lines than this."""
PREVIEW_LINES = 20
PREVIEW_CHARS = 3_000
FULL_VIEW_HEIGHT = 480  # pixels: the expanded view scrolls inside the transcript


@dataclass(frozen=True)
class Collapsed:
    """The part of a long text shown (``preview``) and its whole length in lines."""

    preview: str
    lines: int


def collapsed(text: str) -> Collapsed | None:
    """None when ``text`` is short enough to show whole; else its first ``PREVIEW_LINES``
    lines (at most ``PREVIEW_CHARS`` characters) and its line count. Linear in ``text``,
    about a millisecond for 1 MB."""
    newlines = text.count("\n")
    if len(text) <= COLLAPSE_CHARS and newlines < COLLAPSE_LINES:
        return None
    end = 0
    for _ in range(PREVIEW_LINES):
        nxt = text.find("\n", end, PREVIEW_CHARS)
        if nxt < 0:
            end = min(len(text), PREVIEW_CHARS)
            break
        end = nxt + 1
    return Collapsed(text[:end].rstrip("\n"), newlines + 1)


class LongTextExpander(QWidget):
    """The "Show all N lines" button of a collapsed message and, once pressed, the whole
    text in a read-only plain-text view. Hidden for a message shown whole."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._text = ""
        self._cut: Collapsed | None = None
        self.button = QPushButton()
        self.button.setObjectName("show_all")
        self.button.setFlat(True)
        self.button.clicked.connect(self.toggle)
        self.full: QPlainTextEdit | None = None
        self._expanded = False
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.button)
        self.hide()

    @property
    def expanded(self) -> bool:
        return self._expanded

    def set_text(self, text: str, cut: Collapsed | None) -> None:
        """Offer the whole of ``text`` when ``cut`` (its collapsed form) is given."""
        self._text, self._cut, self._expanded = text, cut, False
        if self.full is not None:
            self.full.deleteLater()
            self.full = None
        self.setVisible(cut is not None)
        if cut is not None:
            self.button.setText(_show_all(cut.lines, len(text)))

    def toggle(self) -> None:
        """Show the whole text, or fold it again."""
        if self._cut is None:
            return
        if self.full is None:
            self.full = QPlainTextEdit()
            self.full.setObjectName("full_text")
            self.full.setReadOnly(True)
            self.full.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
            self.full.setFixedHeight(FULL_VIEW_HEIGHT)
            self.full.setPlainText(self._text)
            self.layout().insertWidget(0, self.full)
            self._expanded = True
        else:
            self._expanded = not self._expanded
            self.full.setVisible(self._expanded)
        self.button.setText("Show less" if self.expanded else _show_all(self._cut.lines, len(self._text)))


def _show_all(lines: int, chars: int) -> str:
    """The button's words: "Show all 20,000 lines (1,099,999 characters)", or for one long
    line "Show all 421,680 characters"."""
    if lines <= 1:
        return f"Show all {chars:,} characters"
    return f"Show all {lines:,} lines ({chars:,} characters)"
