"""Tests of the conversation tree store (storage/chats.py)."""

from __future__ import annotations

import errno
import shutil
import sqlite3
import struct
import subprocess
import sys
import threading
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from storage import chat_schema
from storage.chats import (
    DEFAULT_SAMPLING,
    DEFAULT_TITLE,
    TITLE_LIMIT,
    ChatStore,
    Conversation,
    Message,
    auto_title,
    search_terms,
)
from storage.errors import (
    NotFoundError,
    StorageError,
    StorageFullError,
    disk_full_as_storage_full,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "chats.sqlite3"


@pytest.fixture
def store(db_path: Path):
    with ChatStore(db_path) as chat_store:
        yield chat_store


def build_tree(store: ChatStore) -> dict[str, Message]:
    """A conversation with an edit and a regeneration.

        u1 ─ a1          (a1 regenerated as a1r: sibling of a1)
           └ a1r ─ u2
        u1b ─ a1b        (u1 edited as u1b: a second root)
    """
    conv = store.create_conversation(title="Tree")
    cid = conv.id
    m: dict[str, Message] = {}
    m["u1"] = store.add_message(cid, None, "user", "What is a KV cache?")
    m["a1"] = store.add_message(cid, m["u1"].id, "assistant", "Keys and values.", token_ids=[5, 6])
    m["a1r"] = store.add_message(cid, m["u1"].id, "assistant", "Cached attention state.")
    m["u2"] = store.add_message(cid, m["a1r"].id, "user", "How big is it?")
    m["u1b"] = store.add_message(cid, None, "user", "What is a prefix cache?")
    m["a1b"] = store.add_message(cid, m["u1b"].id, "assistant", "Reused KV for shared prefixes.")
    return m


def ids(messages: list[Message]) -> list[int]:
    return [message.id for message in messages]


def count_rows(db_path: Path, table: str) -> int:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


# -- the tree -------------------------------------------------------------------


def test_edit_and_regenerate_create_siblings_in_creation_order(store: ChatStore) -> None:
    m = build_tree(store)
    assert ids(store.branches.siblings(m["a1"].id)) == [m["a1"].id, m["a1r"].id]
    assert ids(store.branches.siblings(m["a1r"].id)) == [m["a1"].id, m["a1r"].id]
    assert ids(store.branches.siblings(m["u1"].id)) == [m["u1"].id, m["u1b"].id]  # roots are siblings
    assert ids(store.branches.siblings(m["u2"].id)) == [m["u2"].id]
    cid = m["u1"].conversation_id
    assert ids(store.branches.children(None, cid)) == [m["u1"].id, m["u1b"].id]
    assert ids(store.branches.children(m["u1"].id, cid)) == [m["a1"].id, m["a1r"].id]
    assert store.branches.children(m["u2"].id, cid) == []


def test_messages_keep_their_fields(store: ChatStore) -> None:
    conv = store.create_conversation()
    msg = store.add_message(
        conv.id, None, "assistant", "hi", token_ids=[1, 2], stats={"tokens": 2, "decode_ms": 31.5},
        status="stopped", model="SmolLM2-135M-Instruct-Q4_1",
    )
    assert store.get_message(msg.id) == Message(
        id=msg.id, conversation_id=conv.id, parent_id=None, role="assistant", content="hi",
        token_ids=(1, 2), stats={"tokens": 2, "decode_ms": 31.5}, status="stopped",
        model="SmolLM2-135M-Instruct-Q4_1", created_at=msg.created_at,
    )


def test_path_to_and_active_path(store: ChatStore) -> None:
    m = build_tree(store)
    cid = m["u1"].conversation_id
    assert ids(store.branches.path_to(m["u2"].id)) == [m["u1"].id, m["a1r"].id, m["u2"].id]
    assert ids(store.branches.path_to(m["u1"].id)) == [m["u1"].id]
    # add_message made the last message the active leaf
    assert store.get_conversation(cid).active_leaf_id == m["a1b"].id
    assert ids(store.active_path(cid)) == [m["u1b"].id, m["a1b"].id]
    store.set_active_leaf(cid, m["a1"].id)
    assert store.get_conversation(cid).active_leaf_id == m["a1"].id
    assert ids(store.active_path(cid)) == [m["u1"].id, m["a1"].id]
    assert store.active_path(store.create_conversation().id) == []


def test_deepest_leaf_follows_the_latest_child(store: ChatStore) -> None:
    m = build_tree(store)
    cid = m["u1"].conversation_id
    assert store.branches.deepest_leaf(m["u1"].id).id == m["u2"].id  # via a1r, the newer child
    assert store.branches.deepest_leaf(m["a1"].id).id == m["a1"].id  # a leaf is its own deepest leaf
    assert store.branches.deepest_leaf(m["u1b"].id).id == m["a1b"].id
    newest = store.add_message(cid, m["a1"].id, "user", "Later follow-up on a1")
    assert store.branches.deepest_leaf(m["a1"].id).id == newest.id
    # greedy: from u1 the newest child is still a1r, whatever happens under a1
    assert store.branches.deepest_leaf(m["u1"].id).id == m["u2"].id


def test_tree_lists_every_message_parents_first(store: ChatStore) -> None:
    m = build_tree(store)
    tree = store.tree(m["u1"].conversation_id)
    assert ids(tree) == sorted(message.id for message in m.values())
    seen: set[int] = set()
    for message in tree:
        assert message.parent_id is None or message.parent_id in seen
        seen.add(message.id)


def test_add_message_checks_parent_role_and_status(store: ChatStore) -> None:
    a = store.create_conversation()
    b = store.create_conversation()
    in_a = store.add_message(a.id, None, "user", "hello")
    with pytest.raises(ValueError, match=f"belongs to conversation {a.id}"):
        store.add_message(b.id, in_a.id, "assistant", "wrong tree")
    with pytest.raises(NotFoundError, match="no message with id 4242"):
        store.add_message(a.id, 4242, "assistant", "orphan")
    with pytest.raises(NotFoundError, match="no conversation with id 77"):
        store.add_message(77, None, "user", "nowhere")
    with pytest.raises(ValueError, match="role"):
        store.add_message(a.id, None, "robot", "x")  # "tool" is a role from schema 7 on (tool steps)
    with pytest.raises(ValueError, match="status"):
        store.add_message(a.id, None, "user", "x", status="done")
    with pytest.raises(ValueError, match=f"belongs to conversation {a.id}"):
        store.set_active_leaf(b.id, in_a.id)
    assert ids(store.tree(b.id)) == []
    assert store.get_conversation(b.id).active_leaf_id is None
    system = store.add_message(a.id, None, "system", "allowed, although unused")
    assert system.role == "system"


def test_add_message_bumps_updated_at(store: ChatStore) -> None:
    conv = store.create_conversation()
    msg = store.add_message(conv.id, None, "user", "hi")
    after = store.get_conversation(conv.id)
    assert after.updated_at == msg.created_at >= conv.updated_at
    assert after.created_at == conv.created_at


# -- fork, duplicate, delete ----------------------------------------------------


def test_fork_copies_only_the_path(store: ChatStore) -> None:
    m = build_tree(store)
    source_id = m["u1"].conversation_id
    store.set_system_prompt(source_id, "Be brief.")
    store.set_sampling(source_id, {"temperature": 0.1})
    fork = store.copies.fork(m["a1r"].id)
    assert fork.id != source_id
    assert fork.title == "Fork of Tree"
    assert fork.system_prompt == "Be brief."
    assert fork.sampling["temperature"] == 0.1
    copied = store.tree(fork.id)
    assert [(c.role, c.content) for c in copied] == [
        ("user", "What is a KV cache?"),
        ("assistant", "Cached attention state."),
    ]
    assert copied[0].parent_id is None and copied[1].parent_id == copied[0].id
    assert fork.active_leaf_id == copied[1].id
    assert ids(store.active_path(fork.id)) == ids(copied)
    # the source is untouched
    assert len(store.tree(source_id)) == 6
    assert store.get_conversation(source_id).active_leaf_id == m["a1b"].id


def test_fork_keeps_token_ids_and_times(store: ChatStore) -> None:
    m = build_tree(store)
    fork = store.copies.fork(m["a1"].id)
    original, copy = store.get_message(m["a1"].id), store.active_path(fork.id)[-1]
    assert copy.token_ids == original.token_ids == (5, 6)
    assert copy.created_at == original.created_at
    assert copy.id != original.id


def test_duplicate_copies_tree_and_active_leaf(store: ChatStore) -> None:
    m = build_tree(store)
    source_id = m["u1"].conversation_id
    store.set_active_leaf(source_id, m["u2"].id)
    store.set_pinned(source_id, True)
    dup = store.copies.duplicate_conversation(source_id)
    assert dup.title == "Tree (copy)"
    assert dup.pinned is False
    source_tree, dup_tree = store.tree(source_id), store.tree(dup.id)
    assert [(x.role, x.content, x.token_ids) for x in dup_tree] == [
        (x.role, x.content, x.token_ids) for x in source_tree
    ]
    # same shape: map ids and compare parents
    mapping = {s.id: d.id for s, d in zip(source_tree, dup_tree)}
    assert [d.parent_id for d in dup_tree] == [
        None if s.parent_id is None else mapping[s.parent_id] for s in source_tree
    ]
    assert dup.active_leaf_id == mapping[m["u2"].id]
    assert [x.content for x in store.active_path(dup.id)] == [
        "What is a KV cache?", "Cached attention state.", "How big is it?",
    ]


def test_duplicate_of_empty_conversation(store: ChatStore) -> None:
    conv = store.create_conversation(title="Empty")
    dup = store.copies.duplicate_conversation(conv.id)
    assert dup.active_leaf_id is None and store.tree(dup.id) == []


def test_delete_conversation_cascades(store: ChatStore, db_path: Path) -> None:
    m = build_tree(store)
    keep = store.create_conversation(title="Keep")
    kept = store.add_message(keep.id, None, "user", "cache stays here")
    cid = m["u1"].conversation_id
    store.delete_conversation(cid)
    with pytest.raises(NotFoundError):
        store.get_conversation(cid)
    for message in m.values():
        with pytest.raises(NotFoundError):
            store.get_message(message.id)
    assert count_rows(db_path, "messages") == 1
    assert store.get_message(kept.id).content == "cache stays here"
    assert [c.id for c, _ in store.search("cache")] == [keep.id]
    assert [c.id for c, _ in store.search("Tree")] == []
    with pytest.raises(NotFoundError, match=f"no conversation with id {cid}"):
        store.delete_conversation(cid)


def test_fts_index_stays_consistent(store: ChatStore, db_path: Path) -> None:
    m = build_tree(store)
    store.update_message(m["a1"].id, content="rewritten")
    store.rename(m["u1"].conversation_id, "Renamed")
    store.copies.fork(m["u2"].id)
    store.delete_conversation(m["u1"].conversation_id)
    with sqlite3.connect(db_path) as conn:  # raises "database disk image is malformed" if not
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        conn.execute("INSERT INTO conversations_fts(conversations_fts) VALUES ('integrity-check')")


# -- conversations --------------------------------------------------------------


def test_list_conversations_pinned_first_then_recent(store: ChatStore) -> None:
    a = store.create_conversation(title="A")
    b = store.create_conversation(title="B")
    c = store.create_conversation(title="C")
    store.add_message(a.id, None, "user", "bump A")
    assert [x.title for x in store.list_conversations()] == ["A", "C", "B"]
    store.set_pinned(b.id, True)
    listed = store.list_conversations()
    assert [x.title for x in listed] == ["B", "A", "C"]
    assert [x.pinned for x in listed] == [True, False, False]
    store.set_pinned(b.id, False)
    assert [x.title for x in store.list_conversations()] == ["A", "C", "B"]
    assert c.id in [x.id for x in listed]


def test_rename_system_prompt_and_sampling(store: ChatStore) -> None:
    conv = store.create_conversation()
    assert conv.title == DEFAULT_TITLE and conv.system_prompt == ""
    assert conv.sampling == dict(DEFAULT_SAMPLING)
    store.rename(conv.id, "  Quantization notes ")
    store.set_system_prompt(conv.id, "You are terse.")
    store.set_sampling(conv.id, {"temperature": 0.0, "seed": 42, "max_tokens": 64})
    got = store.get_conversation(conv.id)
    assert got.title == "Quantization notes"
    assert got.system_prompt == "You are terse."
    assert got.sampling == {**DEFAULT_SAMPLING, "temperature": 0.0, "seed": 42, "max_tokens": 64}
    store.rename(conv.id, "   ")
    assert store.get_conversation(conv.id).title == DEFAULT_TITLE
    with pytest.raises(ValueError, match="temprature"):
        store.set_sampling(conv.id, {"temprature": 1.0})
    custom = store.create_conversation(sampling={"top_k": 0})
    assert custom.sampling["top_k"] == 0 and custom.sampling["top_p"] == DEFAULT_SAMPLING["top_p"]


def test_not_found_errors_name_the_id(store: ChatStore) -> None:
    cases = [
        (lambda: store.get_conversation(999), "There is no conversation with id 999"),
        (lambda: store.rename(999, "x"), "There is no conversation with id 999"),
        (lambda: store.set_pinned(999, True), "There is no conversation with id 999"),
        (lambda: store.copies.duplicate_conversation(999), "There is no conversation with id 999"),
        (lambda: store.active_path(999), "There is no conversation with id 999"),
        (lambda: store.tree(999), "There is no conversation with id 999"),
        (lambda: store.branches.children(None, 999), "There is no conversation with id 999"),
        (lambda: store.get_message(12345), "There is no message with id 12345"),
        (lambda: store.update_message(12345, content="x"), "There is no message with id 12345"),
        (lambda: store.copies.fork(12345), "There is no message with id 12345"),
        (lambda: store.branches.path_to(12345), "There is no message with id 12345"),
        (lambda: store.branches.siblings(12345), "There is no message with id 12345"),
        (lambda: store.branches.deepest_leaf(12345), "There is no message with id 12345"),
    ]
    for call, expected in cases:
        with pytest.raises(NotFoundError) as info:
            call()
        assert str(info.value).startswith(expected)
        assert isinstance(info.value, StorageError)


# -- auto title -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("Hello", "Hello"),
        ("  Explain\t the   KV   cache  ", "Explain the KV cache"),
        ("\n\nFirst line\nsecond line", "First line"),
        ("", ""),
        ("   \n  ", ""),
        (
            "How do I restore the longest common prefix of two token sequences quickly?",
            "How do I restore the longest common prefix of…",
        ),
        ("x" * 100, "x" * (TITLE_LIMIT - 1) + "…"),
    ],
)
def test_auto_title(text: str, title: str) -> None:
    assert auto_title(text) == title
    assert len(auto_title(text)) <= TITLE_LIMIT


