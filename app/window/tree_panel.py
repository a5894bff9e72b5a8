"""The tree panel: the whole conversation tree, drawn top-down.

Each node is a message (U = user, A = assistant). The active path is drawn in
the accent colour; a node's fill shows how much of its prompt (the path from
the root to it) the prefix store holds: full green = all of it, a green arc = part
of it, empty = none (from the engine's ``coverage`` request). Hovering a node shows
who wrote it and the start of its text; clicking it makes its branch the active one.

The canvas fills the scroll area's viewport and centres the tree in it, so scroll bars
appear only when the tree is larger than the panel; after every redraw the active leaf
is scrolled into view.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QToolTip, QVBoxLayout, QWidget

from app.window.plain import tooltip
from app.window.theme import LIGHT, Colors
from storage.chats import Message

DX, DY, R, MARGIN = 36, 46, 11, 16
TOOLTIP_CHARS = 80
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
    consecutive columns in depth-first order, a parent sits above the middle of its children.

    Iterative (an explicit stack), so a branch of any length lays out: no recursion limit.
    A message whose parent is not in ``messages`` is laid out as a root."""
    ids = {m.id for m in messages}
    children: dict[int | None, list[Message]] = {}
    for m in messages:
        children.setdefault(m.parent_id if m.parent_id in ids else None, []).append(m)
    pos: dict[int, tuple[float, float]] = {}
    next_col = 0
    for root in children.get(None, []):
        # (message, depth, children done?): a node is placed after all of its children
        stack: list[tuple[Message, int, bool]] = [(root, 0, False)]
        while stack:
            m, depth, done = stack.pop()
            kids = children.get(m.id, [])
            if not kids:
                pos[m.id] = (float(next_col), float(depth))
                next_col += 1
            elif done:
                pos[m.id] = ((pos[kids[0].id][0] + pos[kids[-1].id][0]) / 2, float(depth))
            elif m.id not in pos:  # a cycle in corrupt data is cut, not followed forever
                pos[m.id] = (0.0, float(depth))  # placeholder, replaced when its children are done
                stack.append((m, depth, True))
                stack.extend((k, depth + 1, False) for k in reversed(kids) if k.id not in pos)
    return pos


def node_tooltip(message: Message, coverage: tuple[int, int] | None = None) -> str:
    """The hover text of a node: a short label ("You · turn 2" / "Assistant · turn 2", plus
    "stopped" etc. when not complete), the first ``TOOLTIP_CHARS`` characters of the text on
    one line, and the prefix-store coverage ``(stored, total)`` in tokens when known."""
    who = "You" if message.role == "user" else ("Assistant" if message.role == "assistant" else "System")
    label = who
    if message.status != "complete":
        label += f" · {message.status}"
    text = " ".join(message.content.split())
    text = text[:TOOLTIP_CHARS].rstrip() + ("…" if len(text) > TOOLTIP_CHARS else "")
    lines = [label, f"“{text}”" if text else "(empty)"]
    stored, total = coverage or (0, 0)
    if total:
        lines.append(f"KV stored: {stored:,} of {total:,} prompt tokens")
    return "\n".join(lines)


