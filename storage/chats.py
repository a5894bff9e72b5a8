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
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

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
from storage.chat_schema import SEARCHED_COLUMNS, migrate
from storage.chat_text import TITLE_LIMIT, auto_title, mark_spans, search_terms, snippet_spans
from storage.errors import NotFoundError, StorageError, StorageFullError, is_disk_full
from storage.paths import disk_full_message, free_space

__all__ = [  # the records and helpers are re-exported so callers import from one place
    "DEFAULT_SAMPLING",
    "DEFAULT_TITLE",
    "ROLES",
    "STATUSES",
    "TITLE_LIMIT",
    "ChatStore",
    "Conversation",
    "Message",
    "SearchHit",
    "auto_title",
    "search_terms",
]

_UNSET: Any = object()
_TRIGRAM = 3  # shortest term the trigram index can find; shorter ones are scanned (LIKE)
LOW_SPACE_BYTES = 1024**2
"""Below this much free space, SQLite's "disk I/O error" is taken for a full disk: the
shared-memory file (``-shm``) and the WAL fail that way when they cannot grow."""


@dataclass(frozen=True)
class SearchHit:
    """One conversation found by ``ChatStore.search_hits``: ``message_id`` is the message
    that matched best (None: only the title matched), ``snippet`` a one-line excerpt of it
    (plain text) and ``spans`` the (start, end) character ranges of the words in it."""

    conversation: Conversation
    message_id: int | None
    snippet: str
    spans: list[tuple[int, int]]


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
        self._db = sqlite_utils.Database(self._conn, recursive_triggers=False)

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
        with self._lock, _disk_full_raises(self.path, "the last change was not saved"):
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

    def delete_conversation(self, conversation_id: int, *, forget: bool = True) -> None:
        """Delete the conversation and all its messages, leaving nothing readable behind.

        The rows go in one transaction (the search index follows through its
        triggers). Then the search index is merged (FTS5 ``optimize``) so its old
        segments, which still hold the deleted words, are dropped; with ``PRAGMA
        secure_delete`` every freed page is overwritten with zeros; and the WAL is
        checkpointed and truncated so no old copy of a page stays in
        ``chats.sqlite3-wal``. The merge and checkpoint take time in proportion to
        the size of the search index and of the WAL (not of this conversation):
        measured 1.6-2.3 s for a 30 MB file of 10,000 messages (on 2 shared cores
        under load), against 17 ms for the row delete alone. Call this off the UI
        thread, or pass ``forget=False`` there and call ``forget_deleted()`` from a
        worker thread afterwards. If another connection is reading at that
        moment the checkpoint cannot finish; the WAL is then cleared by the next
        delete or when the last connection closes.

        Undo: this method is final. The window makes a delete undoable by hiding
        the conversation and calling this only when the undo time has passed
        (``app/window/tree/sidebar.py``), so Undo never needs anything back from here. The KV
        blocks of the conversation live in the other database: see
        ``engine.forget`` (``branchwise conversations delete`` does both).

        Raises NotFoundError if unknown; StorageFullError on a full disk (nothing
        is deleted then).
        """
        with self._tx() as conn:
            self._conversation(conn, conversation_id)
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM messages WHERE conversation_id = ? ORDER BY id DESC", (conversation_id,))]
            _delete_leaves_first(conn, ids)
            conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        if forget:
            self.forget_deleted()

    def forget_deleted(self) -> None:
        """Merge the search index and truncate the WAL, so that the text of deleted
        rows is nowhere in the files (see ``delete_conversation``)."""
        with self._tx() as conn:
            for table in SEARCHED_COLUMNS:
                conn.execute(f"INSERT INTO {table}_fts({table}_fts) VALUES ('optimize')")
        with self._lock, _disk_full_raises(self.path, "the WAL could not be cleared"):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

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

    def delete_subtree(self, message_id: int) -> list[Message]:
        """Delete ``message_id`` and every message under it, in one transaction; returns
        the deleted messages, parents before children (what ``restore_messages`` takes back).

        The subtree is found with a recursive CTE and deleted leaves first, so SQLite's
        ``ON DELETE CASCADE`` never chains (a chain of cascades stops at SQLite's trigger
        depth, 1,000 levels). When the active leaf was inside the subtree, the branch moves to
        the newest leaf under the nearest remaining sibling of ``message_id``, else to its
        parent (None when it was a lone root). Like
        ``delete_conversation(forget=False)``, the deleted text may stay in the search
        index's old segments until ``forget_deleted`` runs.

        Raises NotFoundError for an unknown message.
        """
        with self._tx() as conn:
            top = self._message(conn, message_id)
            rows = conn.execute(
                "WITH RECURSIVE down(id, depth) AS ("
                "  SELECT ?, 0 UNION ALL"
                "  SELECT m.id, down.depth + 1 FROM messages AS m JOIN down ON m.parent_id = down.id"
                f") SELECT {', '.join('m.' + name for name in MESSAGE_FIELDS)}"
                " FROM down JOIN messages AS m ON m.id = down.id ORDER BY down.depth, m.id",
                (message_id,),
            ).fetchall()
            removed = [message_from_row(row) for row in rows]
            conv = self._conversation(conn, top.conversation_id)
            gone = {m.id for m in removed}
            _delete_leaves_first(conn, [m.id for m in reversed(removed)])
            if conv.active_leaf_id is None or conv.active_leaf_id in gone:
                conn.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                             (self._leaf_after_delete(conn, top), top.conversation_id))
            return removed

    @staticmethod
    def _leaf_after_delete(conn, top: Message) -> int | None:
        """The active leaf once ``top``'s subtree is gone: the newest leaf under its nearest
        remaining sibling (the one before it, else the one after), else its parent."""
        row = conn.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? AND id != ?"
            " ORDER BY (id > ?), abs(id - ?) LIMIT 1",
            (top.conversation_id, top.parent_id, top.id, top.id, top.id),
        ).fetchone()
        if row is None:
            return top.parent_id
        leaf = row[0]
        while (child := conn.execute("SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1",
                                     (leaf,)).fetchone()) is not None:
            leaf = child[0]
        return leaf

    def restore_messages(self, messages: list[Message], active_leaf_id: int | None = None) -> dict[int, int]:
        """Put back messages that ``delete_subtree`` returned (parents before children),
        under their old parent, with new ids; returns old id -> new id. When
        ``active_leaf_id`` (an old id) is among them, its copy becomes the active leaf.

        Raises:
            NotFoundError: the conversation or the parent of the first message is gone.
            ValueError: ``messages`` is empty.
        """
        if not messages:
            raise ValueError("There are no messages to restore.")
        first = messages[0]
        with self._tx() as conn:
            self._conversation(conn, first.conversation_id)
            if first.parent_id is not None:
                self._check_in_conversation(conn, first.parent_id, first.conversation_id)
            new_ids = self._copy_messages(conn, messages, first.conversation_id,
                                          keep={first.parent_id: first.parent_id})
            if active_leaf_id in new_ids:
                conn.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                             (new_ids[active_leaf_id], first.conversation_id))
            return new_ids

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

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: changes when another connection (another
        process) committed to the database since the last call on this one."""
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

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

    def path_ids(self, message_id: int) -> list[int]:
        """The ids of the messages from the root down to ``message_id`` (both included), without
        reading the messages themselves (a few milliseconds for a 10,000-message branch, where
        ``path_to`` takes a tenth of a second). Raises NotFoundError for an unknown message."""
        with self._lock:
            rows = self._conn.execute(
                "WITH RECURSIVE up(id, parent_id, depth) AS ("
                "  SELECT id, parent_id, 0 FROM messages WHERE id = ?"
                "  UNION ALL"
                "  SELECT m.id, m.parent_id, up.depth + 1 FROM messages AS m JOIN up"
                "  ON m.id = up.parent_id"
                ") SELECT id FROM up ORDER BY depth DESC",
                (message_id,),
            ).fetchall()
        if not rows:
            raise _no_message(message_id)
        return [row[0] for row in rows]

    def messages(self, ids: Sequence[int]) -> list[Message]:
        """The messages with ``ids``, in that order. Raises NotFoundError if one is missing."""
        found: dict[int, Message] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = tuple(ids[i:i + 500])
                where = f"id IN ({', '.join('?' * len(chunk))})"
                found.update((m.id, m) for m in self._messages_where(self._conn, where, chunk))
        missing = next((i for i in ids if i not in found), None)
        if missing is not None:
            raise _no_message(missing)
        return [found[i] for i in ids]

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
        """``search_hits`` as (conversation, snippet) pairs, each word in the snippet
        between ``marks``."""
        return [(h.conversation, mark_spans(h.snippet, h.spans, marks)) for h in self.search_hits(query, limit)]

    def search_hits(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Find conversations whose title and messages hold every word of ``query``.

        ``query`` is what a person typed, split by ``search_terms`` (never a syntax
        error). A word matches anywhere inside a title or message, in any case: "app"
        finds "apple", "苹果" finds "我喜欢苹果", "C++" and "🍎" are found too. The
        words may be spread over the title and different messages of one
        conversation. Returns up to ``limit`` ``SearchHit``s: conversations whose
        title holds every word first, then the others; within each group pinned ones
        first, then the most recently updated. A hit names the message holding the
        most of the words (the newest of equals; None when only the title matched)
        and an excerpt of it (of the title when no message matched) with the spans
        of the words in it.

        Words of three or more characters are looked up in the trigram index
        (``storage.chat_schema.SEARCH_TOKENIZER``); shorter ones scan the text.
        """
        terms = search_terms(query)
        if not terms or limit <= 0:
            return []
        with self._lock:
            title_hits = [self._title_hits(term) for term in terms]
            message_hits = [self._message_hits(term) for term in terms]
            found = set.intersection(*(
                t | set(m.values()) for t, m in zip(title_hits, message_hits, strict=True)
            ))
            if not found:
                return []
            by_title = set.intersection(*title_hits)
            conversations = self._conversations_where(
                self._conn, f"id IN ({', '.join('?' * len(found))})", sorted(found)
            )
            conversations.sort(key=lambda c: (c.id not in by_title, not c.pinned, -c.updated_at,
                                              -c.id))
            conversations = conversations[:limit]
            best: dict[int, tuple[int, int]] = {}  # conversation -> (words held, message id)
            counts: dict[int, int] = {}
            for hits in message_hits:
                for message_id in hits:
                    counts[message_id] = counts.get(message_id, 0) + 1
            wanted = {c.id for c in conversations}
            for hits in message_hits:
                for message_id, conversation_id in hits.items():
                    if conversation_id in wanted:
                        mine = (counts[message_id], message_id)
                        best[conversation_id] = max(best.get(conversation_id, mine), mine)
            ids = [message_id for _, message_id in best.values()]
            texts = dict(self._conn.execute(
                f"SELECT id, content FROM messages WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).fetchall()) if ids else {}
        hits = []
        for c in conversations:
            mid = best[c.id][1] if c.id in best else None
            piece, spans = snippet_spans(texts[mid] if mid is not None else c.title, terms)
            hits.append(SearchHit(c, mid, piece, spans))
        return hits

    def _title_hits(self, term: str) -> set[int]:
        """Ids of conversations whose title contains ``term`` (any case, any Unicode
        normalization form: "café" typed composed finds it pasted decomposed, as macOS writes it)."""
        return set().union(*(self._title_hits_exact(form) for form in _forms(term)))

    def _message_hits(self, term: str) -> dict[int, int]:
        """Map message id -> conversation id for the messages that contain ``term`` (any
        case, any normalization form)."""
        hits: dict[int, int] = {}
        for form in _forms(term):
            hits.update(self._message_hits_exact(form))
        return hits

    def _title_hits_exact(self, term: str) -> set[int]:
        if len(term) >= _TRIGRAM:
            sql = "SELECT rowid FROM conversations_fts WHERE conversations_fts MATCH ?"
            return {r[0] for r in self._conn.execute(sql, (self._quote(term),))}
        sql = r"SELECT id FROM conversations WHERE title LIKE ? ESCAPE '\'"
        return {r[0] for r in self._conn.execute(sql, (_like(term),))}

    def _message_hits_exact(self, term: str) -> dict[int, int]:
        if len(term) >= _TRIGRAM:
            sql = ("SELECT m.id, m.conversation_id FROM messages_fts"
                   " JOIN messages AS m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ?")
            return dict(self._conn.execute(sql, (self._quote(term),)).fetchall())
        sql = r"SELECT id, conversation_id FROM messages WHERE content LIKE ? ESCAPE '\'"
        return dict(self._conn.execute(sql, (_like(term),)).fetchall())

    def _quote(self, term: str) -> str:
        """``term`` as one FTS5 string (sqlite-utils' quoting: syntax characters are text)."""
        return self._db.quote_fts(term.replace('"', " "))

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
        conn: sqlite3.Connection, messages: list[Message], conversation_id: int,
        keep: dict[int | None, int | None] | None = None,
    ) -> dict[int, int]:
        """Insert copies of ``messages`` (parents first) into a conversation; map old id -> new id.
        ``keep`` maps parent ids outside ``messages`` to the parent their copies go under."""
        new_ids: dict[int, int] = dict(keep or {})
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
        for old_id in keep or {}:
            new_ids.pop(old_id, None)
        return new_ids


# -- opening and validation -----------------------------------


_OPEN_RETRIES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Waits before trying a locked first open again. Measured: with 8 processes opening a new
folder together, SQLite occasionally answered "database is locked" at once, without its
busy handler (while another opener was setting the new file up): once in 160 opens in one
run of tests/test_concurrency.py."""


def _open(path: Path) -> sqlite3.Connection:
    """Connect in autocommit mode (transactions are explicit), set pragmas, migrate.
    A lock that SQLite reports at once is retried a few times (``_OPEN_RETRIES_S``)."""
    for wait in _OPEN_RETRIES_S:
        try:
            return _open_once(path)
        except StorageError as exc:
            if not isinstance(exc.__cause__, sqlite3.OperationalError) or "locked" not in str(exc.__cause__):
                raise
            time.sleep(wait)
    return _open_once(path)


def _open_once(path: Path) -> sqlite3.Connection:
    conn: sqlite3.Connection | None = None
    try:
        with _disk_full_raises(path, f"the chat database {path.name} could not be opened"):
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Deleted rows are overwritten with zeros, not left in free pages
            # (https://sqlite.org/pragma.html#pragma_secure_delete).
            conn.execute("PRAGMA secure_delete = ON")
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



@contextmanager
def _disk_full_raises(path: Path, not_saved: str) -> Iterator[None]:
    """Re-raise a full disk inside the block as StorageFullError naming the folder and
    its free space. SQLITE_FULL and ENOSPC are a full disk; so is SQLITE_IOERR ("disk
    I/O error") while less than LOW_SPACE_BYTES are free. Other errors pass unchanged."""
    try:
        yield
    except (sqlite3.OperationalError, OSError) as exc:
        if _is_full(exc, path.parent):
            raise StorageFullError(disk_full_message(path.parent, not_saved)) from exc
        raise


def _is_full(exc: BaseException, folder: Path) -> bool:
    if is_disk_full(exc):
        return True
    io_error = (isinstance(exc, sqlite3.OperationalError)
                and (getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_IOERR
                     or "disk I/O error" in str(exc)))
    free = free_space(folder) if io_error else None
    return free is not None and free < LOW_SPACE_BYTES


def _delete_leaves_first(conn: sqlite3.Connection, ids: list[int]) -> None:
    """Delete the messages ``ids``, given children before parents (deepest first, or
    descending ids: a child's id is above its parent's): no row has children left when it goes, so
    ``ON DELETE CASCADE`` never chains into SQLite's trigger depth limit."""
    conn.executemany("DELETE FROM messages WHERE id = ?", ((i,) for i in ids))


def _forms(term: str) -> list[str]:
    """``term`` in its composed (NFC) and decomposed (NFD) Unicode forms, without repeats:
    stored text keeps the form it was typed or pasted in."""
    forms = [term, unicodedata.normalize("NFC", term), unicodedata.normalize("NFD", term)]
    return list(dict.fromkeys(forms))


def _like(term: str) -> str:
    """A LIKE pattern finding ``term`` anywhere (``\\`` escapes ``%`` and ``_``)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


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