def test_cut_lands_on_word_boundary() -> None:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    title = auto_title(words)
    assert title.endswith("…")
    assert words.startswith(title[:-1])
    assert words[len(title) - 1] == " "  # the next character was a space


def test_first_user_message_titles_the_conversation(store: ChatStore) -> None:
    conv = store.create_conversation()
    store.add_message(conv.id, None, "assistant", "Greeting from the assistant")
    assert store.get_conversation(conv.id).title == DEFAULT_TITLE
    first = store.add_message(conv.id, None, "user", "Compare   Q4_1 and\nQ8_0 please")
    assert store.get_conversation(conv.id).title == "Compare Q4_1 and"
    store.add_message(conv.id, first.id, "user", "Another question")
    assert store.get_conversation(conv.id).title == "Compare Q4_1 and"

    named = store.create_conversation(title="My title")
    store.add_message(named.id, None, "user", "Something else")
    assert store.get_conversation(named.id).title == "My title"

    blank = store.create_conversation()
    store.add_message(blank.id, None, "user", "   ")
    assert store.get_conversation(blank.id).title == DEFAULT_TITLE


# -- search ---------------------------------------------------------------------


def test_search_finds_message_text_and_titles(store: ChatStore) -> None:
    m = build_tree(store)
    tree_id = m["u1"].conversation_id
    other = store.create_conversation(title="Quantization formats")
    store.add_message(other.id, None, "user", "Is Q4_1 worse than Q8_0?")

    results = store.search("prefixes")
    assert [(c.id, snippet) for c, snippet in results] == [
        (tree_id, "Reused KV for shared «prefixes».")
    ]
    results = store.search("quantization")
    assert [(c.title, snippet) for c, snippet in results] == [
        ("Quantization formats", "«Quantization» formats")
    ]
    assert [c.id for c, _ in store.search("Tree")] == [tree_id]  # title only
    assert [c.id for c, _ in store.search("kv")] == [tree_id]  # one result per conversation
    assert [c.id for c, _ in store.search("cac")] == [tree_id]  # last term is a prefix
    assert [c.id for c, _ in store.search("CACHE what")] == [tree_id]  # all terms, any case
    assert store.search("cache quantization") == []
    assert isinstance(store.search("worse")[0][0], Conversation)


