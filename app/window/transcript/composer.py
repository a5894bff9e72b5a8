"""The composer: a multi-line box where Enter sends, Shift+Enter adds a line, and Send
turns into Stop while a reply streams (Esc stops too)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QWidget


class _Input(QPlainTextEdit):
    submit = Signal()
    escape = Signal()

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submit.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            self.escape.emit()
            return
        super().keyPressEvent(event)


PLACEHOLDER = "Message the model…  (Enter sends, Shift+Enter adds a line)"
SHORT_PLACEHOLDER = "Message the model…  (Enter sends)"
"""The placeholder when the long one would not fit on one line (a narrow window)."""


def fit_placeholder(box: QPlainTextEdit, long: str = PLACEHOLDER, short: str = SHORT_PLACEHOLDER) -> None:
    """Give ``box`` the ``long`` placeholder when it fits on one line of its viewport, else ``short``."""
    room = box.viewport().width() - 2 * box.document().documentMargin() - 4
    box.setPlaceholderText(long if box.fontMetrics().horizontalAdvance(long) <= room else short)


class Composer(QWidget):
    """Signals: ``send_requested(text)`` and ``stop_requested()``."""

    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.input = _Input()
        self.input.setObjectName("composer_input")
        self.input.setPlaceholderText(PLACEHOLDER)
        self.input.setFixedHeight(84)
        self.input.submit.connect(self._submit)
        self.input.escape.connect(self._escape)
        self.button = QPushButton("Send")
        self.button.setObjectName("send_button")
        self.button.setMinimumWidth(84)
        self.button.setMinimumHeight(40)
        self.button.clicked.connect(self._clicked)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(24, 6, 24, 12)
        lay.addWidget(self.input, 1)
        lay.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        self._streaming = False

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override: the placeholder on one line
        super().resizeEvent(event)
        fit_placeholder(self.input)

    @property
    def streaming(self) -> bool:
        return self._streaming

    def set_streaming(self, streaming: bool) -> None:
        """Show Stop (True) or Send (False)."""
        self._streaming = streaming
        self.button.setText("Stop" if streaming else "Send")
        self.button.setToolTip("Stop the reply (Esc)" if streaming else "Send (Enter)")

    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)

    def _submit(self) -> None:
        if self._streaming:
            return
        text = self.input.toPlainText().strip()
        if text:
            self.input.clear()
            self.send_requested.emit(text)

    def _escape(self) -> None:
        if self._streaming:
            self.stop_requested.emit()

    def _clicked(self) -> None:
        if self._streaming:
            self.stop_requested.emit()
        else:
            self._submit()
