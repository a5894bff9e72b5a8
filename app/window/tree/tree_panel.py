"""The tree panel: the whole conversation tree, drawn top-down.

The top node is the conversation: its title on an accent pill, lower than a message's
node and kept in view when the tree is wider than the panel; every first message, an
edited one too, hangs under it, so all branches are visibly connected. Each other node is
a message: a role letter (U = user, A = assistant) and its first words on two lines,
drawn as plain text. The active path is drawn in the accent colour; a bar along a node's bottom
shows how much of its prompt (the path from the root to it) the prefix store holds:
full green = all of it, part green = part of it, none = none (from the engine's
``coverage`` request). Hovering a node shows who wrote it and the start of its text;
clicking it makes its branch the active one.

From the keyboard (the canvas takes focus with Tab or a click): Up goes to the parent,
Down to the child on the active branch (else the first), Left and Right to the previous
and next sibling, Home to the conversation node, End to the active leaf; Enter or Space
opens the branch of the focused node.

The canvas fills the scroll area's viewport and centres the tree in it, so scroll bars
appear only when the tree is larger than the panel; after every redraw the active leaf
is scrolled into view.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAccessible, QAccessibleEvent, QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QToolTip, QVBoxLayout, QWidget

from app.window.workers.chat_reader import ChatReader
from app.window.shell.plain import tooltip
from app.window.shell.theme import LIGHT, Colors
from app.window.tree.tree_layout import DX, DY, MARGIN, NODE_H, NODE_W, ROOT_ID, R, TreeLayout, TreeNode, layout_tree
from app.window.tree.tree_layout import read_layout as _read_layout
from storage.chats import Message

__all__ = ["DX", "DY", "MARGIN", "NODE_H", "NODE_W", "R", "ROOT_ID", "TreeCanvas", "TreePanel", "layout_tree"]

LABEL_CHARS = 60  # the start of a message kept for its node's label (elided to fit when drawn)
FIRST_LINE_CHARS = 500
"""The most of a message's first line a node's tooltip shows (characters)."""
END_OF_TURN_SLACK = 2
"""A node counts as fully cached when all but this many of its prompt tokens are stored: the
end-of-turn tokens that close a reply are only computed when the next turn is prefilled."""


def is_cached(stored: int, total: int) -> bool:
    """True when the prefix store holds (all but the end-of-turn tokens of) a node's prompt."""
    return total > 0 and stored >= total - END_OF_TURN_SLACK


ROOT_H, ROOT_MAX_W = 22, 180
"""The height and the widest (pixels) of the conversation's node, a pill lower than a message's node."""
ROOT_TEXT = {False: "#ffffff", True: "#0d1b2a"}
"""The title's colour on the accent pill (light, dark theme): over 4.5:1 on either accent."""
ROLE_LETTERS = {"user": "U", "assistant": "A", "system": "S"}
ROLE_WORDS = {"user": "You", "assistant": "Assistant", "system": "System"}


# Markdown syntax left out of a node's words (the text stays plain: nothing is rendered)
_MD_LINE = re.compile(r"^\s*(?:`{3,}|~{3,})[\w+#.-]*\s*$|^\s{0,3}(?:#{1,6}\s+|>\s?|[-*+]\s+|\d{1,9}[.)]\s+)",
                      re.MULTILINE)
_MD_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\n]*\)")
_MD_MARK = re.compile(r"(\*\*|__|`+)(\S(?:.*?\S)?)\1|(?<![\w*])\*(\S(?:[^*\n]*?\S)?)\*(?![\w*])")


def node_label(message: Message) -> str:
    """The words drawn on a message's node: the start of its text on one line, without
    Markdown's syntax (a code fence's marks, heading and list markers, emphasis, inline
    code ticks, a link's target), so a reply that opens with a code block reads as its code."""
    text = message.content[: LABEL_CHARS * 4]
    text = _MD_LINE.sub("", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_MARK.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(3), text)
    text = " ".join(text.split())[:LABEL_CHARS]
    return text or ("(stopped)" if message.status != "complete" else "(empty)")