def test_search_title_matches_come_first_with_message_snippet(store: ChatStore) -> None:
    by_text = store.create_conversation(title="Unrelated")
    store.add_message(by_text.id, None, "user", "llama llama llama")
    by_title = store.create_conversation(title="About llama")
    store.add_message(by_title.id, None, "user", "a llama fact")
    results = store.search("llama", marks=("<b>", "</b>"))
    assert [(c.id, s) for c, s in results] == [
        (by_title.id, "a <b>llama</b> fact"),
        (by_text.id, "<b>llama</b> <b>llama</b> <b>llama</b>"),
    ]


def test_search_sees_edits_and_respects_limit(store: ChatStore) -> None:
    conv = store.create_conversation()
    msg = store.add_message(conv.id, None, "assistant", "partial", status="streaming")
    store.update_message(msg.id, content="final answer", status="complete")
    assert store.search("partial") == []
    assert [c.id for c, _ in store.search("final")] == [conv.id]
    for i in range(5):
        other = store.create_conversation(title=f"Topic {i}")
        store.add_message(other.id, None, "user", "shared needle")
    assert len(store.search("needle", limit=3)) == 3
    assert len(store.search("needle")) == 5
    assert store.search("needle", limit=0) == []


@pytest.mark.parametrize(
    "query",
    ['"foo AND (', "(", '"', "*", "NOT", "foo:bar", "a OR", "^x", "NEAR(a b", "'", "-foo",
     "   ", "", "col:", "{a b}", '""""', "AND OR NOT", "é", "\x00"],
)
def test_search_never_raises_on_syntax_characters(store: ChatStore, query: str) -> None:
    conv = store.create_conversation(title="Syntax")
    store.add_message(conv.id, None, "user", "foo and bar")
    assert isinstance(store.search(query), list)


