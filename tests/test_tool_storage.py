"""Tool steps in the tree (migration 7): an assistant's ``tool_calls`` and ``role: "tool"``
results are stored, rendered to the engine as tool messages, copied by a fork, and kept by
the Branchwise export and import."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from app.session import ConversationSession
from storage import chat_schema
from storage.chats import ChatStore
from storage.importers.branchwise import conversation_json

CALL = {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"hi\"}"}}
RESULT = {"tool_call_id": "call_1", "name": "echo", "server": "testing", "arguments": "{\"text\": \"hi\"}",
          "duration_ms": 12.5, "error": None, "cut_bytes": 0}


@pytest.fixture
def store(tmp_path: Path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def _loop(store: ChatStore) -> tuple[int, list[int]]:
    c = store.create_conversation(title="Echo")
    q = store.add_message(c.id, None, "user", "Echo hi.")
    a = store.add_message(c.id, q.id, "assistant", "", tool={"tool_calls": [CALL]})
    t = store.add_message(c.id, a.id, "tool", "echo: hi", tool=RESULT)
    f = store.add_message(c.id, t.id, "assistant", "It said hi.", token_ids=[5, 6])
    return c.id, [q.id, a.id, t.id, f.id]


def test_tool_steps_are_stored_and_rendered_as_tool_messages(store: ChatStore) -> None:
    cid, (q, a, t, f) = _loop(store)
    assert store.get_message(a).tool == {"tool_calls": [CALL]} and store.get_message(t).tool == RESULT
    assert store.get_message(t).role == "tool" and store.get_message(q).tool is None
    prompt = ConversationSession(store).prompt(t)
    assert [(m.role, m.content) for m in prompt] == [("user", "Echo hi."), ("assistant", ""), ("tool", "echo: hi")]
    assert prompt[1].tool_calls == (CALL,) and prompt[1].token_ids is None
    assert (prompt[2].tool_call_id, prompt[2].name) == ("call_1", "echo")
    store.update_message(t, tool={**RESULT, "error": "late"})
    assert store.get_message(t).tool["error"] == "late"


def test_a_fork_at_the_tool_step_keeps_it(store: ChatStore) -> None:
    _cid, (_q, _a, t, _f) = _loop(store)
    conv = ConversationSession(store).fork(t)
    path = store.active_path(conv.id)
    assert [m.role for m in path] == ["user", "assistant", "tool"] and path[-1].tool == RESULT


def test_branchwise_export_and_import_keep_the_tool_steps(store: ChatStore, tmp_path: Path) -> None:
    from storage.importers import import_files

    cid, _ids = _loop(store)
    data = conversation_json(store, cid)
    assert [m.get("tool") for m in data["messages"]] == [None, {"tool_calls": [CALL]}, RESULT, None]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(data))
    other = tmp_path / "other.sqlite3"
    import_files([path], other)
    with ChatStore(other) as chats:
        (conv,) = chats.list_conversations()
        got = [(m.role, m.content, m.tool) for m in chats.active_path(conv.id)]
    assert got == [("user", "Echo hi.", None), ("assistant", "", {"tool_calls": [CALL]}),
                   ("tool", "echo: hi", RESULT), ("assistant", "It said hi.", None)]


def test_migration_7_widens_the_role_check_of_an_existing_file(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "chats.sqlite3"
    shipped = list(chat_schema.MIGRATIONS)
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped[:6])  # schema 6: before tool steps
    with ChatStore(db) as chats:
        c = chats.create_conversation(title="Old")
    with closing(sqlite3.connect(db)) as conn:  # a message as schema 6 stored it
        with conn:
            q = conn.execute("INSERT INTO messages (conversation_id, role, content, created_at)"
                             " VALUES (?, 'user', 'Hello', 0)", (c.id,)).lastrowid
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO messages (conversation_id, role, content, created_at)"
                         " VALUES (?, 'tool', '', 0)", (c.id,))
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped)
    with ChatStore(db) as chats:
        t = chats.add_message(c.id, q, "tool", "result", tool=RESULT)
        assert chats.get_message(t.id).tool == RESULT and chats.get_message(q).content == "Hello"
        assert chats.get_message(q).tool is None
        assert [h.message_id for h in chats.search_hits("Hello")] == [q]
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(shipped)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (?, 'robot', '', 0)",
                         (c.id,))


def test_a_lone_surrogate_in_a_tool_step_is_refused_by_the_store(store: ChatStore) -> None:
    c = store.create_conversation(title="Echo")
    q = store.add_message(c.id, None, "user", "Echo hi.")
    with pytest.raises(ValueError, match=r"The tool step's 'arguments' holds a lone UTF-16 surrogate \(\\ud800\)"):
        store.add_message(c.id, q.id, "tool", "echo", tool={**RESULT, "arguments": '{"text": "\ud800"}'})
    assert [m.id for m in store.tree(c.id)] == [q.id]  # nothing stored
    a = store.add_message(c.id, q.id, "assistant", "", tool={"tool_calls": [CALL]})
    bad = {**CALL, "function": {"name": "echo\udc00", "arguments": "{}"}}
    with pytest.raises(ValueError, match="'tool_calls' holds a lone UTF-16 surrogate"):
        store.update_message(a.id, tool={"tool_calls": [bad]})
    assert store.get_message(a.id).tool == {"tool_calls": [CALL]}


def test_a_tool_result_with_a_lone_surrogate_reaches_the_model_as_text() -> None:
    from types import SimpleNamespace

    from app.session.mcp_servers import result_text

    result = SimpleNamespace(content=[SimpleNamespace(type="text", text="ok \ud800 done")])
    assert result_text(result) == "ok \ufffd done"
