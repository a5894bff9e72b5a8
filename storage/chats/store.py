"""The conversation tree in ``chats.sqlite3``: :class:`ChatStore`.

A conversation is a tree of messages.
Siblings share a parent (``parent_id`` None for the roots); editing a message
or regenerating a reply adds a sibling. The conversation remembers its active
leaf; the messages shown are the path from a root to that leaf.

Durability: WAL mode with ``synchronous=NORMAL`` and one transaction per
change. A crash of the app loses nothing that was committed, so a streamed
reply loses at most the text since the last ``update_message``; a crash of
the operating system or a power cut may also roll back the last few commits
(never leaving a half-written one).

The store is one class and four parts, each in its module of ``storage/chats/``:

* ``ChatStore`` (here): conversations and their settings, adding and updating messages,
  reading messages, the active path and the whole tree; search and deleting a
  conversation are delegated to their parts;
* ``store.branches`` (:mod:`storage.chats.tree`): children, siblings, paths, leaves;
* ``store.copies`` (:mod:`storage.chats.copies`): duplicate and fork;
* ``store.deletion`` (:mod:`storage.chats.deletion`): a subtree and Undo's way back,
  scrubbing the search index and the WAL;
* ``store.models`` (:mod:`storage.chats.chat_models`): the model each chat last ran on;
* search (:mod:`storage.chats.search`) and the shared connection
  (:mod:`storage.chats.connection`) and row queries (:mod:`storage.chats.queries`).

The records (``Conversation``, ``Message``) live in ``storage.chat_records``,
the schema and migrations in ``storage.chat_schema``, titles and search
queries in ``storage.chat_text``; all are importable from ``storage.chats``.

Thread safety: one connection per ``ChatStore``, opened with
``check_same_thread=False`` and used under a lock, so the UI thread and a
worker thread (and the parts) share a store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storage.chat_records import (
    DEFAULT_TITLE,
    ROLES,
    STATUSES,
    CONVERSATION_COLUMNS,
    Conversation,
    Message,
    checked_sampling,
    conversation_from_row,
    encode_token_ids,
)
from storage.chat_text import auto_title
from storage.chats import queries
from storage.chats.connection import ChatDatabase, Part
from storage.chats.chat_models import ChatModels
from storage.chats.copies import Copies
from storage.chats.deletion import Deletion
from storage.chats.live_streams import LiveStreams
from storage.chats.search import Search, SearchHit
from storage.chats.tree import Branches

_UNSET: Any = object()


class ChatStore(Part):
    """Conversations and their message trees in one SQLite file.

    Opening creates the file and applies pending migrations
    (``storage.chat_schema``). Use as a context manager or call ``close()``.
    The tree's paths, copies and deletion are parts: ``branches``, ``copies``,
    ``deletion`` (see the module docstring).

    Raises (from any method):
        StorageFullError: the disk is full; the change was rolled back.
        StorageError: the file is not a Branchwise database, or is from a newer version.
    """

    def __init__(self, path: Path) -> None:
        """Open (or create) the database at ``path`` (usually ``<data dir>/chats.sqlite3``)."""
        self.database = ChatDatabase(Path(path))
        super().__init__(self.database)
        self.branches = Branches(self.database)
        self.copies = Copies(self.database)
        self.deletion = Deletion(self.database)
        self.models = ChatModels(self.database)  # the model each chat last ran on
        self._finder = Search(self.database)
        self.streams = LiveStreams(self.database.path)  # which STREAMING rows a live process writes

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards."""
        with self._lock:
            self.streams.close()
            self._conn.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
            return queries.conversation(conn, cur.lastrowid)

    def get_conversation(self, conversation_id: int) -> Conversation:
        """Return the conversation. Raises NotFoundError if there is none with that id."""
        with self._lock:
            return queries.conversation(self._conn, conversation_id)

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

    def delete_conversation(self, conversation_id: int, *, forget: bool = True) -> None:
        """Delete the conversation and all its messages, leaving nothing readable behind
        (``Deletion.delete_conversation``: the rows in one transaction, then with
        ``forget`` the search index merged and the WAL truncated; ``forget=False`` on the
        UI thread, then ``deletion.forget_deleted()`` on a worker).

        Raises NotFoundError if unknown; StorageFullError on a full disk (nothing
        is deleted then).
        """
        self.deletion.delete_conversation(conversation_id, forget=forget)

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
        reasoning: str | None = None,
        tool: dict[str, Any] | None = None,
    ) -> Message:
        """Add a message under ``parent_id`` (None: a new root) and make it the active leaf.

        Bumps the conversation's ``updated_at``. If the conversation still has
        DEFAULT_TITLE and this is its first user message, the title becomes
        ``auto_title(content)``. ``token_ids`` are stored as int32. ``reasoning`` is a
        reasoning model's thinking before the answer ``content`` (None: it wrote none).
        ``tool``: a tool step's fields (``Message.tool``), stored as JSON.

        Raises:
            NotFoundError: unknown conversation or parent message.
            ValueError: the parent belongs to another conversation, a bad role
                or status, a token id outside int32, or a lone surrogate in ``tool``.
        """
        queries.check_choice("role", role, ROLES)
        queries.check_choice("status", status, STATUSES)
        blob = None if token_ids is None else encode_token_ids(token_ids)
        now = time.time()
        with self._tx() as conn:
            conversation = queries.conversation(conn, conversation_id)
            if parent_id is not None:
                queries.check_in_conversation(conn, parent_id, conversation_id)
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, token_ids,"
                " stats_json, status, model, created_at, reasoning, tool_json)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent_id, role, content, blob, queries.dumps(stats), status, model,
                 now, reasoning, queries.tool_dumps(tool)),
            )
            message_id = cur.lastrowid
            if status == "streaming":  # claimed before the commit: no one sees it unclaimed
                self.streams.claim(message_id)
            title = conversation.title
            if role == "user" and title == DEFAULT_TITLE and not queries.has_other_user_message(
                conn, conversation_id, message_id
            ):
                title = auto_title(content) or DEFAULT_TITLE
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ?, title = ?"
                " WHERE id = ?",
                (message_id, now, title, conversation_id),
            )
            return queries.message(conn, message_id)

    def update_message(
        self,
        message_id: int,
        *,
        content: str = _UNSET,
        token_ids: Sequence[int] | None = _UNSET,
        stats: dict[str, Any] | None = _UNSET,
        status: str = _UNSET,
        reasoning: str | None = _UNSET,
        tool: dict[str, Any] | None = _UNSET,
    ) -> None:
        """Change some fields of a message in one small transaction (one UPDATE).

        Meant to be called every few hundred milliseconds while a reply streams:
        only the fields passed are written, and ``content`` replaces the stored
        text (pass the whole reply so far). Passing None for ``token_ids`` or
        ``stats`` clears them.

        Raises:
            NotFoundError: unknown message.
            ValueError: a bad status, a token id outside int32, or a lone surrogate in ``tool``.
        """
        fields: dict[str, Any] = {}
        if content is not _UNSET:
            fields["content"] = content
        if token_ids is not _UNSET:
            fields["token_ids"] = None if token_ids is None else encode_token_ids(token_ids)
        if stats is not _UNSET:
            fields["stats_json"] = queries.dumps(stats)
        if status is not _UNSET:
            queries.check_choice("status", status, STATUSES)
            fields["status"] = status
        if reasoning is not _UNSET:
            fields["reasoning"] = reasoning
        if tool is not _UNSET:
            fields["tool_json"] = queries.tool_dumps(tool)
        if not fields:
            return
        assignments = ", ".join(f"{name} = ?" for name in fields)
        try:
            with self._tx() as conn:
                cur = conn.execute(
                    f"UPDATE messages SET {assignments} WHERE id = ?", (*fields.values(), message_id)
                )
                if cur.rowcount == 0:
                    raise queries.no_message(message_id)
                if status == "streaming":  # a continuation streams into the row again
                    self.streams.claim(message_id)
        finally:
            if status is not _UNSET and status != "streaming":  # the reply ended (or failed to)
                self.streams.release(message_id)

    def mark_interrupted_streams(self) -> int:
        """Mark messages left "streaming" by a crash or a kill as "stopped"; return how many.
        A reply another process (or store) is streaming right now holds its lock
        (``storage.chats.live_streams``) and stays "streaming".

        Call once at startup, before any generation begins. Writes only when some reply is
        left streaming (nothing on a database opened read-only for a full disk).
        """
        with self._lock:
            if self.database.read_only or not self._conn.execute(
                    "SELECT 1 FROM messages WHERE status = 'streaming' LIMIT 1").fetchone():
                return 0
        with self._tx() as conn:
            ids = [row[0] for row in conn.execute("SELECT id FROM messages WHERE status = 'streaming'")]
            dead = [i for i in ids if not self.streams.is_live(i)]
            for i in dead:
                conn.execute("UPDATE messages SET status = 'stopped' WHERE id = ?", (i,))
        for i in dead:
            self.streams.forget(i)
        return len(dead)

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: changes when another connection (another
        process) committed to the database since the last call on this one."""
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def get_message(self, message_id: int) -> Message:
        """Return the message. Raises NotFoundError if there is none with that id."""
        with self._lock:
            return queries.message(self._conn, message_id)

    def messages(self, ids: Sequence[int]) -> list[Message]:
        """The messages with ``ids``, in that order. Raises NotFoundError if one is missing."""
        found: dict[int, Message] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = tuple(ids[i:i + 500])
                where = f"id IN ({', '.join('?' * len(chunk))})"
                found.update((m.id, m) for m in queries.messages_where(self._conn, where, chunk))
        missing = next((i for i in ids if i not in found), None)
        if missing is not None:
            raise queries.no_message(missing)
        return [found[i] for i in ids]

    def active_path(self, conversation_id: int) -> list[Message]:
        """The path root..active leaf ([] for an empty conversation).

        Raises NotFoundError for an unknown conversation.
        """
        with self._lock:
            leaf = queries.conversation(self._conn, conversation_id).active_leaf_id
            return [] if leaf is None else queries.path_to(self._conn, leaf)

    def set_active_leaf(self, conversation_id: int, message_id: int) -> None:
        """Show the branch ending at ``message_id``.

        Raises:
            NotFoundError: unknown conversation or message.
            ValueError: the message belongs to another conversation.
        """
        with self._tx() as conn:
            queries.conversation(conn, conversation_id)
            queries.check_in_conversation(conn, message_id, conversation_id)
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (message_id, conversation_id),
            )

    def tree(self, conversation_id: int, limit: int | None = None) -> list[Message]:
        """Every message of the conversation in creation order (parents before children);
        with ``limit``, only the first ``limit`` of them (read no further).

        Raises NotFoundError for an unknown conversation.
        """
        with self._lock:
            queries.conversation(self._conn, conversation_id)
            return queries.messages_where(self._conn, "conversation_id = ?", (conversation_id,), limit)

    def tree_outline(self, conversation_id: int, content_chars: int) -> list[Message]:
        """``tree(conversation_id)`` as a tree panel draws it: each message's id, parent, role,
        status and the first ``content_chars`` characters of its text; its token ids, stats,
        model, reasoning and tool fields are left out (None), so a 10,000-message tree is
        read in a fraction of the time. Raises NotFoundError for an unknown conversation."""
        with self._lock:
            queries.conversation(self._conn, conversation_id)
            rows = self._conn.execute(
                "SELECT id, parent_id, role, substr(content, 1, ?), status FROM messages "
                "WHERE conversation_id = ? ORDER BY id", (int(content_chars), conversation_id)).fetchall()
        return [Message(mid, conversation_id, parent, role, text, None, None, status, None, 0.0)
                for mid, parent, role, text, status in rows]

    # -- search -------------------------------------------------------------

    def search(
        self, query: str, limit: int = 50, marks: tuple[str, str] = ("«", "»")
    ) -> list[tuple[Conversation, str]]:
        """``search_hits`` as (conversation, snippet) pairs, each word in the snippet
        between ``marks`` (``storage.chats.search``)."""
        return self._finder.search(query, limit, marks)

    def search_hits(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Conversations whose title and messages hold every word of ``query``, best
        first, each with the message that matched best (``Search.search_hits``: up to
        ``limit``; never a syntax error, whatever was typed)."""
        return self._finder.search_hits(query, limit)

    # -- helpers (caller holds the lock) ------------------------------------

    def _set_conversation_field(self, conversation_id: int, column: str, value: Any) -> None:
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conversation_id)
            )
            if cur.rowcount == 0:
                raise queries.no_conversation(conversation_id)
