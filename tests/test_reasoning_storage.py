"""A reply's reasoning is stored beside its answer (schema 4): kept by copies and undo,
moved out of the text of earlier imports, exported, and searched."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from app.session.markdown_export import conversation_markdown
from storage.importers.branchwise import conversation_json
from storage import chat_schema
from storage.chats import ChatStore
from storage.reasoning_quotes import split_reasoning_quotes


@pytest.fixture
def store(tmp_path: Path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _reply(store: ChatStore, reasoning: str | None = "First I add two and two.") -> tuple[int, int]:
    c = store.create_conversation(title="Sums")
    q = store.add_message(c.id, None, "user", "What is 2+2?")
    a = store.add_message(c.id, q.id, "assistant", "It is 4.", token_ids=[1, 2, 3], reasoning=reasoning)
    return c.id, a.id


def test_reasoning_is_stored_updated_and_copied(store: ChatStore) -> None:
    cid, aid = _reply(store)
    m = store.get_message(aid)
    assert (m.content, m.reasoning) == ("It is 4.", "First I add two and two.")
    store.update_message(aid, reasoning="Changed.")
    assert store.get_message(aid).reasoning == "Changed."
    copy = store.copies.duplicate_conversation(cid)
    assert [m.reasoning for m in store.active_path(copy.id)] == [None, "Changed."]
    removed = store.deletion.delete_subtree(aid)
    store.deletion.restore_messages(removed, active_leaf_id=aid)
    assert store.active_path(cid)[-1].reasoning == "Changed."
    assert store.get_message(store.active_path(cid)[0].id).reasoning is None  # a user message: none


def test_search_finds_words_in_reasoning_and_marks_them(store: ChatStore) -> None:
    cid, _ = _reply(store)
    (hit,) = store.search_hits("add two")
    assert hit.conversation.id == cid and hit.in_reasoning
    assert [hit.snippet[a:b] for a, b in hit.spans] == ["add", "two", "two"]
    (hit,) = store.search_hits("is 4")
    assert not hit.in_reasoning and hit.snippet == "It is 4."
    (short,) = store.search_hits("I")  # under three characters: the scan covers reasoning too
    assert short.conversation.id == cid


def test_export_json_has_the_field_and_markdown_a_reasoning_quote(store: ChatStore) -> None:
    cid, aid = _reply(store, "Think `hard`.\n\nThen answer.")
    data = conversation_json(store, cid)
    by_id = {m["id"]: m for m in data["messages"]}
    assert by_id[aid]["reasoning"] == "Think `hard`.\n\nThen answer." and by_id[aid]["content"] == "It is 4."
    md = conversation_markdown(data)
    assert "> **Reasoning**\n>\n> ```text\n> Think `hard`.\n>\n> Then answer.\n> ```\n\n```markdown\nIt is 4.\n```" in md


def test_split_reasoning_quotes() -> None:
    text = "> **Reasoning**\n>\n> Line one.\n>\n> Line two.\n\nThe answer.\n\n> a plain quote"
    assert split_reasoning_quotes(text) == ("Line one.\n\nLine two.", "The answer.\n\n> a plain quote")
    for plain in ("Just text.", "> **Bold** in a quote\n> no blank line\n\nAnswer", ""):
        assert split_reasoning_quotes(plain) == (None, plain)


def test_migration_moves_the_quotes_of_earlier_imports_into_the_field(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "chats.sqlite3"
    shipped = list(chat_schema.MIGRATIONS)
    before = shipped[:shipped.index(chat_schema._migration_reasoning)]
    monkeypatch.setattr(chat_schema, "MIGRATIONS", before)  # schema 3: before the reasoning column
    quoted = "> **Reasoning**\n>\n> Broth first.\n\nStart with the broth."
    own = "> **Reasoning**\n>\n> Noodles.\n\nBuy noodles."
    with ChatStore(db) as chats:
        c = chats.create_conversation(title="Ramen")
        rows = [(c.id, None, "user", "How?", "u1"), (c.id, 1, "assistant", quoted, "a1"),
                (c.id, 1, "assistant", own, None)]  # made in Branchwise: its text is left alone
    with closing(sqlite3.connect(db)) as conn, conn:  # rows as an importer of schema 3 left them
        conn.executemany("INSERT INTO messages (conversation_id, parent_id, role, content, source_id,"
                         " created_at) VALUES (?, ?, ?, ?, ?, 0)", rows)
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped)
    with ChatStore(db) as chats:
        got = [(m.content, m.reasoning) for m in chats.tree(c.id)]
        assert [h.in_reasoning for h in chats.search_hits("broth first")] == [True]
    assert got == [("How?", None), ("Start with the broth.", "Broth first."), (own, None)]
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(shipped)
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0]
    assert '"content", "reasoning"' in sql and "tokenize='trigram'" in sql


def test_branchwise_json_round_trip_keeps_reasoning(store: ChatStore, tmp_path: Path) -> None:
    import json

    from storage.importers import import_files

    cid, _ = _reply(store)
    data = conversation_json(store, cid)
    path = tmp_path / "export.json"
    path.write_text(json.dumps(data))
    other = tmp_path / "other.sqlite3"
    import_files([path], other)
    with ChatStore(other) as chats:
        (conv,) = chats.list_conversations()
        assert [(m.content, m.reasoning) for m in chats.active_path(conv.id)] == [
            ("What is 2+2?", None), ("It is 4.", "First I add two and two.")]


def test_serve_protocol_takes_and_returns_reasoning_content() -> None:
    from app.serve import protocol
    from engine.core import GenerationStats

    req = protocol.parse_chat_request({"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Add them."},
        {"role": "user", "content": "And 3+3?"}]})
    assert [(m.role, m.content, m.reasoning) for m in req.messages] == [
        ("user", "2+2?", None), ("assistant", "4.", "Add them."), ("user", "And 3+3?", None)]
    with pytest.raises(protocol.ApiError, match="reasoning_content"):
        protocol.parse_chat_request({"messages": [{"role": "user", "content": "x", "reasoning_content": "y"}]})
    body = protocol.completion("c1", "m", "6.", "stop", GenerationStats(), "Add three and three.")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "6.",
                                             "reasoning_content": "Add three and three."}
    assert "reasoning_content" not in protocol.completion("c1", "m", "6.", "stop", GenerationStats())["choices"][0]["message"]
