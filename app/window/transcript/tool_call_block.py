"""A tool step in the transcript: a collapsible block under the message.

On a ``role: "tool"`` message it shows the tool, its server, the arguments, the result
(bounded as it entered the prompt), the duration and the error; on an assistant message
that called tools, the calls. Everything is plain text. Collapsed, the header says
"Tool NAME · SERVER · 12 ms" (and "failed" on an error); a click opens it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextEdit, QToolButton, QVBoxLayout, QWidget

from app.window.flows.tool_approval import pretty_arguments
from app.window.shell.plain import isolate

__all__ = ["ToolCallBlock", "WrappedText", "tool_header"]


def tool_header(tool: dict, role: str) -> str:
    """The collapsed block's one line for a message's ``tool`` fields."""
    if role != "tool":
        names = ", ".join(isolate(str(c.get("function", {}).get("name", "?"))) for c in tool.get("tool_calls") or [])
        return f"Calls: {names}"
    line = f"Tool {isolate(str(tool.get('name', '?')))} · {isolate(str(tool.get('server', '?')))}"
    if tool.get("duration_ms") is not None:
        line += f" · {float(tool['duration_ms']):.0f} ms"
    if tool.get("error"):
        line += " · failed"
    return line


def _details(tool: dict, role: str, content: str) -> str:
    if role != "tool":
        return "\n\n".join(f"{c.get('function', {}).get('name', '?')}\n"
                           f"{pretty_arguments(c.get('function', {}).get('arguments', ''))}"
                           for c in tool.get("tool_calls") or [])
    parts = [f"Arguments:\n{pretty_arguments(tool.get('arguments', ''))}"]
    if tool.get("error"):
        parts.append(f"Error: {tool['error']}")
    parts.append(f"Result (as the model got it, at most 32 KB):\n{content}")
    return "\n\n".join(parts)


class WrappedText(QTextEdit):
    """Read-only plain text that wraps at word boundaries, or anywhere in a word wider than
    the line (a long URL, base64, minified JSON in a tool result), and is as tall as its
    text: it never widens the transcript past the view, and has no scroll bars of its own."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAcceptRichText(False)
        self.setReadOnly(True)
        self.setPlainText(text)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setLineWrapMode(QTextEdit.LineWrapMode.WidgetWidth)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextEdit { background: transparent; }")

    def text(self) -> str:
        """The text shown (as given)."""
        return self.toPlainText()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_height()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self._fit_height()

    def _fit_height(self) -> None:
        """Height (pixels) = the text laid out at the viewport's width, plus the frame."""
        doc = self.document()
        doc.setTextWidth(self.viewport().width())
        height = int(doc.size().height()) + 2 * self.frameWidth() + 2
        if height != self.height():
            self.setFixedHeight(height)


class ToolCallBlock(QFrame):
    """The block for ``message`` (a ``storage.chats.Message`` with ``tool`` fields)."""

    def __init__(self, message, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("tool_call_block")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.header = QToolButton()
        self.header.setCheckable(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setArrowType(Qt.ArrowType.RightArrow)
        self.header.setText(tool_header(message.tool, message.role))
        self.header.setAccessibleName("Tool call details")
        self.details = WrappedText(_details(message.tool, message.role, message.content))
        self.details.setAccessibleName("Tool call arguments and result")
        self.details.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # selectable, as a label was; not a Tab stop
        self.details.hide()
        self.header.toggled.connect(self.set_open)
        layout.addWidget(self.header)
        layout.addWidget(self.details)

    def set_open(self, on: bool) -> None:
        """Show (True) or hide the arguments and result."""
        self.header.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.details.setVisible(on)