def wrap_two(text: str, width: int, fm: QFontMetrics) -> list[str]:
    """``text`` in at most two lines of ``width`` pixels of ``fm``'s font, broken between
    words: the first line holds the words that fit (a single word too long for it is elided),
    the second the rest, elided on the right when it does not fit. [] for an empty text."""
    words = text.split(" ")
    first: list[str] = []
    while words and fm.horizontalAdvance(" ".join([*first, words[0]])) <= width:
        first.append(words.pop(0))
    if not first:
        return [fm.elidedText(text, Qt.TextElideMode.ElideRight, width)] if text else []
    rest = " ".join(words)
    return [" ".join(first), fm.elidedText(rest, Qt.TextElideMode.ElideRight, width)] if rest else [" ".join(first)]


def coverage_words(stored: int, total: int) -> str:
    """The prefix store's hold on a prompt in plain words: "Saved for instant replies: 180 of
    182 tokens of the prompt" (tokens)."""
    return f"Saved for instant replies: {stored:,} of {total:,} tokens of the prompt"


def node_tooltip(message: Message, coverage: tuple[int, int] | None = None) -> str:
    """The hover text of a node (plain text; the caller escapes it): who wrote it ("You",
    "Assistant", plus "stopped" etc. when not complete), the start of its text on one line in
    quotes, up to ``FIRST_LINE_CHARS`` characters (a whole first line, and what follows it,
    not a few words), and the prefix-store coverage ``(stored, total)``
    in tokens when known (``coverage_words``)."""
    who = "You" if message.role == "user" else ("Assistant" if message.role == "assistant" else "System")
    label = who
    if message.status != "complete":
        label += f" · {message.status}"
    text = " ".join(message.content[: FIRST_LINE_CHARS * 4].split())
    if len(text) > FIRST_LINE_CHARS:
        text = text[:FIRST_LINE_CHARS].rstrip() + "…"
    lines = [label, f"“{text}”" if text else "(empty)"]
    stored, total = coverage or (0, 0)
    if total:
        lines.append(coverage_words(stored, total))
    return "\n".join(lines)


def distinct_label(label: str, neighbours: list[str]) -> str:
    """``label`` with the words it shares at its start with the most similar of ``neighbours``
    (the labels of the siblings beside it) cut to "…", so two siblings that both start "Once
    upon a time there was a" read "… dragon. Write" and "… princess. What". Unchanged when no
    neighbour shares at least two leading words."""
    words = label.split(" ")
    shared = 0
    for other in neighbours:
        o = other.split(" ")
        n = 0
        while n < min(len(words), len(o)) - 1 and words[n] == o[n]:
            n += 1
        shared = max(shared, n)
    if shared < 2:
        return label
    return "… " + " ".join(words[shared:])


