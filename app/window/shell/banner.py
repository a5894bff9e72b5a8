"""A message bar at the top of the transcript: plain-words errors and notices, with
optional action buttons (for example "Restart engine"), instead of modal dialogs."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from app.window.shell.theme import LIGHT, Colors

log = logging.getLogger(__name__)

STYLES = {
    "error": ("#fdecea", "#8a1f11", "#4a1d1a", "#ffb4a9"),
    "info": ("#e8f1fd", "#0b3d7a", "#1c2f4a", "#b8d4ff"),
}


class Banner(QFrame):
    """Call ``show_message(text, kind, actions, chat_id)``; ``shown(text)`` fires for each
    message. ``chat_id`` ties a message to the chat it is about (None: about the app or the
    model); the window hides a tied message when another chat is shown."""

    shown = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setObjectName("banner_text")
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # messages quote titles, model errors
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._lay = QHBoxLayout(self)
        self._lay.setContentsMargins(12, 8, 8, 8)
        self._lay.addWidget(self.label, 1)
        self._buttons: list[QPushButton] = []
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss this message")
        close.setAccessibleName("Dismiss this message")
        close.clicked.connect(self.hide)
        self._close = close
        self._lay.addWidget(close)
        self.colors: Colors = LIGHT
        self.kind = "info"
        self.chat_id: int | None = None
        self.topic = ""
        self.hide()

    @property
    def text(self) -> str:
        return self.label.text()

    def button(self, label: str) -> QPushButton | None:
        return next((b for b in self._buttons if b.text() == label), None)

    def show_message(self, text: str, kind: str = "error",
                     actions: list[tuple[str, Callable[[], None]]] | None = None,
                     chat_id: int | None = None, topic: str = "") -> None:
        """Show ``text`` (plain text, never HTML) as a ``kind`` ("error" or "info") message
        with ``actions`` (button label, callback; a click also hides the banner). ``topic``
        names what it is about ("model": the window hides it once a model loads, or the next
        reply starts after a fall-back load), "" for anything else."""
        for b in self._buttons:  # deleteLater: ``b`` may be the button being clicked
            self._lay.removeWidget(b)
            b.hide()
            b.deleteLater()
        self._buttons = []
        self.kind = kind
        self.chat_id = chat_id
        self.topic = topic
        self.label.setText(text)
        for label, callback in actions or []:
            b = QPushButton(label)
            b.clicked.connect(lambda _c=False, cb=callback: (self.hide(), cb()))
            self._lay.insertWidget(self._lay.count() - 1, b)
            self._buttons.append(b)
        self.restyle(self.colors)
        self.show()
        self.shown.emit(text)

    def storage_failed(self, exc: Exception) -> None:
        """Say that ``exc`` (a StorageError) kept something from being saved; it is logged too."""
        log.error("storage error: %s", exc)
        self.show_message(f"Branchwise could not save to its database: {exc}", "error")

    def restyle(self, colors: Colors) -> None:
        self.colors = colors
        bg, fg, dbg, dfg = STYLES.get(self.kind, STYLES["info"])
        if colors.dark:
            bg, fg = dbg, dfg
        self.setStyleSheet(f"QFrame#banner {{ background:{bg}; border-radius:6px; }}"
                           f" QLabel#banner_text {{ color:{fg}; }}")
