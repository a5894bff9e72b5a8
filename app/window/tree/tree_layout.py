"""The tree panel's layout, computed off the UI thread: ``TreeLayout.build``.

A conversation of 10,000 messages takes a quarter of a second to read and lay out, so the
tree panel asks a ``ChatReader`` worker for a ``TreeLayout`` (``read_layout``) and swaps it
in when it arrives. A layout also indexes its nodes by row, so that painting and hit-testing
look only at the nodes in view, never at all of them.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field

from storage.chats import ChatStore, Message

NODE_W, NODE_H = 112, 38
"""A node's size (pixels): the role letter and two lines of words, four to six of them, and
narrow enough that three leaves side by side fit in a quarter of a 1600-pixel window."""
DX, DY, MARGIN = NODE_W + 8, 52, 10
R = NODE_H // 2  # half a node's height: edges join a node's top and bottom edges
ROOT_ID = 0
"""The id of the conversation node (message ids start at 1)."""
OUTLINE_CHARS = 2_000
"""How much of each message's text a layout holds (characters): what a node's tooltip reads
(``tree_panel.FIRST_LINE_CHARS`` × 4) and more than its label does."""


def layout_tree(messages: list[Message]) -> dict[int, tuple[float, float]]:
    """Grid positions (column, depth) for ``messages`` (parents before children): leaves take
    consecutive columns in depth-first order, a parent sits above the middle of its children.

    Iterative (an explicit stack), so a branch of any length lays out: no recursion limit.
    A message whose parent is not in ``messages`` is laid out as a root."""
    ids = {m.id for m in messages}
    children: dict[int | None, list[int]] = {}
    for m in messages:
        children.setdefault(m.parent_id if m.parent_id in ids else None, []).append(m.id)
    # ids only (no Message objects), and a node's depth kept beside it: a 10,000-message branch
    # lays out in a few milliseconds, so the worker holds the GIL the UI thread needs less
    pos: dict[int, tuple[float, float]] = {}
    next_col = 0
    no_kids: list[int] = []
    for root in children.get(None, []):
        # (id, depth); ~id (a negative number) marks a node whose children are all placed
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            mid, depth = stack.pop()
            if mid < 0:
                kids = children[~mid]
                pos[~mid] = ((pos[kids[0]][0] + pos[kids[-1]][0]) / 2, float(depth))
                continue
            kids = children.get(mid, no_kids)
            if not kids:
                pos[mid] = (float(next_col), float(depth))
                next_col += 1
            elif mid not in pos:  # a cycle in corrupt data is cut, not followed forever
                pos[mid] = (0.0, float(depth))  # placeholder, replaced when its children are done
                stack.append((~mid, depth))
                if len(kids) == 1:
                    if kids[0] not in pos:
                        stack.append((kids[0], depth + 1))
                else:
                    stack.extend((k, depth + 1) for k in reversed(kids) if k not in pos)
    return pos


@dataclass
class TreeNode:
    """A drawn node: its message and its centre (pixels, tree coordinates)."""

    message: Message
    x: float
    y: float


@dataclass
class TreeLayout:
    """Every node of one conversation's tree, placed. ``root`` is the conversation's node
    (None for an empty tree), ``nodes`` the messages' nodes, ``by_id`` both by message id
    (``ROOT_ID`` for the root), ``children`` each node's children in order, ``active`` the
    ids of the active path and ``leaf_id`` its last message; ``width``/``height`` in pixels."""

    title: str = "Conversation"
    root: TreeNode | None = None
    nodes: list[TreeNode] = field(default_factory=list)
    by_id: dict[int, TreeNode] = field(default_factory=dict)
    children: dict[int | None, list[TreeNode]] = field(default_factory=dict)
    active: set[int] = field(default_factory=set)
    leaf_id: int | None = None
    width: int = 2 * MARGIN + NODE_W
    height: int = 2 * MARGIN + NODE_H
    conversation_id: int | None = None
    _rows: list[list[TreeNode]] = field(default_factory=list)  # by depth, each sorted by x
    _row_xs: list[list[float]] = field(default_factory=list)

    @classmethod
    def build(cls, messages: list[Message], title: str = "", active: set[int] | None = None,
              leaf_id: int | None = None, layout=layout_tree) -> TreeLayout:
        """Place ``messages`` (parents before children) under a node for the conversation
        titled ``title``. The active path is ``active`` (message ids) when given, else the
        path from ``leaf_id`` up to its root. Work in proportion to the tree: call it off
        the UI thread (``read_layout``) for a stored conversation."""
        title = " ".join(title.split()) or "Conversation"
        if not messages:
            return cls(title=title)
        ids = {m.id for m in messages}
        top = Message(ROOT_ID, 0, None, "conversation", title, None, None, "complete", None, 0.0)
        hung = [m if m.parent_id in ids else dataclasses.replace(m, parent_id=ROOT_ID) for m in messages]
        pos = layout([top, *hung])
        placed = [TreeNode(m, MARGIN + pos[m.id][0] * DX + NODE_W / 2, MARGIN + pos[m.id][1] * DY + R)
                  for m in [top, *hung] if m.id in pos]
        by_id = {n.message.id: n for n in placed}
        if active is None:
            active = _path_up(by_id, leaf_id)
        children: dict[int | None, list[TreeNode]] = {}
        rows: list[list[TreeNode]] = []
        right = bottom = 0.0
        leaf: TreeNode | None = None
        for n in placed:  # one pass: children, rows by depth, the extent, the active leaf
            if n.message.id != ROOT_ID:
                children.setdefault(n.message.parent_id, []).append(n)
                if n.message.id in active and (leaf is None or n.y > leaf.y):
                    leaf = n
            row = int(n.y - MARGIN - R) // DY
            while len(rows) <= row:
                rows.append([])
            rows[row].append(n)
            right, bottom = max(right, n.x), max(bottom, n.y)
        for row in rows:
            if len(row) > 1:
                row.sort(key=lambda n: n.x)
        return cls(title=title, root=placed[0], nodes=placed[1:], by_id=by_id, children=children,
                   active=active, leaf_id=leaf.message.id if leaf is not None else None,
                   width=int(right + NODE_W / 2 + MARGIN), height=int(bottom + R + MARGIN),
                   _rows=rows, _row_xs=[[n.x for n in row] for row in rows])

    def in_rect(self, left: float, top: float, right: float, bottom: float) -> list[TreeNode]:
        """The nodes whose centres lie in the rectangle (tree coordinates): a look at the rows
        it spans, and in each a binary search, never a walk over every node."""
        first = max(0, int((top - MARGIN - R) // DY))
        last = min(len(self._rows) - 1, int((bottom - MARGIN - R) // DY) + 1)
        out: list[TreeNode] = []
        for i in range(first, last + 1):
            xs = self._row_xs[i]
            out.extend(n for n in self._rows[i][bisect.bisect_left(xs, left):bisect.bisect_right(xs, right)]
                       if top <= n.y <= bottom)
        return out


def _path_up(by_id: dict[int, TreeNode], leaf_id: int | None) -> set[int]:
    """The ids from ``leaf_id`` up to its root (a loop with a guard: corrupt data may cycle)."""
    path: set[int] = set()
    node = by_id.get(leaf_id) if leaf_id is not None else None
    while node is not None and node.message.id != ROOT_ID and node.message.id not in path:
        path.add(node.message.id)
        node = by_id.get(node.message.parent_id)
    return path


def read_layout(store: ChatStore, conversation_id: int, leaf_id: int | None, layout=layout_tree) -> TreeLayout:
    """A job for ``ChatReader``: read the tree of ``conversation_id`` and lay it out, with the
    path up from ``leaf_id`` (None: the conversation's active leaf) as the active one."""
    conv = store.get_conversation(conversation_id)
    # only what a node shows: its tooltip's text at most, no token ids or stats
    result = TreeLayout.build(store.tree_outline(conversation_id, OUTLINE_CHARS), conv.title,
                              leaf_id=conv.active_leaf_id if leaf_id is None else leaf_id, layout=layout)
    result.conversation_id = conversation_id
    return result
