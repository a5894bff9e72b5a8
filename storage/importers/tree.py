"""Check an exported message tree and put it in the order Branchwise stores it.

Every walk here is iterative (an explicit stack), so a conversation with
100,000 messages in one chain cannot exhaust Python's recursion limit.

``plan`` rejects, naming the node at fault:
- two messages with the same id,
- a message whose parent is not in the conversation,
- a cycle (a message that is its own ancestor; such nodes are unreachable from
  any root, which is how they are found).

It then lists the messages parents first, siblings in the export's order, so
that ids given in that order keep Branchwise's rule "siblings in creation
order (by id)". Nodes that hold no message (``STRUCTURAL``) are left out and
their children move up to the nearest kept ancestor. A leading system message
becomes the conversation's system prompt; an empty one (ChatGPT starts every
conversation with one) holds nothing and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.importers.parts import join_parts, placeholder
from storage.importers.records import STRUCTURAL, ImportFileError, SourceConversation


@dataclass
class PlannedMessage:
    """A message ready to insert: ``parent`` is the source id of a kept message or None."""

    source_id: str
    parent: str | None
    role: str
    content: str
    created_at: float | None
    model: str | None
    extra: dict[str, Any] | None


@dataclass
class Plan:
    """A checked conversation: messages parents first, the active leaf, the system prompt."""

    messages: list[PlannedMessage]
    current: str | None  # source id of the active leaf (a kept message) or None
    system_prompt: str
    leaves: int
    skipped: list[str] = field(default_factory=list)


def plan(conv: SourceConversation, *, lift_system_prompt: bool = True,
         merge_assistant_runs: bool = False) -> Plan:
    """Check ``conv``'s tree and order it for storage.

    ``lift_system_prompt``: a system message before any other message becomes
    the system prompt (when the conversation has none yet).
    ``merge_assistant_runs``: an assistant message that is the only child of
    an assistant message joins it (ChatGPT splits one answer into tool call,
    tool output and text nodes).

    Raises:
        ImportFileError: duplicate id, missing parent or a cycle; the message
            names the node.
    """
    by_id: dict[str, int] = {}
    for i, m in enumerate(conv.messages):
        if m.id in by_id:
            raise ImportFileError(f"message {m.id!r} appears twice")
        by_id[m.id] = i
    children: dict[str | None, list[str]] = {}
    for m in conv.messages:
        if m.parent is not None and m.parent not in by_id:
            raise ImportFileError(
                f"message {m.id!r} names a parent {m.parent!r} that is not in the conversation")
        children.setdefault(m.parent, []).append(m.id)
    if conv.children:
        for parent, kids in children.items():
            order = conv.children.get(parent) if parent is not None else None
            if order:
                rank = {cid: n for n, cid in enumerate(order)}
                kids.sort(key=lambda cid: rank.get(cid, len(rank)))

    # Preorder walk from the roots, children in order (reversed onto the stack).
    order: list[str] = []
    stack = list(reversed(children.get(None, [])))
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        seen.add(node)
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    if len(order) != len(conv.messages):
        raise ImportFileError(_cycle_message(conv, by_id, seen))

    anchor: dict[str, str | None] = {}  # source id -> the kept message its children hang under
    planned: dict[str, PlannedMessage] = {}
    kept_children: dict[str | None, int] = {}
    system_prompt = conv.system_prompt
    skipped: list[str] = []
    result: list[PlannedMessage] = []
    for node in order:
        m = conv.messages[by_id[node]]
        parent = None if m.parent is None else anchor[m.parent]
        if m.role == STRUCTURAL:
            anchor[node] = parent
            continue
        if m.role == "system" and parent is None and lift_system_prompt:
            text = m.content.strip()
            if not text:  # ChatGPT opens every conversation with an empty hidden one: nothing to keep
                anchor[node] = None
                continue
            if not system_prompt.strip() or system_prompt.strip() == text:
                system_prompt = m.content if not system_prompt.strip() else system_prompt
                anchor[node] = None
                continue
        if (merge_assistant_runs and m.role == "assistant" and parent is not None
                and planned[parent].role == "assistant" and kept_children.get(parent, 0) == 0
                and len(children.get(m.parent, ())) == 1):
            into = planned[parent]
            into.content = _join(into.content, m.content)
            into.model = into.model or m.model
            anchor[node] = parent
            continue
        content = m.content
        if m.hidden:
            content = join_parts([placeholder("Hidden system message", "", "the source app did not show it"),
                                  content])
        pm = PlannedMessage(m.id, parent, m.role, content, m.created_at, m.model, m.extra)
        planned[node] = pm
        anchor[node] = node
        kept_children[parent] = kept_children.get(parent, 0) + 1
        result.append(pm)

    if not conv.children:  # keep the file's order (creation order) when it lists parents first
        position = {m.id: i for i, m in enumerate(conv.messages)}
        if all(pm.parent is None or position[pm.parent] < position[pm.source_id] for pm in result):
            result.sort(key=lambda pm: position[pm.source_id])
    current = anchor.get(conv.current) if conv.current is not None else None
    if conv.current is not None and conv.current not in by_id:
        skipped.append(f"the current node {conv.current!r} is not in the conversation; "
                       "the latest branch is shown instead")
    if current is None and result:
        current = _latest_leaf(result)
    leaves = sum(1 for pm in result if kept_children.get(pm.source_id, 0) == 0)
    return Plan(result, current, system_prompt, leaves, skipped)


def _join(a: str, b: str) -> str:
    if not a.strip():
        return b
    if not b.strip():
        return a
    return f"{a.rstrip()}\n\n{b.lstrip()}"


def _latest_leaf(messages: list[PlannedMessage]) -> str:
    """From the last root, follow the last child down (Branchwise's ``deepest_leaf``)."""
    last_child: dict[str | None, str] = {}
    for pm in messages:  # parents first, siblings in order: the last one wins
        last_child[pm.parent] = pm.source_id
    node = last_child[None]
    while node in last_child:
        node = last_child[node]
    return node


def _cycle_message(conv: SourceConversation, by_id: dict[str, int], reachable: set[str]) -> str:
    """Name the messages of one cycle among the nodes no root reaches."""
    start = next(m.id for m in conv.messages if m.id not in reachable)
    path: list[str] = []
    on_path: set[str] = set()
    node: str | None = start
    while node is not None and node not in on_path:
        on_path.add(node)
        path.append(node)
        node = conv.messages[by_id[node]].parent
    if node is None:  # pragma: no cover - unreachable nodes always lead into a cycle
        return f"message {start!r} cannot be reached from the first message"
    loop = path[path.index(node):]
    shown = " -> ".join(repr(x) for x in loop[:6]) + (" -> …" if len(loop) > 6 else "")
    return (f"messages {shown} -> {node!r} form a cycle (each is the parent of the next), "
            "so the conversation has no first message")