def test_search_with_syntax_characters_still_matches(store: ChatStore) -> None:
    conv = store.create_conversation(title="Syntax")
    store.add_message(conv.id, None, "user", "foo and bar: cafe")
    assert [c.id for c, _ in store.search('"foo AND (')] == [conv.id]
    assert [c.id for c, _ in store.search("bar:")] == [conv.id]
    assert [c.id for c, _ in store.search("CAFE")] == [conv.id]  # case folded


def test_search_terms_drop_punctuation_and_keep_symbols() -> None:
    assert search_terms('"foo AND (') == ['"foo', "AND"]
    assert search_terms("kv cache KV") == ["kv", "cache"]
    assert search_terms(" ( ) * -- ") == ["*"] or search_terms(" ( ) * -- ") == []
    assert search_terms("C++ 🍎 苹果") == ["C++", "🍎", "苹果"]


@pytest.mark.parametrize(
    ("text", "query"),
    [("我喜欢苹果", "苹果"), ("我喜欢苹果和香蕉", "喜欢苹果"), ("an 🍎 a day", "🍎"),
     ("I write C++ daily", "C++"), ("I write C++ daily", "c++"), ("ファイルを開く", "ファイル")],
)
def test_search_finds_cjk_emoji_and_symbols(store: ChatStore, text: str, query: str) -> None:
    other = store.create_conversation(title="Other")
    store.add_message(other.id, None, "user", "I write C daily, no apples")
    conv = store.create_conversation(title="Words")
    store.add_message(conv.id, None, "user", text)
    results = store.search(query)
    assert [c.id for c, _ in results] == [conv.id]
    assert f"«{query}»".casefold() in results[0][1].casefold()


