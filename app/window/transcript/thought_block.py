"""A reasoning model's thinking above its answer: ``ThoughtBlock``.

While the reply streams, the thinking is shown as it comes, open, under a "Thinking…"
header. When the answer starts, the block folds to one line, "Thought for 12 s · 340
tokens"; a click on that line (or Space / Enter while it has the focus) opens it again.
A saved reply with reasoning shows the block folded, its figures from the reply's stats
(``reasoning_ms``, ``reasoning_tokens``, engine/reasoning.py).

The thinking is model text: it is shown as plain text, never as rich text. A folded block
holds no text in its label, so a long saved thinking costs nothing until it is opened.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.window.shell.theme import LIGHT, Colors

THINKING = "Thinking…"


def thought_summary(ms: float | None, tokens: int | None) -> str:
    """The folded block's line: "Thought for 12 s · 340 tokens" (``ms`` milliseconds,
    ``tokens`` tokens of thinking; a figure that is missing or 0 is left out; under 10 s
    with one decimal, "Thought for 0.4 s")."""
    parts = []
    if ms:
        s = ms / 1000
        parts.append(f"{s:.1f} s" if s < 10 else f"{s:.0f} s")
    head = f"Thought for {parts[0]}" if parts else "Thought"
    if tokens:
        return f"{head} · {tokens:,} token{'s' if tokens != 1 else ''}"
    return head


class ThoughtBlock(QFrame):
    """The thinking of one reply: a header button (the toggle) over a plain-text label.

    ``set_live(text)`` shows the thinking streamed so far (open); ``fold(summary)`` folds
    it; ``set_saved(reasoning, stats)`` shows a saved reply's thinking, folded.
    Attributes: ``header`` (QToolButton, checkable: checked is open), ``body`` (QLabel),
    ``folded`` (bool), ``reasoning`` (the text). Signal ``toggled(open)``."""

    toggled = Signal(bool)

    def __init__(self, colors: Colors = LIGHT, parent: QWidget | None = None,
                 clock=time.perf_counter):
        super().__init__(parent)
        self.setObjectName("thought_block")
        self.colors, self._clock = colors, clock
        self.reasoning = ""
        self.folded = False
        self.summary = THINKING
        self._started: float | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        self.header = QToolButton()
        self.header.setObjectName("thought_header")
        self.header.setCheckable(True)
        self.header.setAutoRaise(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # Tab reaches it; Space toggles
        self.header.setCursor(Qt.CursorShape.PointingHandCursor)
        self.header.setStyleSheet(f"QToolButton#thought_header {{ color:{colors.muted}; border:none; }}")
        self.header.toggled.connect(self._toggled)
        lay.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        self.body = QLabel()
        self.body.setObjectName("thought_body")
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)  # the bubble's menu
        self.body.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.body.setStyleSheet(f"color:{colors.muted}; border-left:2px solid {colors.border}; padding-left:8px;")
        lay.addWidget(self.body)
        self.setAccessibleName("Thinking")
        self.hide()
        self._show(open_=True)

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and self.header.hasFocus():
            self.header.toggle()
            return
        super().keyPressEvent(event)

    # -- content -------------------------------------------------------------------------

    def set_live(self, text: str) -> None:
        """The thinking streamed so far (it only grows); shown open until :meth:`fold`."""
        if text == self.reasoning:
            return
        if self._started is None:
            self._started = self._clock()
        self.reasoning = text
        self.setVisible(bool(text))
        if self.is_open:
            self.body.setText(text)

    def fold_live(self) -> None:
        """The answer started: fold, with the time since the first piece of thinking was
        shown (the engine's figures, with the token count, replace it once the reply is saved)."""
        if self.folded or not self.reasoning:
            return
        ms = (self._clock() - self._started) * 1000 if self._started is not None else None
        self.fold(thought_summary(ms, None))

    def fold(self, summary: str) -> None:
        """Fold the block to the line ``summary``."""
        self.summary, self.folded = summary, True
        self._show(open_=False)

    def set_saved(self, reasoning: str | None, stats: dict | None) -> None:
        """A saved reply's thinking (None or "": the block stays hidden), folded, with
        the figures of ``stats`` (a GenerationStats dict)."""
        self.reasoning = reasoning or ""
        self.setVisible(bool(self.reasoning))
        s = stats or {}
        self.fold(thought_summary(s.get("reasoning_ms"), s.get("reasoning_tokens")))

    def set_open(self, open_: bool) -> None:
        """Open (True) or fold the block, as a click on its header does."""
        self.header.setChecked(open_)

    @property
    def is_open(self) -> bool:
        return self.header.isChecked()

    def _toggled(self, open_: bool) -> None:
        self._show(open_)
        self.toggled.emit(open_)

    def _show(self, open_: bool) -> None:
        self.header.blockSignals(True)
        self.header.setChecked(open_)
        self.header.blockSignals(False)
        self.header.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        label = THINKING if not self.folded else self.summary
        self.header.setText(label)
        self.header.setToolTip("Hide the thinking" if open_ else "Show the thinking")
        self.header.setAccessibleName(f"{label}: {'hide' if open_ else 'show'} the thinking")
        self.body.setText(self.reasoning if open_ else "")  # a folded block lays out nothing
        self.body.setVisible(open_)