class TreeCanvas(QWidget):
    """Draws the nodes; ``node_clicked(message_id)`` on a click or Enter. Node positions
    (``TreeNode.x/y``, the node's centre) are in tree coordinates; ``offset_x`` centres the
    tree in a wider canvas. ``nodes`` holds the messages' nodes, ``root`` the conversation's
    (None for an empty tree); ``current`` is the node the keyboard is on.

    Signal ``current_moved(QPointF)``: the keyboard moved to the node centred there (canvas pixels)."""

    node_clicked = Signal(int)
    current_moved = Signal(QPointF)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName("Conversation tree")
        self.tree_layout = TreeLayout()
        self.coverage: dict[int, tuple[int, int]] = {}
        self.colors: Colors = LIGHT
        self.current: int | None = None  # the node the keyboard is on
        self._labels: dict[int, str] = {}

    # the layout's parts, as the canvas shows them
    nodes = property(lambda self: self.tree_layout.nodes, doc="The messages' nodes.")
    root = property(lambda self: self.tree_layout.root, doc="The conversation's node (None: empty).")
    title = property(lambda self: self.tree_layout.title)
    active = property(lambda self: self.tree_layout.active, doc="Ids of the active path.")
    leaf_id = property(lambda self: self.tree_layout.leaf_id, doc="The last message of the active path.")
    _by_id = property(lambda self: self.tree_layout.by_id)
    _children = property(lambda self: self.tree_layout.children)

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors, title: str = "") -> None:
        """Lay out and draw ``messages`` now, on this thread (small trees; see ``set_layout``)."""
        self.set_layout(TreeLayout.build(messages, title, active=active, layout=layout_tree), colors)

    def set_layout(self, layout: TreeLayout, colors: Colors) -> None:
        """Draw ``layout`` (built off the UI thread by ``tree_layout.read_layout``)."""
        self.colors = colors
        self.tree_layout = layout
        self._labels = {}
        if self.current not in layout.by_id:
            self.current = layout.leaf_id
        self._describe()
        self.setMinimumSize(QSize(layout.width, layout.height))
        self.updateGeometry()
        self.update()

    @property
    def offset_x(self) -> float:
        """Pixels added to every x so the tree sits in the middle of a wider canvas."""
        return max(0.0, (self.width() - self.tree_layout.width) / 2)

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        self.coverage = coverage
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(self.tree_layout.width, self.tree_layout.height)

    def node_at(self, x: float, y: float) -> TreeNode | None:
        """The message node under the canvas point (x, y) in pixels, or None."""
        x -= self.offset_x
        near = self.tree_layout.in_rect(x - NODE_W / 2 - 2, y - R - 2, x + NODE_W / 2 + 2, y + R + 2)
        return next((n for n in near if n is not self.root), None)

    def center_of(self, message_id: int) -> QPointF | None:
        """The centre of ``message_id``'s node in canvas pixels (None if not drawn;
        ``ROOT_ID``: the conversation node)."""
        n = self._by_id.get(message_id)
        return QPointF(n.x + self.offset_x, n.y) if n else None

    def tooltip_for(self, message_id: int) -> str:
        """The hover text of ``message_id``'s node ("" if it is not drawn)."""
        n = self._by_id.get(message_id)
        if n is None or n is self.root:
            return ""
        return node_tooltip(n.message, self.coverage.get(message_id))

    def node_font(self) -> QFont:
        """The font of the words on a node (a little smaller than the panel's)."""
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() * 0.85))
        return font

    def drawn_label(self, message_id: int, width: int, fm: QFontMetrics) -> str:
        """The words drawn on ``message_id``'s node in ``width`` pixels: its label when it fits,
        else the label that tells it from the siblings beside it (``distinct_label``), elided
        on the right. Looks at two neighbours only, whatever the number of siblings."""
        label = self.label_of(message_id)
        n = self._by_id.get(message_id)
        if n is None or n is self.root or fm.horizontalAdvance(label) <= width:
            return label
        sibs = self._children.get(n.message.parent_id, [])
        if len(sibs) > 1:
            i = next((k for k, s in enumerate(sibs) if s is n), -1)
            near = [sibs[k].message.id for k in (i - 1, i + 1) if i >= 0 and 0 <= k < len(sibs)]
            label = distinct_label(label, [self.label_of(m) for m in near])
        return fm.elidedText(label, Qt.TextElideMode.ElideRight, width)

    def drawn_lines(self, message_id: int, width: int, fm: QFontMetrics) -> list[str]:
        """The one or two lines drawn on ``message_id``'s node, each at most ``width`` pixels
        (``wrap_two``): its label when it fits in two lines, else the label that tells it from
        the siblings beside it (``distinct_label``), cut on the right."""
        label = self.label_of(message_id)
        lines = wrap_two(label, width, fm)
        n = self._by_id.get(message_id)
        if n is None or n is self.root or " ".join(lines) == label:
            return lines
        sibs = self._children.get(n.message.parent_id, [])
        if len(sibs) > 1:
            i = next((k for k, s in enumerate(sibs) if s is n), -1)
            near = [sibs[k].message.id for k in (i - 1, i + 1) if i >= 0 and 0 <= k < len(sibs)]
            lines = wrap_two(distinct_label(label, [self.label_of(m) for m in near]), width, fm)
        return lines

    def root_rect(self, fm: QFontMetrics | None = None) -> QRectF:
        """Where the conversation's node is drawn (canvas pixels; empty without a tree): a
        pill lower than a message's node, as wide as the title needs (at most ``ROOT_MAX_W``),
        and kept inside the part of the canvas in view, so a tree wider than
        the panel never cuts it at the panel's edge."""
        n = self.root
        if n is None:
            return QRectF()
        if fm is None:
            bold = QFont(self.node_font())
            bold.setBold(True)
            fm = QFontMetrics(bold)
        w = min(ROOT_MAX_W, fm.horizontalAdvance(self.title) + ROOT_H)
        seen = self.visibleRegion().boundingRect()
        x = n.x + self.offset_x
        if not seen.isEmpty() and seen.width() > 2 * ROOT_H:
            w = min(w, seen.width() - 8)
            x = min(max(x, seen.left() + w / 2 + 4), seen.right() + 1 - w / 2 - 4)
        return QRectF(x - w / 2, n.y + R - ROOT_H, w, ROOT_H)

    def label_of(self, message_id: int) -> str:
        """The words on ``message_id``'s node (before eliding), "" if not drawn."""
        n = self._by_id.get(message_id)
        if n is None:
            return ""
        if n is self.root:
            return self.title
        if message_id not in self._labels:
            self._labels[message_id] = node_label(n.message)
        return self._labels[message_id]

    # -- the keyboard ----------------------------------------------------------------------

    def move_to(self, message_id: int) -> None:
        """Put the keyboard focus ring on ``message_id`` (``ROOT_ID``: the conversation)."""
        if message_id not in self._by_id:
            return
        self.current = message_id
        self._describe()
        self.update()
        point = self.center_of(message_id)
        if point is not None:
            self.current_moved.emit(point)

    def _describe(self) -> None:
        """The accessible description: what the focused node is (read by screen readers)."""
        n = self._by_id.get(self.current) if self.current is not None else None
        if n is None:
            text = "Empty"
        elif n is self.root:
            text = f"Conversation: {self.title}"
        else:
            sibs = self._children.get(n.message.parent_id, [])
            where = f", version {sibs.index(n) + 1} of {len(sibs)}" if len(sibs) > 1 else ""
            active = ", on the shown branch" if n.message.id in self.active else ""
            text = f"{ROLE_WORDS.get(n.message.role, n.message.role)}{where}{active}: {self.label_of(n.message.id)}"
        if text != self.accessibleDescription():
            self.setAccessibleDescription(text)
            QAccessible.updateAccessibility(QAccessibleEvent(self, QAccessible.Event.DescriptionChanged))

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self._by_id.get(self.current) if self.current is not None else None
        key = event.key()
        if n is None:
            super().keyPressEvent(event)
            return
        target: int | None = None
        if key == Qt.Key.Key_Up and n is not self.root:
            target = n.message.parent_id if n.message.parent_id in self._by_id else ROOT_ID
        elif key == Qt.Key.Key_Down:
            kids = self._children.get(n.message.id, [])
            on_path = [k for k in kids if k.message.id in self.active]
            pick = on_path or kids
            target = pick[0].message.id if pick else None
        elif key in (Qt.Key.Key_Left, Qt.Key.Key_Right) and n is not self.root:
            sibs = self._children.get(n.message.parent_id, [])
            i = sibs.index(n) + (1 if key == Qt.Key.Key_Right else -1)
            target = sibs[i].message.id if 0 <= i < len(sibs) else None
        elif key == Qt.Key.Key_Home:
            target = ROOT_ID
        elif key == Qt.Key.Key_End:
            target = self.leaf_id
        elif key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            if n is not self.root:
                self.node_clicked.emit(n.message.id)
            return
        else:
            super().keyPressEvent(event)
            return
        if target is not None:
            self.move_to(target)

    def focusInEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().focusInEvent(event)
        if self.current is not None:
            self.move_to(self.current)  # scrolled into view, described
        self.update()

    def focusOutEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().focusOutEvent(event)
        self.update()

    # -- the mouse -------------------------------------------------------------------------

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        n = self.node_at(event.position().x(), event.position().y())
        if n is not None:
            self.current = n.message.id
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

    # -- painting --------------------------------------------------------------------------

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        c = self.colors
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        ox = self.offset_x
        font = self.node_font()
        bold = QFont(font)
        bold.setBold(True)
        fm, bfm = QFontMetrics(font), QFontMetrics(bold)
        root = self.root_rect(bfm).translated(-ox, 0)  # kept in view: it may sit off its place
        p.translate(ox, 0)
        area = QRectF(event.rect()).translated(-ox, 0).adjusted(-NODE_W, -DY, NODE_W, DY)
        shown = self.tree_layout.in_rect(area.left(), area.top(), area.right(), area.bottom())
        if self.root is not None and self.root not in shown and root.intersects(area):
            shown.append(self.root)
        for n in shown:  # the edge up to each shown node's parent
            parent = self._by_id.get(n.message.parent_id) if n is not self.root else None
            if parent is None:
                continue
            on_path = n.message.id in self.active and (parent is self.root or parent.message.id in self.active)
            p.setPen(QPen(QColor(c.accent if on_path else c.border), 3 if on_path else 1.5))
            top = QPointF(root.center().x(), root.bottom()) if parent is self.root else QPointF(parent.x, parent.y + R)
            p.drawLine(top, QPointF(n.x, n.y - R))
        for n in shown:
            if n is self.root:
                self._paint_root(p, root, bold, bfm)
            else:
                self._paint_node(p, n, font, bold, fm, bfm)
        p.end()

    def _paint_root(self, p: QPainter, rect: QRectF, bold: QFont, bfm: QFontMetrics) -> None:
        """The conversation's node: an accent pill with the title, unlike a message's node."""
        c = self.colors
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(c.accent))
        p.drawRoundedRect(rect, rect.height() / 2, rect.height() / 2)
        if self.current == ROOT_ID and self.hasFocus():
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.setPen(QPen(QColor(c.text), 1, Qt.PenStyle.DotLine))
            p.drawRoundedRect(rect.adjusted(-3, -3, 3, 3), rect.height() / 2 + 3, rect.height() / 2 + 3)
        p.setPen(QColor(ROOT_TEXT[c.dark]))
        p.setFont(bold)
        inner = rect.adjusted(ROOT_H / 2, 0, -ROOT_H / 2, 0)
        p.drawText(inner, Qt.AlignmentFlag.AlignCenter,
                   bfm.elidedText(self.title, Qt.TextElideMode.ElideRight, int(inner.width())))

    def _paint_node(self, p: QPainter, n: TreeNode, font: QFont, bold: QFont, fm: QFontMetrics,
                    bfm: QFontMetrics) -> None:
        c = self.colors
        mid = n.message.id
        rect = QRectF(n.x - NODE_W / 2, n.y - R, NODE_W, NODE_H)
        active = mid in self.active
        fill = c.user_bubble if n.message.role == "user" else c.assistant_bubble
        p.setPen(QPen(QColor(c.accent if active else c.muted), 2.5 if active else 1.2))
        p.setBrush(QColor(fill))
        p.drawRoundedRect(rect, 6, 6)
        stored, total = self.coverage.get(mid, (0, 0))
        if total and stored > 0:  # the share of the prompt the prefix store holds
            share = 1.0 if is_cached(stored, total) else stored / total
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(QColor(c.cached))
            p.drawRoundedRect(QRectF(rect.left() + 4, rect.bottom() - 5, (NODE_W - 8) * share, 3), 1.5, 1.5)
        if mid == self.current and self.hasFocus():
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.setPen(QPen(QColor(c.text), 1, Qt.PenStyle.DotLine))
            p.drawRoundedRect(rect.adjusted(-3, -3, 3, 3), 8, 8)
        p.setPen(QColor(c.text))
        inner = rect.adjusted(6, 3, -5, -6)  # above the coverage bar
        letter = ROLE_LETTERS.get(n.message.role, "?")
        lines = self.drawn_lines(mid, int(inner.width()) - bfm.horizontalAdvance(letter) - 5, fm)
        line_h = inner.height() / 2
        top = inner.top() if len(lines) > 1 else inner.top() + line_h / 2
        p.setFont(bold)
        p.drawText(QRectF(inner.left(), top, inner.width(), line_h),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, letter)
        lead = bfm.horizontalAdvance(letter) + 5
        p.setFont(font)
        p.setPen(QColor(c.muted if n.message.status != "complete" else c.text))
        for i, line in enumerate(lines):
            p.drawText(QRectF(inner.left() + lead, top + i * line_h, inner.width() - lead, line_h),
                       Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, line)


