"""Issue #27.6: the tree panel's worker reads an outline of the tree (what a node shows), and
the tree coverage reads no further than the messages it asks about, so opening a
10,000-message branch keeps the reader off the GIL the UI thread needs."""

from __future__ import annotations

from app.session import ConversationSession
from app.window.tree.tree_layout import OUTLINE_CHARS, read_layout
from app.window.tree.tree_panel import FIRST_LINE_CHARS, LABEL_CHARS, node_label, node_tooltip
from storage.chats import ChatStore
from storage.paths import CHATS_DB


def _chat(store: ChatStore) -> tuple[int, list[int]]:
    """A user message of 9,000 characters, a reply with stats and token ids, an edit beside it."""
    conv = store.create_conversation(title="Outline")
    long = "word " * 1_800
    q = store.add_message(conv.id, None, "user", long)
    a = store.add_message(conv.id, q.id, "assistant", "**An answer** that is short", token_ids=[1, 2, 3],
                          stats={"decode_tokens": 3})
    e = store.add_message(conv.id, None, "user", "an edit")
    store.set_active_leaf(conv.id, a.id)
    return conv.id, [q.id, a.id, e.id]


def test_the_outline_holds_what_a_node_shows_and_nothing_more(tmp_path):
    with ChatStore(tmp_path / CHATS_DB) as store:
        cid, ids = _chat(store)
        full = store.tree(cid)
        outline = store.tree_outline(cid, OUTLINE_CHARS)
    assert [(m.id, m.parent_id, m.role, m.status) for m in outline] == \
        [(m.id, m.parent_id, m.role, m.status) for m in full]
    assert len(full[0].content) == 9_000 and outline[0].content == full[0].content[:OUTLINE_CHARS]
    assert outline[1].token_ids is None and outline[1].stats is None  # read by no node
    assert OUTLINE_CHARS >= 4 * max(FIRST_LINE_CHARS, LABEL_CHARS)
    for short, whole in zip(outline, full):  # a node's words and tooltip are the same
        assert node_label(short) == node_label(whole)
        assert node_tooltip(short, (5, 9)) == node_tooltip(whole, (5, 9))


def test_the_layout_job_reads_the_outline(tmp_path):
    with ChatStore(tmp_path / CHATS_DB) as store:
        cid, (q, a, e) = _chat(store)
        layout = read_layout(store, cid, None)
    assert [n.message.id for n in layout.nodes] == [q, a, e]
    assert len(layout.by_id[q].message.content) == OUTLINE_CHARS
    assert layout.active == {q, a} and layout.leaf_id == a
    assert layout.by_id[a].y > layout.by_id[q].y and layout.by_id[e].x > layout.by_id[q].x


def test_the_tree_coverage_reads_only_the_messages_it_asks_about(tmp_path):
    with ChatStore(tmp_path / CHATS_DB) as store:
        conv = store.create_conversation(title="Five")
        parent = None
        for i in range(5):
            parent = store.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", f"m{i}").id
        every = [m.id for m in store.tree(conv.id)]
        assert [m.id for m in store.tree(conv.id, 2)] == every[:2]
        ids, paths = ConversationSession(store).coverage_paths(conv.id, limit=2)
    assert ids == every[:2]
    assert [[m.content for m in p] for p in paths] == [["m0"], ["m0", "m1"]]
