"""The row queries every part of the chat store shares (the caller holds the lock, and a
transaction where it writes): a conversation or message by id, rows by a condition, a
message's children and its path from the root, copies of messages, and the errors for an
unknown id. The path is one recursive CTE (SQLite walks it iteratively), never a Python
recursion over the tree."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from storage.chat_records import (
    CONVERSATION_COLUMNS,
    MESSAGE_COLUMNS,
    MESSAGE_FIELDS,
    Conversation,
    Message,
    conversation_from_row,
    encode_token_ids,
    message_from_row,
)
from storage.errors import NotFoundError


def conversation(conn: sqlite3.Connection, conversation_id: int) -> Conversation:
    row = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        raise no_conversation(conversation_id)
    return conversation_from_row(row)


def conversations_where(
    conn: sqlite3.Connection, where: str, params: Iterable[Any]
) -> list[Conversation]:
    rows = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE {where}", tuple(params)
    ).fetchall()
    return [conversation_from_row(row) for row in rows]


def message(conn: sqlite3.Connection, message_id: int) -> Message:
    row = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
    ).fetchone()
    if row is None:
        raise no_message(message_id)
    return message_from_row(row)


def messages_where(
    conn: sqlite3.Connection, where: str, params: Iterable[Any], limit: int | None = None
) -> list[Message]:
    # Ids follow creation order: a new INTEGER PRIMARY KEY is above every existing id.
    tail = "" if limit is None else f" LIMIT {int(limit)}"
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY id{tail}", tuple(params)
    ).fetchall()
    return [message_from_row(row) for row in rows]


def children(
    conn: sqlite3.Connection, conversation_id: int, parent_id: int | None
) -> list[Message]:
    return messages_where(
        conn, "conversation_id = ? AND parent_id IS ?", (conversation_id, parent_id)
    )


def path_to(conn: sqlite3.Connection, message_id: int) -> list[Message]:
    rows = conn.execute(
        "WITH RECURSIVE up(id, parent_id, depth) AS ("
        "  SELECT id, parent_id, 0 FROM messages WHERE id = ?"
        "  UNION ALL"
        "  SELECT m.id, m.parent_id, up.depth + 1 FROM messages AS m JOIN up"
        "  ON m.id = up.parent_id"
        f") SELECT {', '.join('m.' + name for name in MESSAGE_FIELDS)}"
        " FROM up JOIN messages AS m ON m.id = up.id ORDER BY up.depth DESC",
        (message_id,),
    ).fetchall()
    if not rows:
        raise no_message(message_id)
    return [message_from_row(row) for row in rows]


def check_in_conversation(
    conn: sqlite3.Connection, message_id: int, conversation_id: int
) -> None:
    owner = message(conn, message_id).conversation_id
    if owner != conversation_id:
        raise ValueError(
            f"Message {message_id} belongs to conversation {owner}, "
            f"not to conversation {conversation_id}."
        )


def has_other_user_message(
    conn: sqlite3.Connection, conversation_id: int, message_id: int
) -> bool:
    row = conn.execute(
        "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' AND id != ?"
        " LIMIT 1",
        (conversation_id, message_id),
    ).fetchone()
    return row is not None


def insert_copy(conn: sqlite3.Connection, source: Conversation, title: str) -> int:
    now = time.time()
    cur = conn.execute(
        "INSERT INTO conversations (title, system_prompt, sampling_json, created_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?)",
        (title, source.system_prompt, json.dumps(source.sampling), now, now),
    )
    return cur.lastrowid


def copy_messages(
    conn: sqlite3.Connection, messages: list[Message], conversation_id: int,
    keep: dict[int | None, int | None] | None = None,
) -> dict[int, int]:
    """Insert copies of ``messages`` (parents first) into a conversation; map old id -> new id.
    ``keep`` maps parent ids outside ``messages`` to the parent their copies go under.
    Each copy links the same attached files as its source (``message_attachments`` rows:
    the one stored file, not a duplicate), so its prompt is the source's."""
    new_ids: dict[int, int] = dict(keep or {})
    for m in messages:
        cur = conn.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, token_ids,"
            " stats_json, status, model, created_at, reasoning, tool_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                None if m.parent_id is None else new_ids[m.parent_id],
                m.role,
                m.content,
                None if m.token_ids is None else encode_token_ids(m.token_ids),
                dumps(m.stats),
                "stopped" if m.status == "streaming" else m.status,
                m.model,
                m.created_at,
                m.reasoning,
                dumps(m.tool),  # as stored (an older row is copied, not refused)
            ),
        )
        new_ids[m.id] = cur.lastrowid
        conn.execute(
            "INSERT INTO message_attachments (message_id, position, sha256, name, passages_json)"
            " SELECT ?, position, sha256, name, passages_json FROM message_attachments"
            " WHERE message_id = ?",
            (cur.lastrowid, m.id),
        )
    for old_id in keep or {}:
        new_ids.pop(old_id, None)
    return new_ids


def delete_leaves_first(conn: sqlite3.Connection, ids: list[int]) -> None:
    """Delete the messages ``ids``, given children before parents (deepest first, or
    descending ids: a child's id is above its parent's): no row has children left when it goes, so
    ``ON DELETE CASCADE`` never chains into SQLite's trigger depth limit."""
    conn.executemany("DELETE FROM messages WHERE id = ?", ((i,) for i in ids))


def dumps(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


def tool_dumps(tool: dict[str, Any] | None) -> str | None:
    """A tool step's fields (``Message.tool``) as JSON for ``tool_json``.

    Raises:
        ValueError: a field holds a lone UTF-16 surrogate (``"\\ud800"`` without its pair): no
            character, which no export or prompt could carry; the message names the field.
    """
    if tool is None:
        return None
    for key, value in tool.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start:exc.end]
            raise ValueError(f"The tool step's '{key}' holds a lone UTF-16 surrogate (\\u{ord(bad[0]):04x}), "
                             "which is not text; replace it (U+FFFD) before storing the step.") from None
    return json.dumps(tool)


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}.")


def no_conversation(conversation_id: int) -> NotFoundError:
    return NotFoundError(
        f"There is no conversation with id {conversation_id} (it may have been deleted)."
    )


def no_message(message_id: int) -> NotFoundError:
    return NotFoundError(f"There is no message with id {message_id} (it may have been deleted).")
