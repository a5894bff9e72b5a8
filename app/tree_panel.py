"""The tree panel: the whole conversation tree, drawn top-down.

Each node is a message (U = user, A = assistant). The active path is drawn in
the accent colour; a node's fill shows how much of its prompt (the path from
the root to it) the prefix store holds: full green = all of it, a green arc = part
of it, empty = none (from the engine's ``coverage`` request). Clicking a node
makes its branch the active one.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import QLabel, QScrollArea, QToolTip, QVBoxLayout, QWidget

from app.theme import LIGHT, Colors
from storage.chats import Message

DX, DY, R, MARGIN = 36, 46, 11, 24
END_OF_TURN_SLACK = 2
"""A node counts as fully cached when all but this many of its prompt tokens are stored: the
end-of-turn tokens that close a reply are only computed when the next turn is prefilled."""


def is_cached(stored: int, total: int) -> bool:
    """True when the prefix store holds (all but the end-of-turn tokens of) a node's prompt."""
    return total > 0 and stored >= total - END_OF_TURN_SLACK


@dataclass
class _Node:
    message: Message
    x: float
    y: float


def layout_tree(messages: list[Message]) -> dict[int, tuple[float, float]]:
    """Grid positions (column, depth) for ``messages`` (parents before children): leaves take
    consecutive columns in depth-first order, a parent sits above the middle of its children."""
    children: dict[int | None, list[Message]] = {}
    for m in messages:
        children.setdefault(m.parent_id, []).append(m)
    pos: dict[int, tuple[float, float]] = {}
    next_col = [0]

    def place(m: Message, depth: int) -> float:
        kids = children.get(m.id, [])
        if not kids:
            x = float(next_col[0])
            next_col[0] += 1
        else:
            xs = [place(k, depth + 1) for k in kids]
            x = (xs[0] + xs[-1]) / 2
        pos[m.id] = (x, float(depth))
        return x

    for root in children.get(None, []):
        place(root, 0)
    return pos


class TreeCanvas(QWidget):
    node_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.nodes: list[_Node] = []
        self.active: set[int] = set()
        self.coverage: dict[int, tuple[int, int]] = {}
        self.colors: Colors = LIGHT
        self._size = QSize(200, 200)

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors) -> None:
        self.colors = colors
        self.active = active
        pos = layout_tree(messages)
        self.nodes = [_Node(m, MARGIN + pos[m.id][0] * DX + R, MARGIN + pos[m.id][1] * DY + R)
                      for m in messages if m.id in pos]
        w = max((n.x for n in self.nodes), default=0) + R + MARGIN
        h = max((n.y for n in self.nodes), default=0) + R + MARGIN
        self._size = QSize(int(w), int(h))
        self.setMinimumSize(self._size)
        self.updateGeometry()
        self.update()

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        self.coverage = coverage
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return self._size

    def node_at(self, x: float, y: float) -> _Node | None:
        for n in self.nodes:
            if (n.x - x) ** 2 + (n.y - y) ** 2 <= (R + 3) ** 2:
                return n
        return None

    def center_of(self, message_id: int) -> QPointF | None:
        n = next((n for n in self.nodes if n.message.id == message_id), None)
        return QPointF(n.x, n.y) if n else None

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self.node_at(event.position().x(), event.position().y())
        if n is not None:
            self.node_clicked.emit(n.message.id)

    def mouseMoveEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self.node_at(event.position().x(), event.position().y())
        if n is None:
            QToolTip.hideText()
            return
        text = n.message.content.strip().replace("\n", " ")
        text = text[:140] + ("…" if len(text) > 140 else "")
        stored, total = self.coverage.get(n.message.id, (0, 0))
        cache = f"\nPrefix store: {stored}/{total} tokens" if total else ""
        QToolTip.showText(event.globalPosition().toPoint(),
                          f"{'You' if n.message.role == 'user' else 'Assistant'}: {text}{cache}", self)

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        c = self.colors
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        by_id = {n.message.id: n for n in self.nodes}
        for n in self.nodes:
            parent = by_id.get(n.message.parent_id)
            if parent is None:
                continue
            on_path = n.message.id in self.active and parent.message.id in self.active
            p.setPen(QPen(QColor(c.accent if on_path else c.border), 3 if on_path else 1.5))
            p.drawLine(QPointF(parent.x, parent.y + R), QPointF(n.x, n.y - R))
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() * 0.8))
        font.setBold(True)
        p.setFont(font)
        for n in self.nodes:
            rect = QRectF(n.x - R, n.y - R, 2 * R, 2 * R)
            stored, total = self.coverage.get(n.message.id, (0, 0))
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QColor(c.base))
            p.drawEllipse(rect)
            full = is_cached(stored, total)
            if full:
                p.setBrush(QColor(c.cached))
                p.drawEllipse(rect)
            elif total and stored > 0:
                p.setBrush(QColor(c.cached))
                p.drawPie(rect, 90 * 16, -int(360 * 16 * stored / total))
            active = n.message.id in self.active
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.setPen(QPen(QColor(c.accent if active else c.muted), 3 if active else 1.5))
            p.drawEllipse(rect)
            p.setPen(QColor("#ffffff" if full else c.text))
            p.drawText(rect, Qt.AlignmentFlag.AlignCenter, "U" if n.message.role == "user" else "A")
        p.end()


class TreePanel(QWidget):
    """The tree canvas in a scroll area with a legend. Signal: ``node_clicked(message_id)``."""

    node_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.canvas = TreeCanvas()
        self.canvas.node_clicked.connect(self.node_clicked)
        scroll = QScrollArea()
        scroll.setWidget(self.canvas)
        scroll.setWidgetResizable(False)
        scroll.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self.title = QLabel("<b>Conversation tree</b>")
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.title)
        lay.addWidget(self.legend)
        lay.addWidget(scroll, 1)
        self.setMinimumWidth(220)
        self.set_tree([], set(), LIGHT)

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors) -> None:
        self.legend.setText(
            f'<span style="color:{colors.cached};">●</span> KV in the prefix store<br>'
            f'<span style="color:{colors.muted};">○</span> not cached (arc: partly)<br>'
            f'<span style="color:{colors.accent};">━</span> active path<br>'
            f'<span style="color:{colors.muted};">Click a node to show its branch.</span>')
        self.canvas.set_tree(messages, active, colors)

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        self.canvas.set_coverage(coverage)
