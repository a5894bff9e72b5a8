"""The composer: a multi-line box where Enter sends, Shift+Enter adds a line, and Send
turns into Stop while a reply streams. Esc stops a reply from anywhere in the window (Chat →
Stop reply, ``shell/actions.py``), not only from here. Tab, Ctrl+Tab and their Shift forms
move the focus out of the box (no key types a tab; a pasted tab is kept)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QWidget


def leave_on_tab(box: QPlainTextEdit, event) -> bool:
    """Move the focus on from ``box`` for Tab / Ctrl+Tab (back for Shift+Tab, Ctrl+Shift+Tab);
    True when ``event`` (a key press) was such a key and the focus moved."""
    if event.key() == Qt.Key.Key_Backtab or (
            event.key() == Qt.Key.Key_Tab and event.modifiers() & Qt.KeyboardModifier.ShiftModifier):
        box.focusPreviousChild()
        return True
    if event.key() == Qt.Key.Key_Tab:
        box.focusNextChild()
        return True
    return False


class _Input(QPlainTextEdit):
    submit = Signal()

    def __init__(self):
        super().__init__()
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submit.emit()
            return
        if leave_on_tab(self, event):
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
        """Put ``text`` in the box (a message given back: not sent, or sent and refused),
        the cursor after it, so that typing goes on where it ended."""
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)

    def add_tool_button(self, button: QWidget) -> None:
        """Put ``button`` (e.g. the paperclip) beside the box, before Send."""
        lay = self.layout()
        lay.insertWidget(lay.indexOf(self.button), button, 0, Qt.AlignmentFlag.AlignBottom)

    def _submit(self) -> None:
        if self._streaming:
            return
        text = self.input.toPlainText().strip()
        if text:
            self.input.clear()
            self.send_requested.emit(text)

    def _clicked(self) -> None:
        if self._streaming:
            self.stop_requested.emit()
        else:
            self._submit()
