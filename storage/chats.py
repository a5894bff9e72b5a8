"""The conversation tree in ``chats.sqlite3``.

A conversation is a tree of messages.
Siblings share a parent (``parent_id`` None for the roots); editing a message
or regenerating a reply adds a sibling. The conversation remembers its active
leaf; the messages shown are the path from a root to that leaf.

Durability: WAL mode with ``synchronous=NORMAL`` and one transaction per
change. A crash of the app loses nothing that was committed, so a streamed
reply loses at most the text since the last ``update_message``; a crash of
the operating system or a power cut may also roll back the last few commits
(never leaving a half-written one).

The records (``Conversation``, ``Message``) live in ``storage.chat_records``,
the schema and migrations in ``storage.chat_schema``, titles and search
queries in ``storage.chat_text``; all are importable from here.

Thread safety: one connection per ``ChatStore``, opened with
``check_same_thread=False`` and used under a lock, so the UI thread and a
worker thread may share a store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from storage.chat_records import (
    CONVERSATION_COLUMNS,
    DEFAULT_SAMPLING,
    DEFAULT_TITLE,
    MESSAGE_COLUMNS,
    MESSAGE_FIELDS,
    ROLES,
    STATUSES,
    Conversation,
    Message,
    checked_sampling,
    conversation_from_row,
    encode_token_ids,
    message_from_row,
)
from storage.chat_schema import migrate
from storage.chat_text import TITLE_LIMIT, auto_title, fts_query
from storage.errors import NotFoundError, StorageError, disk_full_as_storage_full

__all__ = [  # the records and helpers are re-exported so callers import from one place
    "DEFAULT_SAMPLING",
    "DEFAULT_TITLE",
    "ROLES",
    "STATUSES",
    "TITLE_LIMIT",
    "ChatStore",
    "Conversation",
    "Message",
    "auto_title",
    "fts_query",
]

_UNSET: Any = object()


class ChatStore:
    """Conversations and their message trees in one SQLite file.

    Opening creates the file and applies pending migrations
    (``storage.chat_schema``). Use as a context manager or call ``close()``.

    Raises (from any method):
        StorageFullError: the disk is full; the change was rolled back.
        StorageError: the file is not a Branchwise database, or is from a newer version.
    """

    def __init__(self, path: Path) -> None:
        """Open (or create) the database at ``path`` (usually ``<data dir>/chats.sqlite3``)."""
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = _open(self.path)

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one write transaction; commit on success, roll back on error."""
        with self._lock, disk_full_as_storage_full(str(self.path)):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # SQLite may already have rolled back
                    self._conn.execute("ROLLBACK")
                raise

    # -- conversations ------------------------------------------------------

    def create_conversation(
        self,
        title: str = DEFAULT_TITLE,
        system_prompt: str = "",
        sampling: dict[str, Any] | None = None,
    ) -> Conversation:
        """Create an empty conversation.

        ``sampling`` overrides some or all of DEFAULT_SAMPLING.

        Raises:
            ValueError: ``sampling`` has a key that is not in DEFAULT_SAMPLING.
        """
        settings = checked_sampling(sampling or {})
        now = time.time()
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO conversations (title, system_prompt, sampling_json, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, ?)",
                (title, system_prompt, json.dumps(settings), now, now),
            )
            return self._conversation(conn, cur.lastrowid)

    def get_conversation(self, conversation_id: int) -> Conversation:
        """Return the conversation. Raises NotFoundError if there is none with that id."""
        with self._lock:
            return self._conversation(self._conn, conversation_id)

    def list_conversations(self) -> list[Conversation]:
        """All conversations: pinned ones first, then most recently updated first."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations"
                " ORDER BY pinned DESC, updated_at DESC, id DESC"
            ).fetchall()
        return [conversation_from_row(row) for row in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        """Set the title (surrounding whitespace removed; blank means DEFAULT_TITLE).

        Raises NotFoundError for an unknown conversation.
        """
        self._set_conversation_field(conversation_id, "title", title.strip() or DEFAULT_TITLE)

    def set_pinned(self, conversation_id: int, pinned: bool) -> None:
        """Pin or unpin. Raises NotFoundError for an unknown conversation."""
        self._set_conversation_field(conversation_id, "pinned", int(bool(pinned)))

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        """Replace the system prompt. Raises NotFoundError for an unknown conversation."""
        self._set_conversation_field(conversation_id, "system_prompt", text)

    def set_sampling(self, conversation_id: int, sampling: dict[str, Any]) -> None:
        """Replace the sampling settings; keys left out take their DEFAULT_SAMPLING value.

        Raises:
            ValueError: a key is not in DEFAULT_SAMPLING.
            NotFoundError: unknown conversation.
        """
        settings = checked_sampling(sampling)
        self._set_conversation_field(conversation_id, "sampling_json", json.dumps(settings))

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete the conversation and all its messages. Raises NotFoundError if unknown."""
        with self._tx() as conn:
            cur = conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            if cur.rowcount == 0:
                raise _no_conversation(conversation_id)

    def duplicate_conversation(self, conversation_id: int) -> Conversation:
        """Copy a conversation with its whole tree and active leaf; the copy is not pinned.

        The copy is titled "<title> (copy)". Messages keep their content, token
        ids, stats and times; a message still marked "streaming" is copied as
        "stopped". Raises NotFoundError for an unknown conversation.
        """
        with self._tx() as conn:
            source = self._conversation(conn, conversation_id)
            messages = self._messages_where(conn, "conversation_id = ?", (conversation_id,))
            copy_id = self._insert_copy(conn, source, f"{source.title} (copy)")
            new_ids = self._copy_messages(conn, messages, copy_id)
            leaf = None if source.active_leaf_id is None else new_ids[source.active_leaf_id]
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, copy_id)
            )
            return self._conversation(conn, copy_id)

    def fork(self, message_id: int) -> Conversation:
        """Start a new conversation from the path root..``message_id``.

        Only that path is copied (not the other branches); the copy of the
        message becomes the active leaf. The new conversation is titled
        "Fork of <title>" and keeps the system prompt and sampling settings.
        Raises NotFoundError for an unknown message.
        """
        with self._tx() as conn:
            path = self._path_to(conn, message_id)
            source = self._conversation(conn, path[-1].conversation_id)
            fork_id = self._insert_copy(conn, source, f"Fork of {source.title}")
            new_ids = self._copy_messages(conn, path, fork_id)
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (new_ids[message_id], fork_id),
            )
            return self._conversation(conn, fork_id)

    # -- messages -------------------------------------------------------------

    def add_message(
        self,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        token_ids: Sequence[int] | None = None,
        stats: dict[str, Any] | None = None,
        status: str = "complete",
        model: str | None = None,
    ) -> Message:
        """Add a message under ``parent_id`` (None: a new root) and make it the active leaf.

        Bumps the conversation's ``updated_at``. If the conversation still has
        DEFAULT_TITLE and this is its first user message, the title becomes
        ``auto_title(content)``. ``token_ids`` are stored as int32.

        Raises:
            NotFoundError: unknown conversation or parent message.
            ValueError: the parent belongs to another conversation, a bad role
                or status, or a token id outside int32.
        """
        _check_choice("role", role, ROLES)
        _check_choice("status", status, STATUSES)
        blob = None if token_ids is None else encode_token_ids(token_ids)
        now = time.time()
        with self._tx() as conn:
            conversation = self._conversation(conn, conversation_id)
            if parent_id is not None:
                self._check_in_conversation(conn, parent_id, conversation_id)
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, token_ids,"
                " stats_json, status, model, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent_id, role, content, blob, _dumps(stats), status, model,
                 now),
            )
            message_id = cur.lastrowid
            title = conversation.title
            if role == "user" and title == DEFAULT_TITLE and not self._has_other_user_message(
                conn, conversation_id, message_id
            ):
                title = auto_title(content) or DEFAULT_TITLE
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ?, title = ?"
                " WHERE id = ?",
                (message_id, now, title, conversation_id),
            )
            return self._message(conn, message_id)

    def update_message(
        self,
        message_id: int,
        *,
        content: str = _UNSET,
        token_ids: Sequence[int] | None = _UNSET,
        stats: dict[str, Any] | None = _UNSET,
        status: str = _UNSET,
    ) -> None:
        """Change some fields of a message in one small transaction (one UPDATE).

        Meant to be called every few hundred milliseconds while a reply streams:
        only the fields passed are written, and ``content`` replaces the stored
        text (pass the whole reply so far). Passing None for ``token_ids`` or
        ``stats`` clears them.

        Raises:
            NotFoundError: unknown message.
            ValueError: a bad status or a token id outside int32.
        """
        fields: dict[str, Any] = {}
        if content is not _UNSET:
            fields["content"] = content
        if token_ids is not _UNSET:
            fields["token_ids"] = None if token_ids is None else encode_token_ids(token_ids)
        if stats is not _UNSET:
            fields["stats_json"] = _dumps(stats)
        if status is not _UNSET:
            _check_choice("status", status, STATUSES)
            fields["status"] = status
        if not fields:
            return
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE messages SET {assignments} WHERE id = ?", (*fields.values(), message_id)
            )
            if cur.rowcount == 0:
                raise _no_message(message_id)

    def mark_interrupted_streams(self) -> int:
        """Mark messages left "streaming" by a crash as "stopped"; return how many.

        Call once at startup, before any generation begins.
        """
        with self._tx() as conn:
            cur = conn.execute("UPDATE messages SET status = 'stopped' WHERE status = 'streaming'")
            return cur.rowcount

    def newest_unanswered_user_message(self, since: float) -> int | None:
        """The id of the newest user message created at or after ``since`` (Unix seconds)
        that has no reply, or None. Used to tell the user which message a crashed command
        kept."""
        with self._lock:
            row = self._conn.execute(
                "SELECT m.id FROM messages m WHERE m.role = 'user' AND m.created_at >= ? "
                "AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = m.id) "
                "ORDER BY m.created_at DESC, m.id DESC LIMIT 1", (since,)).fetchone()
        return row[0] if row else None

    def get_message(self, message_id: int) -> Message:
        """Return the message. Raises NotFoundError if there is none with that id."""
        with self._lock:
            return self._message(self._conn, message_id)

    def children(self, parent_id: int | None, conversation_id: int) -> list[Message]:
        """Children of ``parent_id`` (None: the roots) in creation order (by id).

        Raises:
            NotFoundError: unknown conversation or parent message.
            ValueError: the parent belongs to another conversation.
        """
        with self._lock:
            self._conversation(self._conn, conversation_id)
            if parent_id is not None:
                self._check_in_conversation(self._conn, parent_id, conversation_id)
            return self._children(self._conn, conversation_id, parent_id)

    def siblings(self, message_id: int) -> list[Message]:
        """The message and its siblings (same parent), in creation order.

        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            message = self._message(self._conn, message_id)
            return self._children(self._conn, message.conversation_id, message.parent_id)

    def path_to(self, message_id: int) -> list[Message]:
        """Messages from the root down to ``message_id`` (both included).

        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            return self._path_to(self._conn, message_id)

    def active_path(self, conversation_id: int) -> list[Message]:
        """The path root..active leaf ([] for an empty conversation).

        Raises NotFoundError for an unknown conversation.
        """
        with self._lock:
            leaf = self._conversation(self._conn, conversation_id).active_leaf_id
            return [] if leaf is None else self._path_to(self._conn, leaf)

    def set_active_leaf(self, conversation_id: int, message_id: int) -> None:
        """Show the branch ending at ``message_id``.

        Raises:
            NotFoundError: unknown conversation or message.
            ValueError: the message belongs to another conversation.
        """
        with self._tx() as conn:
            self._conversation(conn, conversation_id)
            self._check_in_conversation(conn, message_id, conversation_id)
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (message_id, conversation_id),
            )

    def deepest_leaf(self, message_id: int) -> Message:
        """Follow the most recently created child from ``message_id`` down to a leaf.

        Used when switching to a sibling: the path shown continues to that
        branch's latest leaf. Returns the message itself if it has no children.
        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            message = self._message(self._conn, message_id)
            while True:
                row = self._conn.execute(
                    "SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1",
                    (message.id,),
                ).fetchone()
                if row is None:
                    return message
                message = self._message(self._conn, row[0])

    def tree(self, conversation_id: int) -> list[Message]:
        """Every message of the conversation in creation order (parents before children).

        Raises NotFoundError for an unknown conversation.
        """
        with self._lock:
            self._conversation(self._conn, conversation_id)
            return self._messages_where(self._conn, "conversation_id = ?", (conversation_id,))

    # -- search -------------------------------------------------------------

    def search(
        self, query: str, limit: int = 50, marks: tuple[str, str] = ("«", "»")
    ) -> list[tuple[Conversation, str]]:
        """Find conversations by title words and by message text.

        ``query`` is what a person typed (see ``fts_query``: never a syntax
        error; the last word matches as a prefix). Returns up to ``limit``
        (conversation, snippet) pairs: conversations whose title matches
        first, then those whose messages match, each group best match first.
        The snippet is an excerpt of the best matching message (or the title
        if only the title matches) with matched words between ``marks``.
        """
        match = fts_query(query)
        if not match or limit <= 0:
            return []
        open_mark, close_mark = marks
        with self._lock:
            titles = dict(  # conversation id -> highlighted title, best first
                self._conn.execute(
                    "SELECT rowid, highlight(conversations_fts, 0, ?, ?) FROM conversations_fts"
                    " WHERE conversations_fts MATCH ? ORDER BY rank LIMIT ?",
                    (open_mark, close_mark, match, limit),
                ).fetchall()
            )
            best = self._best_message_hits(match, limit, found=set(titles))
            snippets = dict(
                self._conn.execute(
                    "SELECT rowid, snippet(messages_fts, 0, ?, ?, '…', 12) FROM messages_fts"
                    f" WHERE messages_fts MATCH ? AND rowid IN ({', '.join('?' * len(best))})",
                    (open_mark, close_mark, match, *best.values()),
                ).fetchall()
            )
            ids = [*titles, *(c for c in best if c not in titles)][:limit]
            conversations = {
                c.id: c
                for c in self._conversations_where(
                    self._conn, f"id IN ({', '.join('?' * len(ids))})", ids
                )
            }
        return [
            (conversations[i], snippets[best[i]] if i in best else titles[i]) for i in ids
        ]

    def _best_message_hits(self, match: str, limit: int, found: set[int]) -> dict[int, int]:
        """Map conversation id -> id of its best matching message, best first.

        Stops reading hits once ``found`` plus the conversations seen reach ``limit``.
        """
        best: dict[int, int] = {}
        with closing(
            self._conn.execute(
                "SELECT m.conversation_id, m.id FROM messages_fts"
                " JOIN messages AS m ON m.id = messages_fts.rowid"
                " WHERE messages_fts MATCH ? ORDER BY messages_fts.rank",
                (match,),
            )
        ) as hits:
            for conversation_id, message_id in hits:
                if len(found) >= limit:
                    break
                if conversation_id not in best:
                    best[conversation_id] = message_id
                    found.add(conversation_id)
        return best

    # -- helpers (caller holds the lock) ------------------------------------

    def _set_conversation_field(self, conversation_id: int, column: str, value: Any) -> None:
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conversation_id)
            )
            if cur.rowcount == 0:
                raise _no_conversation(conversation_id)

    @staticmethod
    def _conversation(conn: sqlite3.Connection, conversation_id: int) -> Conversation:
        row = conn.execute(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise _no_conversation(conversation_id)
        return conversation_from_row(row)

    @staticmethod
    def _conversations_where(
        conn: sqlite3.Connection, where: str, params: Iterable[Any]
    ) -> list[Conversation]:
        rows = conn.execute(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE {where}", tuple(params)
        ).fetchall()
        return [conversation_from_row(row) for row in rows]

    @staticmethod
    def _message(conn: sqlite3.Connection, message_id: int) -> Message:
        row = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        if row is None:
            raise _no_message(message_id)
        return message_from_row(row)

    @staticmethod
    def _messages_where(
        conn: sqlite3.Connection, where: str, params: Iterable[Any]
    ) -> list[Message]:
        # Ids follow creation order: a new INTEGER PRIMARY KEY is above every existing id.
        rows = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY id", tuple(params)
        ).fetchall()
        return [message_from_row(row) for row in rows]

    def _children(
        self, conn: sqlite3.Connection, conversation_id: int, parent_id: int | None
    ) -> list[Message]:
        return self._messages_where(
            conn, "conversation_id = ? AND parent_id IS ?", (conversation_id, parent_id)
        )

    def _path_to(self, conn: sqlite3.Connection, message_id: int) -> list[Message]:
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
            raise _no_message(message_id)
        return [message_from_row(row) for row in rows]

    def _check_in_conversation(
        self, conn: sqlite3.Connection, message_id: int, conversation_id: int
    ) -> None:
        owner = self._message(conn, message_id).conversation_id
        if owner != conversation_id:
            raise ValueError(
                f"Message {message_id} belongs to conversation {owner}, "
                f"not to conversation {conversation_id}."
            )

    @staticmethod
    def _has_other_user_message(
        conn: sqlite3.Connection, conversation_id: int, message_id: int
    ) -> bool:
        row = conn.execute(
            "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' AND id != ?"
            " LIMIT 1",
            (conversation_id, message_id),
        ).fetchone()
        return row is not None

    @staticmethod
    def _insert_copy(conn: sqlite3.Connection, source: Conversation, title: str) -> int:
        now = time.time()
        cur = conn.execute(
            "INSERT INTO conversations (title, system_prompt, sampling_json, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?)",
            (title, source.system_prompt, json.dumps(source.sampling), now, now),
        )
        return cur.lastrowid

    @staticmethod
    def _copy_messages(
        conn: sqlite3.Connection, messages: list[Message], conversation_id: int
    ) -> dict[int, int]:
        """Insert copies of ``messages`` (parents first) into a conversation; map old id -> new id."""
        new_ids: dict[int, int] = {}
        for m in messages:
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, token_ids,"
                " stats_json, status, model, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    None if m.parent_id is None else new_ids[m.parent_id],
                    m.role,
                    m.content,
                    None if m.token_ids is None else encode_token_ids(m.token_ids),
                    _dumps(m.stats),
                    "stopped" if m.status == "streaming" else m.status,
                    m.model,
                    m.created_at,
                ),
            )
            new_ids[m.id] = cur.lastrowid
        return new_ids


# -- opening and validation -----------------------------------


def _open(path: Path) -> sqlite3.Connection:
    """Connect in autocommit mode (transactions are explicit), set pragmas, migrate."""
    conn: sqlite3.Connection | None = None
    try:
        with disk_full_as_storage_full(str(path)):
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, str(path))
            return conn
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.OperationalError):  # cannot open, locked, permission denied
            raise StorageError(f"Branchwise cannot open its chat database {path}: {exc}.") from exc
        raise StorageError(  # not a database, or a damaged one
            f"{path} is not a readable Branchwise chat database ({exc}). "
            "Move the file aside to start with an empty history."
        ) from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise



def _dumps(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}.")


def _no_conversation(conversation_id: int) -> NotFoundError:
    return NotFoundError(
        f"There is no conversation with id {conversation_id} (it may have been deleted)."
    )


def _no_message(message_id: int) -> NotFoundError:
    return NotFoundError(f"There is no message with id {message_id} (it may have been deleted).")