class TreeCanvas(QWidget):
    """Draws the nodes; ``node_clicked(message_id)`` on a click. Node positions (``_Node.x/y``)
    are in tree coordinates; ``offset_x`` centres the tree in a wider canvas."""

    node_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.nodes: list[_Node] = []
        self.active: set[int] = set()
        self.coverage: dict[int, tuple[int, int]] = {}
        self.colors: Colors = LIGHT
        self._size = QSize(2 * (R + MARGIN), 2 * (R + MARGIN))
        self.leaf_id: int | None = None  # the deepest node of the active path

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors) -> None:
        self.colors = colors
        self.active = active
        pos = layout_tree(messages)
        self.nodes = [_Node(m, MARGIN + pos[m.id][0] * DX + R, MARGIN + pos[m.id][1] * DY + R)
                      for m in messages if m.id in pos]
        w = max((n.x for n in self.nodes), default=0) + R + MARGIN
        h = max((n.y for n in self.nodes), default=0) + R + MARGIN
        self._size = QSize(int(w), int(h))
        on_path = [n for n in self.nodes if n.message.id in active]
        self.leaf_id = max(on_path, key=lambda n: n.y).message.id if on_path else None
        self.setMinimumSize(self._size)
        self.updateGeometry()
        self.update()

    @property
    def offset_x(self) -> float:
        """Pixels added to every x so the tree sits in the middle of a wider canvas."""
        return max(0.0, (self.width() - self._size.width()) / 2)

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        self.coverage = coverage
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return self._size

    def node_at(self, x: float, y: float) -> _Node | None:
        """The node under the canvas point (x, y) in pixels, or None."""
        x -= self.offset_x
        for n in self.nodes:
            if (n.x - x) ** 2 + (n.y - y) ** 2 <= (R + 3) ** 2:
                return n
        return None

    def center_of(self, message_id: int) -> QPointF | None:
        """The centre of ``message_id``'s node in canvas pixels (None if not drawn)."""
        n = next((n for n in self.nodes if n.message.id == message_id), None)
        return QPointF(n.x + self.offset_x, n.y) if n else None

    def tooltip_for(self, message_id: int) -> str:
        """The hover text of ``message_id``'s node ("" if it is not drawn)."""
        n = next((n for n in self.nodes if n.message.id == message_id), None)
        return node_tooltip(n.message, self.coverage.get(message_id)) if n else ""

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self.node_at(event.position().x(), event.position().y())
        if n is not None:
            self.node_clicked.emit(n.message.id)

    def mouseMoveEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self.node_at(event.position().x(), event.position().y())
        self.setCursor(Qt.CursorShape.PointingHandCursor if n else Qt.CursorShape.ArrowCursor)

    def event(self, event) -> bool:  # noqa: D102 - Qt override: the node's tooltip
        if event.type() == QEvent.Type.ToolTip:
            n = self.node_at(event.pos().x(), event.pos().y())
            if n is None:
                QToolTip.hideText()
                event.ignore()
            else:
                QToolTip.showText(event.globalPos(), tooltip(self.tooltip_for(n.message.id)), self)
            return True
        return super().event(event)

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        c = self.colors
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.translate(self.offset_x, 0)
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
        scroll.setWidgetResizable(True)  # the canvas fills the viewport; bars only when it must grow
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.scroll = scroll
        self.title = QLabel("<b>Conversation tree</b>")
        self.legend = QLabel()
        self.legend.setObjectName("tree_legend")
        self.legend.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.title)
        lay.addWidget(self.legend)
        lay.addWidget(scroll, 1)
        self.setMinimumWidth(220)
        self._reveal_timer = QTimer(self, singleShot=True, interval=0)
        self._reveal_timer.timeout.connect(self.reveal_active)
        self.set_tree([], set(), LIGHT)

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors) -> None:
        """Draw ``messages`` (parents before children) with ``active`` (message ids) as the
        active path, then scroll its leaf into view once the layout has settled."""
        self.legend.setText(
            f'<span style="color:{colors.cached};">●</span> KV stored&nbsp;&nbsp; '
            f'<span style="color:{colors.cached};">◐</span> partly&nbsp;&nbsp; '
            f'<span style="color:{colors.muted};">○</span> not stored<br>'
            f'<span style="color:{colors.accent};">━</span> active branch<br>'
            f'<span style="color:{colors.muted};">Hover a node to read it; click to show its branch.</span>')
        self.canvas.set_tree(messages, active, colors)
        self._reveal_timer.start()

    def reveal_active(self) -> None:
        """Scroll so that the active leaf (and the tree's top) is visible."""
        self._reveal_timer.stop()
        leaf = self.canvas.leaf_id
        point = self.canvas.center_of(leaf) if leaf is not None else None
        if point is None:
            self.scroll.horizontalScrollBar().setValue(0)
            self.scroll.verticalScrollBar().setValue(0)
            return
        # a margin of half the viewport centres the leaf when the tree is larger than the panel
        view = self.scroll.viewport().size()
        self.scroll.ensureVisible(int(point.x()), int(point.y()), max(R + MARGIN, view.width() // 2),
                                  max(R + MARGIN, view.height() // 3))

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        """Per node ``message_id -> (stored, total)`` prompt tokens in the prefix store."""
        self.canvas.set_coverage(coverage)