def test_search_finds_words_spread_over_messages_and_title(store: ChatStore) -> None:
    conv = store.create_conversation(title="Trip planning")
    first = store.add_message(conv.id, None, "user", "We fly to Lisbon in May.")
    store.add_message(conv.id, first.id, "assistant", "Pack a raincoat for the ferry.")
    lone = store.create_conversation(title="Lisbon only")
    store.add_message(lone.id, None, "user", "Lisbon has trams.")
    assert [c.id for c, _ in store.search("lisbon raincoat")] == [conv.id]
    assert [c.id for c, _ in store.search("trip ferry")] == [conv.id]  # title + message
    assert store.search("lisbon submarine") == []
    assert {c.id for c, _ in store.search("lisbon")} == {conv.id, lone.id}


# -- token ids ------------------------------------------------------------------


@pytest.mark.parametrize(
    "token_ids",
    [[], [0], [1, 2, 3], [2**31 - 1, 151_935, 0, 49_151], [-1, -(2**31)], list(range(50_000))],
)
def test_token_ids_round_trip(store: ChatStore, db_path: Path, token_ids: list[int]) -> None:
    conv = store.create_conversation()
    msg = store.add_message(conv.id, None, "assistant", "x", token_ids=token_ids)
    assert msg.token_ids == tuple(token_ids)
    with ChatStore(db_path) as reopened:
        assert reopened.get_message(msg.id).token_ids == tuple(token_ids)
    with sqlite3.connect(db_path) as conn:
        blob = conn.execute("SELECT token_ids FROM messages WHERE id = ?", (msg.id,)).fetchone()[0]
    assert blob == struct.pack(f"<{len(token_ids)}i", *token_ids)  # little-endian int32


def test_token_ids_none_empty_and_out_of_range(store: ChatStore) -> None:
    conv = store.create_conversation()
    user = store.add_message(conv.id, None, "user", "hi")
    assert user.token_ids is None
    reply = store.add_message(conv.id, user.id, "assistant", "", token_ids=[])
    assert store.get_message(reply.id).token_ids == ()
    store.update_message(reply.id, token_ids=[7, 8, 9])
    assert store.get_message(reply.id).token_ids == (7, 8, 9)
    store.update_message(reply.id, token_ids=None)
    assert store.get_message(reply.id).token_ids is None
    with pytest.raises(ValueError, match="32-bit"):
        store.add_message(conv.id, None, "assistant", "x", token_ids=[2**31])
    with pytest.raises(ValueError, match="32-bit"):
        store.update_message(reply.id, token_ids=[-(2**31) - 1])


# -- streaming and durability -------------------------------------------------------


def test_update_message_changes_only_given_fields(store: ChatStore) -> None:
    conv = store.create_conversation()
    msg = store.add_message(
        conv.id, None, "assistant", "", status="streaming", model="m", stats={"a": 1}
    )
    for text in ("Hel", "Hello", "Hello, world"):
        store.update_message(msg.id, content=text)
    assert store.get_message(msg.id).content == "Hello, world"
    assert store.get_message(msg.id).status == "streaming"
    assert store.get_message(msg.id).stats == {"a": 1}
    store.update_message(msg.id, token_ids=[1, 2], stats={"tokens": 2}, status="complete")
    got = store.get_message(msg.id)
    assert (got.content, got.token_ids, got.stats, got.status, got.model) == (
        "Hello, world", (1, 2), {"tokens": 2}, "complete", "m",
    )
    store.update_message(msg.id, stats=None)
    assert store.get_message(msg.id).stats is None
    store.update_message(msg.id)  # nothing to change
    with pytest.raises(ValueError, match="status"):
        store.update_message(msg.id, status="finished")


