"""The box that edits a sent message in place (``MessageWidget.begin_edit``). Its keys are
the composer's: Enter saves and sends, Shift+Enter adds a line, Ctrl+Enter saves too, Esc
cancels, Tab moves on. ``EDIT_HINT`` says so under it."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QPlainTextEdit

from app.window.transcript.composer import leave_on_tab

EDIT_HINT = "Enter saves and sends · Shift+Enter adds a line · Esc cancels"
"""The line shown under the inline editor."""

_ENTER = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class InlineEditor(QPlainTextEdit):
    """Signals ``save_requested()`` (Enter, Ctrl+Enter) and ``cancel_requested()`` (Esc).

    Esc and Enter are claimed before the window's shortcuts see them (``ShortcutOverride``):
    here Esc cancels the edit, it does not stop a reply."""

    save_requested = Signal()
    cancel_requested = Signal()

    def __init__(self, text: str):
        super().__init__(text)
        self.setTabChangesFocus(True)

    def event(self, event) -> bool:  # noqa: D102 - Qt override
        if event.type() == QEvent.Type.ShortcutOverride and event.key() in (Qt.Key.Key_Escape, *_ENTER):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.key() == Qt.Key.Key_Escape:
            self.cancel_requested.emit()
            return
        if event.key() in _ENTER and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.save_requested.emit()
            return
        if leave_on_tab(self, event):
            return
        super().keyPressEvent(event)