class TreePanel(QWidget):
    """The tree canvas in a scroll area with a legend. Signal: ``node_clicked(message_id)``."""

    node_clicked = Signal(int)

    def __init__(self, reader: ChatReader | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.canvas = TreeCanvas()
        self.canvas.node_clicked.connect(self._clicked)
        self.reader = reader  # lays out stored trees off the UI thread (``load``)
        self._wanted: int | None = None  # the conversation whose tree is drawn or being read
        self._deferred: tuple | None = None  # the arguments of a ``load`` not submitted yet (hidden)
        self.canvas.current_moved.connect(
            lambda point: self.scroll.ensureVisible(int(point.x()), int(point.y()), NODE_W, DY))
        scroll = QScrollArea()
        scroll.setWidget(self.canvas)
        scroll.setWidgetResizable(True)  # the canvas fills the viewport; bars only when it must grow
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.horizontalScrollBar().valueChanged.connect(lambda _v: self.canvas.update())  # the root stays in view
        self.scroll = scroll
        self.title = QLabel("<b>Conversation tree</b>")
        self.legend = QLabel()
        self.legend.setObjectName("tree_legend")
        self.legend.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 8, 6, 8)
        lay.addWidget(self.title)
        lay.addWidget(self.legend)
        lay.addWidget(scroll, 1)
        self.setMinimumWidth(180)
        self._reveal_timer = QTimer(self, singleShot=True, interval=0)
        self._reveal_timer.timeout.connect(self.reveal_active)
        self.set_tree([], set(), LIGHT)

    def set_tree(self, messages: list[Message], active: set[int], colors: Colors, title: str = "") -> None:
        """Draw ``messages`` (parents before children) under a node for the conversation
        titled ``title``, with ``active`` (message ids) as the active path, now (on this thread:
        for small trees, e.g. the empty one), then scroll its leaf into view once the layout
        has settled."""
        if self.reader is not None:
            self.reader.cancel("tree")
        self._wanted, self._deferred = None, None
        self._show(TreeLayout.build(messages, title, active=active, layout=layout_tree), colors)

    def load(self, conversation_id: int, leaf_id: int | None, colors: Colors,
             failed: Callable[[Exception], None] | None = None) -> None:
        """Read and lay out the tree of ``conversation_id`` on the reader's worker thread (the
        path up from ``leaf_id`` is the active one) and draw it when it arrives; ``failed(error)``
        if it cannot be. Until then the tree drawn before stays, its clicks ignored. While the
        panel is hidden, nothing is read until it is shown.

        Raises RuntimeError when the panel has no ``reader``."""
        if self.reader is None:
            raise RuntimeError("TreePanel.load needs a reader (a ChatReader)")
        self._wanted = conversation_id
        self._deferred = (conversation_id, leaf_id, colors, failed)
        if self.isVisible():
            self._submit()
        else:
            self.reader.cancel("tree")

    def _submit(self) -> None:
        if self._deferred is None or self.reader is None:
            return
        (cid, leaf_id, colors, failed), self._deferred = self._deferred, None
        job = lambda store: _read_layout(store, cid, leaf_id, layout_tree)  # noqa: E731
        self.reader.submit("tree", job, lambda layout: self._show(layout, colors), failed)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override: a tree asked for while hidden
        super().showEvent(event)
        self._submit()

    @property
    def loading(self) -> bool:
        """True while a tree is being read and laid out off the UI thread."""
        return self.reader is not None and self.reader.pending("tree")

    def _clicked(self, message_id: int) -> None:
        if self.canvas.tree_layout.conversation_id == self._wanted:  # not a node of the chat shown before
            self.node_clicked.emit(message_id)

    def _show(self, layout: TreeLayout, colors: Colors) -> None:
        self.legend.setText(
            f'<span style="color:{colors.cached};">━━━</span> cached: starts at once<br>'
            f'<span style="color:{colors.cached};">━</span> partly cached<br>'
            f'<span style="color:{colors.muted};">no bar</span> not stored<br>'
            f'<span style="color:{colors.accent};">━</span> active branch (shown)<br>'
            f'<span style="color:{colors.muted};">Hover a node to read it; click it (or arrows, '
            f'Enter) to show its branch.</span>')
        self.canvas.set_layout(layout, colors)
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
        self.scroll.ensureVisible(int(point.x()), int(point.y()), max(NODE_W // 2 + MARGIN, view.width() // 2),
                                  max(R + MARGIN, view.height() // 3))

    def set_coverage(self, coverage: dict[int, tuple[int, int]]) -> None:
        """Per node ``message_id -> (stored, total)`` prompt tokens in the prefix store."""
        self.canvas.set_coverage(coverage)