def test_a_crash_keeps_the_last_update(db_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from storage.chats import ChatStore
        store = ChatStore({str(db_path)!r})
        conv = store.create_conversation()
        msg = store.add_message(conv.id, None, "assistant", "", status="streaming")
        store.update_message(msg.id, content="saved text")
        os._exit(0)  # no close(), no cleanup: like a crash
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True)
    with ChatStore(db_path) as store:
        (conv,) = store.list_conversations()
        (msg,) = store.active_path(conv.id)
        assert (msg.content, msg.status) == ("saved text", "streaming")
        assert store.mark_interrupted_streams() == 1
        assert store.get_message(msg.id).status == "stopped"
        assert store.mark_interrupted_streams() == 0


def test_reopen_keeps_everything(db_path: Path) -> None:
    with ChatStore(db_path) as store:
        m = build_tree(store)
        store.set_pinned(m["u1"].conversation_id, True)
        store.copies.fork(m["u2"].id)
        conversations = store.list_conversations()
        trees = {c.id: store.tree(c.id) for c in conversations}
    with ChatStore(db_path) as store:
        assert store.list_conversations() == conversations
        assert {c.id: store.tree(c.id) for c in conversations} == trees
        assert [c.id for c, _ in store.search("prefix")] == [m["u1"].conversation_id]


# -- schema, pragmas, errors ----------------------------------------------------------


