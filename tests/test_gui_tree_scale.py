"""Issue #10.0: nothing the data holds keeps the window from opening. A 10,000-message
single branch and a 2,000-sibling fan-out open in the real window (tree panel shown), the
tree panel lays them out without recursion, and a conversation that fails to render is
skipped with a banner."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from PySide6.QtCore import Qt  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402

from app.window.transcript.transcript_view import FIRST_BUBBLES, SHOWN_MESSAGES  # noqa: E402
from app.window.tree.tree_panel import layout_tree  # noqa: E402
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


def test_window_opens_on_a_10000_message_branch_and_a_2000_sibling_fan_out(qtbot, window, data_dir):
    with ChatStore(data_dir / CHATS_DB) as store:
        fan_id, root = _fan_out(store, 2_000)
        deep_id, leaf = _branch(store, 10_000)  # the newest: the window opens on it
    w = window()
    w.tree.setVisible(True)
    assert w.conversation_id == deep_id
    wait_for_tree(qtbot, w)
    canvas = w.tree.canvas
    assert len(canvas.nodes) == 10_000
    assert canvas.leaf_id == leaf
    assert w.transcript.widgets[-1].message.id == leaf
    # the transcript builds the newest bubbles at once, the older ones of the newest
    # SHOWN_MESSAGES as they are scrolled to; a button brings the earlier ones
    assert FIRST_BUBBLES <= len(w.transcript.widgets) < SHOWN_MESSAGES and w.transcript.building
    bar = w.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())  # a screenful, at the bottom
    built = len(w.transcript.widgets)
    assert built < SHOWN_MESSAGES
    bar.setValue(0)  # scrolled to the top: the next older bubbles are built above
    assert len(w.transcript.widgets) > built
    qtbot.waitUntil(lambda: bar.value() > 0)  # laid out above: what was shown stays in place
    w.transcript.finish_building()
    assert len(w.transcript.widgets) == SHOWN_MESSAGES
    button = w.transcript.earlier_button
    assert button.isVisible()
    assert button.text() == f"Show earlier messages ({10_000 - SHOWN_MESSAGES:,} not shown)"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    w.transcript.finish_building()
    assert len(w.transcript.widgets) == 2 * SHOWN_MESSAGES
    assert w.transcript.widgets[-1].message.id == leaf
    w.show_conversation(fan_id)
    wait_for_tree(qtbot, w)
    assert len(canvas.nodes) == 2_001
    xs = sorted(n.x for n in canvas.nodes if n.message.id != root)
    assert len(set(xs)) == 2_000  # every sibling has a column of its own
    assert not w.transcript.earlier_button.isVisible()  # the path is 2 messages
    assert [m.message.id for m in w.transcript.widgets][0] == root
    assert w.transcript.widgets[0].message.content == "fan out"


def test_a_chat_that_fails_to_render_is_skipped_with_a_banner(qtbot, window, data_dir, monkeypatch):
    import app.window.tree.tree_panel as tree_panel

    real = tree_panel.layout_tree

    def broken(messages):
        if any(m.content == "poison" for m in messages):
            raise RecursionError("maximum recursion depth exceeded")
        return real(messages)

    monkeypatch.setattr(tree_panel, "layout_tree", broken)
    settings = data_dir / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "show_tree": True}))
    with ChatStore(data_dir / CHATS_DB) as store:
        good = store.create_conversation(title="good")
        store.add_message(good.id, None, "user", "fine")
        bad = store.create_conversation(title="<b>bad</b>")  # the newest: opened first
        store.add_message(bad.id, None, "user", "poison")
    w = window()
    # its tree is laid out off the UI thread: the failure arrives a moment later, and the
    # window moves on to the next chat
    qtbot.waitUntil(lambda: w.conversation_id == good.id and not w.tree.loading)
    assert w.banner.isVisible()
    assert w.banner.text.startswith("The chat “<b>bad</b>” could not be shown (RecursionError)")
    assert "Traceback" not in w.banner.text
    assert w.sidebar.ids() == [bad.id, good.id]  # still listed, so it can be deleted
    # clicking it again: the same banner, the empty page, the window still works
    w.sidebar.selected.emit(bad.id)
    qtbot.waitUntil(lambda: w.conversation_id is None)
    assert w.banner.text.startswith("The chat “<b>bad</b>”")
    w.sidebar.selected.emit(good.id)
    assert w.conversation_id == good.id
    assert [m.message.content for m in w.transcript.widgets] == ["fine"]
