"""Store checked conversations in ``chats.sqlite3``, batched, inside the caller's transaction.

The caller (``storage.importers.run``) opens one write transaction per file
(``BEGIN IMMEDIATE``), so no other writer can add rows meanwhile; that lets the
writer hand out ids itself (one above the highest in use, in the planned
order, which keeps siblings in creation order) and insert conversations and
messages with multi-row INSERTs, flushed every ``BATCH_ROWS`` messages. Foreign keys are
checked at COMMIT (``PRAGMA defer_foreign_keys``), so a conversation's active
leaf can be written in the same batch as its messages. Messages go through
the ``messages`` table, so the FTS5 triggers index them at once.

Re-import: a conversation is found again by ``conversations.source``
("<format>:<id in the export>"), its messages by ``messages.source_id``; only
messages not seen before are added (a conversation that grew in the source
app gets its new turns and branches), nothing is ever added twice.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Final

from storage.attachments import import_exported
from storage.chat_records import DEFAULT_TITLE, ROLES, STATUSES, checked_sampling, encode_token_ids
from storage.chat_text import auto_title
from storage.importers.records import FileReport, ImportFileError, ImportFormat, SourceConversation
from storage.importers.tree import Plan
from storage.reasoning_quotes import split_reasoning_quotes

BATCH_ROWS: Final = 2000
"""Message rows buffered before they are written (with the conversations they belong to)."""

ROWS_PER_STATEMENT: Final = 80
"""Rows per multi-row ``INSERT … VALUES (…), (…)``: 80 × 12 columns stays under SQLite's
oldest limit of 999 bound variables. Measured on 20,000 messages (2 busy cores): about three
times faster than ``executemany`` of one-row INSERTs, whose per-statement overhead dominates."""

_CONVERSATION_INSERT = (
    "INSERT INTO conversations (id, title, system_prompt, sampling_json, active_leaf_id, pinned,"
    " created_at, updated_at, source) VALUES "
)
_MESSAGE_INSERT = (
    "INSERT INTO messages (id, conversation_id, parent_id, role, content, token_ids, stats_json,"
    " status, model, created_at, source_id, reasoning, tool_json) VALUES "
)


class Writer:
    """Adds conversations to an open transaction on ``conn``; counts into ``report``."""

    def __init__(self, conn: sqlite3.Connection, fmt: ImportFormat, report: FileReport) -> None:
        self.conn = conn
        self.fmt = fmt
        self.report = report
        conn.execute("PRAGMA defer_foreign_keys = ON")  # reset at COMMIT/ROLLBACK
        self._next_conversation = _next_id(conn, "conversations")
        self._next_message = _next_id(conn, "messages")
        self._conversations: list[tuple] = []
        self._messages: list[tuple] = []
        self._updates: list[tuple] = []
        self._attachments: list[tuple[int, str, list]] = []  # (message id, source id, exported files)
        self._seen: set[str] = set()
        self._now = time.time()

    def add(self, conv: SourceConversation, plan: Plan) -> int:
        """Add ``conv`` (checked as ``plan``); return how many messages were added.

        Raises:
            ImportFileError: a value the database cannot hold (an unknown role,
                sampling setting or a token id outside int32).
        """
        source = f"{self.fmt}:{conv.source_id}"
        if source in self._seen:
            raise ImportFileError(f"the conversation id {conv.source_id!r} appears twice in the file")
        self._seen.add(source)
        existing = self._existing(source, conv)
        if existing is not None and existing[1] is None:  # made in this database, not imported
            self.report.conversations_unchanged += 1
            return 0
        known: dict[str, int] = {} if existing is None else existing[1]
        new = [pm for pm in plan.messages if pm.source_id not in known]
        if existing is not None and not new:
            self.report.conversations_unchanged += 1
            return 0

        conv_id = existing[0] if existing is not None else self._take_conversation_id()
        ids = dict(known)
        for pm in new:
            ids[pm.source_id] = self._take_message_id()
        created = _time(conv.created_at, None, self._now)
        times: dict[str, float] = {}
        latest = created
        for pm in plan.messages:
            parent_time = times.get(pm.parent) if pm.parent is not None else None
            times[pm.source_id] = _time(pm.created_at, parent_time, created)
            latest = max(latest, times[pm.source_id])
        for pm in new:
            if pm.role not in ROLES:
                raise ImportFileError(f"message {pm.source_id!r} has an unknown role {pm.role!r}")
            self._messages.append(self._message_row(pm, conv_id, ids, times[pm.source_id]))
            if (pm.extra or {}).get("attachments"):
                self._attachments.append((ids[pm.source_id], pm.source_id, pm.extra["attachments"]))
        leaf = None if plan.current is None else ids[plan.current]
        updated = _time(conv.updated_at, None, latest)
        if existing is None:
            title = conv.title.strip() or _first_user_title(plan) or DEFAULT_TITLE
            try:
                sampling = checked_sampling(conv.sampling or {})
            except ValueError as exc:
                raise ImportFileError(str(exc)) from exc
            self._conversations.append((conv_id, title, plan.system_prompt, json.dumps(sampling), leaf,
                                        int(conv.pinned), created, updated, source))
            self.report.conversations_added += 1
            self.report.branches += plan.leaves
        else:
            self._updates.append((leaf, max(updated, latest), conv_id))
            self.report.conversations_updated += 1
        self.report.messages += len(new)
        self.report.conversation_ids.append(conv_id)
        if len(self._messages) >= BATCH_ROWS:
            self.flush()
        return len(new)

    def flush(self) -> None:
        """Write the buffered rows (conversations first, then messages, then leaf updates)."""
        _insert_rows(self.conn, _CONVERSATION_INSERT, self._conversations)
        _insert_rows(self.conn, _MESSAGE_INSERT, self._messages)
        if self._updates:
            self.conn.executemany(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?", self._updates)
        for message_id, source_id, files in self._attachments:
            try:
                import_exported(self.conn, message_id, files)
            except ValueError as exc:
                raise ImportFileError(f"message {source_id!r}: {exc}") from exc
        self._conversations, self._messages, self._updates, self._attachments = [], [], [], []

    # -- helpers ------------------------------------------------------------------------

    def _existing(self, source: str, conv: SourceConversation) -> tuple[int, dict[str, int] | None] | None:
        """(id, known message ids) of an earlier import; (id, None) for Branchwise's own original."""
        row = self.conn.execute("SELECT id FROM conversations WHERE source = ?", (source,)).fetchone()
        if row is not None:
            known = dict(self.conn.execute(
                "SELECT source_id, id FROM messages WHERE conversation_id = ? AND source_id IS NOT NULL",
                (row[0],)))
            return row[0], known
        if self.fmt == ImportFormat.BRANCHWISE and conv.created_at is not None:
            # Restoring a backup into the database it came from: the original is still here.
            local_id = conv.source_id.rsplit("@", 1)[0]
            row = self.conn.execute(
                "SELECT id FROM conversations WHERE id = ? AND created_at = ? AND source IS NULL",
                (int(local_id) if local_id.isdigit() else -1, conv.created_at)).fetchone()
            if row is not None:
                return row[0], None
        return None

    def _message_row(self, pm, conv_id: int, ids: dict[str, int], created: float) -> tuple:
        extra: dict[str, Any] = pm.extra or {}
        token_ids = extra.get("token_ids")
        try:
            blob = None if token_ids is None else encode_token_ids(token_ids)
        except (ValueError, TypeError) as exc:
            raise ImportFileError(f"message {pm.source_id!r}: token_ids are not 32-bit integers") from exc
        stats = extra.get("stats")
        status = extra.get("status") or "complete"
        if status not in STATUSES:
            raise ImportFileError(f"message {pm.source_id!r} has an unknown status {status!r}")
        if status == "streaming":  # cut short in the app that exported it
            status = "stopped"
        content, thought = pm.content, extra.get("reasoning")
        if pm.role == "assistant" and "reasoning" not in extra:  # the readers quote it in the text
            thought, content = split_reasoning_quotes(content)
        return (ids[pm.source_id], conv_id, None if pm.parent is None else ids[pm.parent], pm.role,
                content, blob, None if stats is None else json.dumps(stats), status, pm.model,
                created, pm.source_id, thought if isinstance(thought, str) else None,
                json.dumps(extra["tool"]) if isinstance(extra.get("tool"), dict) else None)

    def _take_conversation_id(self) -> int:
        self._next_conversation += 1
        return self._next_conversation - 1

    def _take_message_id(self) -> int:
        self._next_message += 1
        return self._next_message - 1


def _insert_rows(conn: sqlite3.Connection, insert: str, rows: list[tuple]) -> None:
    """Run ``insert`` ("INSERT INTO t (cols) VALUES ") over ``rows``, ROWS_PER_STATEMENT at a time."""
    if not rows:
        return
    one = "(" + ", ".join("?" * len(rows[0])) + ")"
    full = insert + ", ".join([one] * ROWS_PER_STATEMENT)
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start:start + ROWS_PER_STATEMENT]
        sql = full if len(chunk) == ROWS_PER_STATEMENT else insert + ", ".join([one] * len(chunk))
        conn.execute(sql, [value for row in chunk for value in row])


def _next_id(conn: sqlite3.Connection, table: str) -> int:
    return conn.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}").fetchone()[0]


def _time(value: float | None, parent: float | None, fallback: float) -> float:
    if value is not None:
        return float(value)
    return parent if parent is not None else fallback


def _first_user_title(plan: Plan) -> str:
    first = next((pm for pm in plan.messages if pm.role == "user" and pm.content.strip()), None)
    return auto_title(first.content) if first else ""
