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
        for n in placed[1:]:
            children.setdefault(n.message.parent_id, []).append(n)
        on_path = [n for n in placed[1:] if n.message.id in active]
        depth = int(max(n.y for n in placed) - MARGIN - R) // DY + 1
        rows: list[list[TreeNode]] = [[] for _ in range(depth)]
        for n in placed:
            rows[int(n.y - MARGIN - R) // DY].append(n)
        for row in rows:
            row.sort(key=lambda n: n.x)
        return cls(title=title, root=placed[0], nodes=placed[1:], by_id=by_id, children=children,
                   active=active, leaf_id=max(on_path, key=lambda n: n.y).message.id if on_path else None,
                   width=int(max(n.x for n in placed) + NODE_W / 2 + MARGIN),
                   height=int(max(n.y for n in placed) + R + MARGIN),
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
    result = TreeLayout.build(store.tree(conversation_id), conv.title,
                              leaf_id=conv.active_leaf_id if leaf_id is None else leaf_id, layout=layout)
    result.conversation_id = conversation_id
    return result
