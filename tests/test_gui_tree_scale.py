"""Issue #10.0: nothing the data holds keeps the window from opening. A 10,000-message
single branch and a 2,000-sibling fan-out open in the real window (tree panel shown), the
tree panel lays them out without recursion, and a conversation that fails to render is
skipped with a banner."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import sys  # noqa: E402

import pytest  # noqa: E402

from app.window.tree_panel import layout_tree  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _branch(store: ChatStore, n: int) -> tuple[int, int]:
    """One conversation of ``n`` alternating user/assistant messages "x" on one branch;
    returns (conversation id, leaf id)."""
    conv = store.create_conversation(title=f"{n} messages")
    parent = None
    for i in range(n):
        parent = store.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", "x").id
    return conv.id, parent


def _fan_out(store: ChatStore, n: int) -> tuple[int, int]:
    """One user message with ``n`` assistant replies (siblings); returns (conversation id, root id)."""
    conv = store.create_conversation(title=f"{n} siblings")
    root = store.add_message(conv.id, None, "user", "fan out")
    for i in range(n):
        store.add_message(conv.id, root.id, "assistant", f"reply {i}")
    return conv.id, root.id


@pytest.fixture
def window(open_window, data_dir):
    return lambda: open_window(data_dir, wait=False, start_engine=False)


def test_layout_of_a_branch_far_deeper_than_the_recursion_limit(tmp_path):
    with ChatStore(tmp_path / CHATS_DB) as store:
        cid, leaf = _branch(store, sys.getrecursionlimit() * 3)
        messages = store.tree(cid)
    pos = layout_tree(messages)
    assert len(pos) == len(messages)
    assert {x for x, _ in pos.values()} == {0.0}
    assert pos[leaf] == (0.0, float(len(messages) - 1))


def test_layout_centres_a_parent_over_its_children():
    from storage.chats import Message

    def m(i, parent):
        return Message(id=i, conversation_id=1, parent_id=parent, role="user", content="",
                       token_ids=None, stats=None, status="complete", model=None, created_at=0.0)

    pos = layout_tree([m(1, None), m(2, 1), m(3, 1), m(4, 3), m(5, 3), m(6, None)])
    assert pos == {2: (0.0, 1.0), 4: (1.0, 2.0), 5: (2.0, 2.0), 3: (1.5, 1.0), 1: (0.75, 0.0),
                   6: (3.0, 0.0)}
