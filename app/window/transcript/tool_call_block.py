"""A tool step in the transcript: a collapsible block under the message.

On a ``role: "tool"`` message it shows the tool, its server, the arguments, the result
(bounded as it entered the prompt), the duration and the error; on an assistant message
that called tools, the calls. Everything is plain text. Collapsed, the header says
"Tool NAME · SERVER · 12 ms" (and "failed" on an error); a click opens it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QToolButton, QVBoxLayout, QWidget

from app.window.flows.tool_approval import pretty_arguments

__all__ = ["ToolCallBlock", "tool_header"]


def tool_header(tool: dict, role: str) -> str:
    """The collapsed block's one line for a message's ``tool`` fields."""
    if role != "tool":
        names = ", ".join(c.get("function", {}).get("name", "?") for c in tool.get("tool_calls") or [])
        return f"Calls: {names}"
    line = f"Tool {tool.get('name', '?')} · {tool.get('server', '?')}"
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
        self.details = QLabel(_details(message.tool, message.role, message.content))
        self.details.setTextFormat(Qt.TextFormat.PlainText)
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.hide()
        self.header.toggled.connect(self.set_open)
        layout.addWidget(self.header)
        layout.addWidget(self.details)

    def set_open(self, on: bool) -> None:
        """Show (True) or hide the arguments and result."""
        self.header.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.details.setVisible(on)
