"""The question before every tool call: "Allow once / Always for this tool / Deny".

The dialog shows the tool, its MCP server (name and command or URL) and the arguments the
model wrote, all as plain text (model output is hostile text). It is window-modal but not
blocking: ``decided(Approval)`` answers it. Closing it (Esc, the title bar) answers
:attr:`Approval.STOP`, which stops the tool loop as Stop does.
"""

from __future__ import annotations

import json
from enum import StrEnum

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.window.shell.plain import isolate

__all__ = ["Approval", "ToolApprovalDialog", "pretty_arguments"]

MAX_SHOWN_ARGUMENTS = 64 * 1024
"""Characters of the arguments the dialog shows (the rest is cut, with a note)."""


class Approval(StrEnum):
    """The answer to one call's question."""

    ONCE = "once"
    ALWAYS = "always"  # this tool of this server, kept in settings.json until revoked or its command line changes
    DENY = "deny"
    STOP = "stop"  # the dialog was closed: the loop stops


def pretty_arguments(arguments: str) -> str:
    """The arguments' JSON text indented (as written when it is not JSON), cut to
    :data:`MAX_SHOWN_ARGUMENTS` characters."""
    try:
        text = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        text = arguments
    if len(text) > MAX_SHOWN_ARGUMENTS:
        text = text[:MAX_SHOWN_ARGUMENTS] + f"\n[cut: {len(text) - MAX_SHOWN_ARGUMENTS} more characters]"
    return text


class ToolApprovalDialog(QDialog):
    """Ask before ``tool`` of ``server`` (its name; ``where``: its command line or URL) runs
    with ``arguments`` (JSON text). Signal ``decided(Approval)``, once."""

    decided = Signal(object)

    def __init__(self, tool: str, server: str, where: str, arguments: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Allow this tool call?")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.answer: Approval | None = None
        layout = QVBoxLayout(self)
        self.question = QLabel(f"The model wants to call the tool “{isolate(tool)}” of the MCP server "
                               f"“{isolate(server)}”.")
        self.where = QLabel(f"Server: {isolate(where)}")
        self.arguments = QPlainTextEdit(pretty_arguments(arguments))
        self.arguments.setReadOnly(True)
        self.arguments.setAccessibleName("Arguments")
        for label in (self.question, self.where):
            label.setTextFormat(Qt.TextFormat.PlainText)
            label.setWordWrap(True)
            layout.addWidget(label)
        layout.addWidget(QLabel("Arguments:"))
        layout.addWidget(self.arguments)
        row = QHBoxLayout()
        self.buttons: dict[Approval, QPushButton] = {}
        for answer, text in ((Approval.ONCE, "Allow once"), (Approval.ALWAYS, "Always for this tool"),
                             (Approval.DENY, "Deny")):
            b = QPushButton(text)
            b.clicked.connect(lambda _c=False, a=answer: self._answer(a))
            row.addWidget(b)
            self.buttons[answer] = b
        self.buttons[Approval.DENY].setDefault(True)  # Enter does not run a tool
        layout.addLayout(row)
        self.resize(560, 360)

    def _answer(self, answer: Approval) -> None:
        if self.answer is None:
            self.answer = answer
            self.decided.emit(answer)
        self.done(QDialog.DialogCode.Accepted if answer in (Approval.ONCE, Approval.ALWAYS) else
                  QDialog.DialogCode.Rejected)

    def reject(self) -> None:  # noqa: D102 - Esc and the close button stop the loop
        if self.answer is None:
            self._answer(Approval.STOP)
            return
        super().reject()