def test_pragmas(store: ChatStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(chat_schema.MIGRATIONS)
    assert store.database.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.database.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_migrations_run_once(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ChatStore(db_path) as store:
        conv = store.create_conversation(title="Before")
    shipped = len(chat_schema.MIGRATIONS)
    assert shipped >= 1

    def must_not_run(conn: sqlite3.Connection) -> None:
        raise AssertionError("a migration ran again")

    monkeypatch.setattr(chat_schema, "MIGRATIONS", [must_not_run] * shipped)
    with ChatStore(db_path) as store:
        assert store.get_conversation(conv.id).title == "Before"

    calls: list[int] = []

    def add_column(conn: sqlite3.Connection) -> None:
        calls.append(1)
        conn.execute("ALTER TABLE conversations ADD COLUMN color TEXT")

    monkeypatch.setattr(chat_schema, "MIGRATIONS", [*[must_not_run] * shipped, add_column])
    for _ in range(2):
        with ChatStore(db_path) as store:
            assert store.get_conversation(conv.id).title == "Before"
    assert calls == [1]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == shipped + 1
        columns = [row[1] for row in conn.execute("PRAGMA table_info(conversations)")]
    assert "color" in columns


def test_ids_are_never_given_out_again_after_a_delete(db_path: Path) -> None:
    with ChatStore(db_path) as store:
        a = store.create_conversation(title="Kept")
        store.add_message(a.id, None, "user", "first")
        b = store.create_conversation(title="Deleted")
        gone = store.add_message(b.id, None, "user", "second")
        store.delete_conversation(b.id)  # the newest chat and the newest message
        c = store.create_conversation(title="New")
        m = store.add_message(c.id, None, "user", "third")
        assert (c.id, m.id) == (b.id + 1, gone.id + 1)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_an_older_database_keeps_its_ids_and_stops_reusing_them(db_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = chat_schema.MIGRATIONS
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped[:-1])  # the schema before ids were kept
    with ChatStore(db_path) as store:
        a = store.create_conversation(title="A")
        q = store.add_message(a.id, None, "user", "question")
        r = store.add_message(a.id, q.id, "assistant", "answer")
        b = store.create_conversation(title="B")
        store.add_message(b.id, None, "user", "other")
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped)
    with ChatStore(db_path) as store:
        assert [m.id for m in store.tree(a.id)] == [q.id, r.id]
        last = store.tree(b.id)[0].id
        store.delete_conversation(b.id)
        c = store.create_conversation(title="C")
        assert c.id == b.id + 1 and store.add_message(c.id, None, "user", "x").id == last + 1
        assert [c.id for c, _ in store.search("answer")] == [a.id]  # search still finds the old rows


def test_failed_migration_leaves_old_version(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ChatStore(db_path).close()
    shipped = len(chat_schema.MIGRATIONS)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(chat_schema, "MIGRATIONS", [*chat_schema.MIGRATIONS, broken])
    with pytest.raises(RuntimeError, match="boom"):
        ChatStore(db_path)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == shipped
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in tables


def test_newer_schema_is_refused(db_path: Path) -> None:
    ChatStore(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StorageError, match="newer version of Branchwise"):
        ChatStore(db_path)


def test_a_file_that_is_not_a_database(db_path: Path) -> None:
    db_path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="not a readable Branchwise chat database"):
        ChatStore(db_path)


def test_full_disk_becomes_storage_full_error(store: ChatStore) -> None:
    conv = store.create_conversation()
    pages = store.database.conn.execute("PRAGMA page_count").fetchone()[0]
    store.database.conn.execute(f"PRAGMA max_page_count = {pages}")  # the database cannot grow
    with pytest.raises(StorageFullError, match="is full") as info:
        store.add_message(conv.id, None, "user", "x" * 1_000_000)
    assert "Free some space" in str(info.value)
    assert store.tree(conv.id) == []  # rolled back, the store still works
    store.rename(conv.id, "Still writable")
    assert store.get_conversation(conv.id).title == "Still writable"


def test_enospc_becomes_storage_full_error() -> None:
    with pytest.raises(StorageFullError, match="/data/x"):
        with disk_full_as_storage_full("/data/x"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError):
        with disk_full_as_storage_full("/data/x"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_threads_share_one_store(store: ChatStore) -> None:
    conversations = [store.create_conversation(title=f"T{i}") for i in range(4)]
    errors: list[BaseException] = []

    def worker(conversation_id: int) -> None:
        try:
            parent = None
            for n in range(50):
                parent = store.add_message(conversation_id, parent, "user", f"m{n}").id
                store.update_message(parent, content=f"m{n}!")
                store.active_path(conversation_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(c.id,)) for c in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for conv in conversations:
        path = store.active_path(conv.id)
        assert [m.content for m in path] == [f"m{n}!" for n in range(50)]


# -- migration from schema 1 (the schema Branchwise shipped before trigram search) ------

FIXTURE_V1 = Path(__file__).parent / "fixtures" / "chats_schema1.sqlite3"
"""Made by the schema-1 code (commit b7abd8c's storage/chats.py): three conversations,
one with two sibling replies, a CJK/emoji/C++ one and a pinned one."""


def _rows(path: Path) -> tuple[list, list]:
    """Every row of schema 1's columns (later migrations may add columns, never change these)."""
    with closing(sqlite3.connect(FIXTURE_V1)) as v1:
        columns = {t: ", ".join(r[1] for r in v1.execute(f"PRAGMA table_info({t})"))
                   for t in ("conversations", "messages")}
    with closing(sqlite3.connect(path)) as conn:
        return (conn.execute(f"SELECT {columns['conversations']} FROM conversations ORDER BY id").fetchall(),
                conn.execute(f"SELECT {columns['messages']} FROM messages ORDER BY id").fetchall())


def test_schema_1_database_migrates_with_everything_intact(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    shutil.copyfile(FIXTURE_V1, path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    before = _rows(path)
    assert len(before[0]) == 3 and len(before[1]) == 6
    with ChatStore(path) as store:
        assert [c.title for c in store.list_conversations()][0] == "Pinned notes"
        hits = {q: [(c.id, s) for c, s in store.search(q)] for q in
                ("prefixes", "quantization", "苹果", "🍎", "C++", "café", "shared answer")}
        conv = store.get_conversation(1)
        assert [m.content for m in store.active_path(1)] == [
            "How does the KV cache reuse shared prefixes?", "Reused KV for shared prefixes."]
        assert list(store.active_path(1)[-1].token_ids) == [1, 2, 3]
        assert conv.system_prompt == "Be brief."
    assert _rows(path) == before  # every conversation and message, byte for byte
    assert hits["prefixes"] == [(1, "Reused KV for shared «prefixes».")]  # as schema 1 found it
    assert hits["quantization"] == [(1, "A second answer about «quantization».")]
    assert [i for i, _ in hits["苹果"]] == [2]  # title and message
    assert [i for i, _ in hits["🍎"]] == [2] and [i for i, _ in hits["C++"]] == [2]
    assert [i for i, _ in hits["café"]] == [3]
    assert [i for i, _ in hits["shared answer"]] == [1]  # words in two sibling messages
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(chat_schema.MIGRATIONS)
        triggers = sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"))
        fts_sql = [r[0] for r in conn.execute(
            "SELECT sql FROM sqlite_master WHERE name IN ('messages_fts', 'conversations_fts')")]
    assert triggers == ["attachment_passages_ad", "attachment_passages_ai", "attachments_ad",
                        "conversations_ad", "conversations_ai", "conversations_au",
                        "message_attachments_ad", "messages_ad", "messages_ai", "messages_au"]
    assert len(fts_sql) == 2 and all("tokenize='trigram'" in sql for sql in fts_sql)


def test_snippet_cuts_long_text_around_the_first_hit() -> None:
    from storage.chat_text import snippet

    text = "start " + "filler " * 60 + "the Needle is here " + "tail " * 60
    out = snippet(text, ["needle"], ("[", "]"), limit=60)
    assert out.startswith("…") and out.endswith("…")
    assert "the [Needle] is here" in out and len(out) <= 60 + 2 + 2
    assert snippet("short text", ["zzz"], ("[", "]")) == "short text"


# -- deleting one message with its subtree (#10.11) ----------------------------------


def _chain(store: ChatStore, n: int) -> tuple[int, list[int]]:
    conv = store.create_conversation(title="chain")
    ids, parent = [], None
    for i in range(n):
        parent = store.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", f"m{i}").id
        ids.append(parent)
    return conv.id, ids


def test_a_conversation_with_a_branch_deeper_than_the_trigger_limit_deletes(store: ChatStore) -> None:
    cid, _ids = _chain(store, 1500)  # SQLite stops chained cascades at 1,000 levels
    store.delete_conversation(cid)
    assert store.list_conversations() == []


def test_delete_subtree_removes_a_message_and_its_replies_and_restores_them(store: ChatStore) -> None:
    cid, ids = _chain(store, 4)
    other = store.add_message(cid, ids[0], "assistant", "sibling reply")  # beside ids[1]
    store.set_active_leaf(cid, ids[3])
    removed = store.deletion.delete_subtree(ids[1])
    assert [m.id for m in removed] == ids[1:]
    assert [m.id for m in store.tree(cid)] == [ids[0], other.id]
    assert store.get_conversation(cid).active_leaf_id == other.id  # the remaining sibling's branch
    new_ids = store.deletion.restore_messages(removed, active_leaf_id=ids[3])
    path = store.active_path(cid)
    assert [m.content for m in path] == ["m0", "m1", "m2", "m3"]
    assert path[-1].id == new_ids[ids[3]] and path[1].parent_id == ids[0]


def test_deleting_the_shown_branch_continues_on_the_nearest_sibling_s_newest_leaf(store: ChatStore) -> None:
    cid, ids = _chain(store, 2)  # m0 -> m1
    first = store.add_message(cid, ids[0], "assistant", "first reply")  # siblings: m1, first, last
    below = store.add_message(cid, first.id, "user", "under the first")
    newest = store.add_message(cid, below.id, "assistant", "newest under the first")
    last = store.add_message(cid, ids[0], "assistant", "last reply")
    store.set_active_leaf(cid, last.id)
    store.deletion.delete_subtree(last.id)  # the one before it: "first", down to its newest leaf
    assert store.get_conversation(cid).active_leaf_id == newest.id
    store.set_active_leaf(cid, ids[1])
    store.deletion.delete_subtree(ids[1])  # the oldest: none before it, so the one after it
    assert store.get_conversation(cid).active_leaf_id == newest.id
    store.deletion.delete_subtree(first.id)  # no sibling left: the parent
    assert store.get_conversation(cid).active_leaf_id == ids[0]


def test_delete_subtree_of_a_deep_branch_is_not_recursive(store: ChatStore) -> None:
    cid, ids = _chain(store, 3000)
    removed = store.deletion.delete_subtree(ids[1])
    assert len(removed) == 2999 and [m.id for m in store.tree(cid)] == [ids[0]]
    store.deletion.restore_messages(removed, active_leaf_id=ids[-1])
    assert len(store.active_path(cid)) == 3000


def test_search_hit_names_the_message_and_the_word_spans(store: ChatStore) -> None:
    conv = store.create_conversation(title="Capitals")
    q = store.add_message(conv.id, None, "user", "What is the capital of Spain?")
    store.add_message(conv.id, q.id, "assistant", "Paris.")
    edited = store.add_message(conv.id, None, "user", "Is MADRID big? madrid!")
    (hit,) = store.search_hits("madrid")
    assert hit.message_id == edited.id
    assert [hit.snippet[a:b] for a, b in hit.spans] == ["MADRID", "madrid"]
    (title_only,) = store.search_hits("capitals")
    assert title_only.message_id is None and title_only.snippet == "Capitals"


def test_search_finds_text_in_either_unicode_normalization_form(store: ChatStore) -> None:
    """Text pasted from macOS is often decomposed (NFD: "e" + U+0301); a person types the
    composed form (NFC). Either finds the other, in titles and messages."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "Un café à Montréal")
    assert nfd != "Un café à Montréal"
    conv = store.create_conversation(title=nfd)
    store.add_message(conv.id, None, "user", "Le " + nfd.lower())
    other = store.create_conversation(title="Crème brûlée")  # composed
    for query in ("café", "é à", "Montréal", unicodedata.normalize("NFD", "montréal")):
        assert [h.conversation.id for h in store.search_hits(query)] == [conv.id], query
    assert [h.conversation.id for h in store.search_hits(unicodedata.normalize("NFD", "brûlée"))] == [other.id]
