"""Every chat remembers its model (issue #23): ``ChatStore.models`` and migration 6."""

from __future__ import annotations

import sqlite3

import pytest

from storage import chat_schema
from storage.chats import ChatStore
from storage.chats.chat_models import ChatModel
from storage.errors import NotFoundError


def test_a_conversation_remembers_the_model_it_last_ran_on(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        a, b = store.create_conversation("a"), store.create_conversation("b")
        assert store.models.of(a.id) is None
        before = store.get_conversation(a.id).updated_at
        store.models.remember(a.id, "/m/one.gguf", "one")
        store.models.remember(a.id, "/m/two.gguf", "two")
        store.models.remember(b.id, None, "SmolLM2-135M-Instruct.Q4_1")
        assert store.models.of(a.id) == ChatModel("/m/two.gguf", "two")
        assert store.models.of(b.id) == ChatModel("", "SmolLM2-135M-Instruct.Q4_1")
        assert store.get_conversation(a.id).updated_at == before  # the list's order is activity only
        with pytest.raises(NotFoundError):
            store.models.remember(999, "/x.gguf", "x")
        assert store.models.of(999) is None
    with ChatStore(tmp_path / "chats.sqlite3") as again:
        assert again.models.of(a.id) == ChatModel("/m/two.gguf", "two")


def test_migration_6_adds_the_columns_and_keeps_every_message(tmp_path, monkeypatch):
    path = tmp_path / "chats.sqlite3"
    shipped = chat_schema.MIGRATIONS
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped[:5])  # a database of schema 5
    with ChatStore(path) as old:
        cid = old.create_conversation("kept").id
    with sqlite3.connect(path) as conn:  # a message as schema 5 stored it (the store now writes tool_json)
        mid = conn.execute("INSERT INTO messages (conversation_id, role, content, created_at)"
                           " VALUES (?, 'user', 'hello', 0)", (cid,)).lastrowid
        conn.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (mid, cid))
    conn.close()
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped)
    with ChatStore(path) as store:
        assert [m.content for m in store.active_path(cid)] == ["hello"]
        assert store.models.of(cid) is None
        store.models.remember(cid, "/m.gguf", "m")
        assert store.models.of(cid).name == "m"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(shipped) == 8  # 7: tool steps, 8: ids kept
    conn.close()
