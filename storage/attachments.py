"""Attached files in ``chats.sqlite3``: stored once, searchable, deleted with their last chat.

Tables (migration ``migration_attachments``, in ``storage.chat_schema.MIGRATIONS``):

* ``attachments``: one row per distinct file, keyed by the SHA-256 of its bytes: its first
  name, kind, whether it has pages, size, encoding, images counted, and the original bytes
  when at most ``MAX_STORED_ORIGINAL_BYTES`` (16 MiB; larger files keep only their text).
* ``attachment_passages``: the extracted text, as consecutive passages (``number``, ``page``,
  ``text``): the text is stored once, and a page is its passages joined.
  ``attachment_passages_fts`` indexes them (FTS5, the chat search's trigram tokenizer).
* ``message_attachments``: which user message holds which file, in what position, under
  what name, and (``passages_json``) which passages were sent when the whole text did not
  fit (NULL: the whole text).

The same file attached twice, in one chat or two, is one ``attachments`` row. Deleting a
message (with its chat, or its subtree) deletes its links through ``ON DELETE CASCADE``;
a trigger deletes an attachment when its last link goes, its passages follow by cascade,
and the FTS index is merged (``optimize``) so its old segments lose the words. With the
chat store's ``secure_delete`` and WAL truncation (``ChatStore.deletion.forget_deleted``) nothing of
the file stays in ``chats.sqlite3`` or its WAL.

This module opens its own connection to the file the ``ChatStore`` uses (one per store,
``for_chats``); it never imports the engine.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from storage.chats.connection import open_read_only

MAX_STORED_ORIGINAL_BYTES: Final = 16 * 1024**2
"""Originals up to this size are kept beside their text (``engine.documents.limits``)."""

_SCHEMA = (
    """
    CREATE TABLE attachments (
        sha256     TEXT    PRIMARY KEY CHECK (length(sha256) = 64),
        name       TEXT    NOT NULL,
        kind       TEXT    NOT NULL,
        paged      INTEGER NOT NULL CHECK (paged IN (0, 1)),
        size       INTEGER NOT NULL,
        encoding   TEXT    NULL,
        images     INTEGER NOT NULL DEFAULT 0,
        original   BLOB    NULL,
        created_at REAL    NOT NULL
    )
    """,
    """
    CREATE TABLE attachment_passages (
        id      INTEGER PRIMARY KEY,
        sha256  TEXT    NOT NULL REFERENCES attachments(sha256) ON DELETE CASCADE,
        number  INTEGER NOT NULL,
        page    INTEGER NULL,
        text    TEXT    NOT NULL
    )
    """,
    "CREATE UNIQUE INDEX attachment_passages_by_file ON attachment_passages(sha256, number)",
    """
    CREATE TABLE message_attachments (
        message_id    INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        position      INTEGER NOT NULL,
        sha256        TEXT    NOT NULL REFERENCES attachments(sha256),
        name          TEXT    NOT NULL,
        passages_json TEXT    NULL,
        PRIMARY KEY (message_id, position)
    )
    """,
    "CREATE INDEX message_attachments_by_file ON message_attachments(sha256)",
    """
    CREATE VIRTUAL TABLE attachment_passages_fts USING fts5(
        text, content='attachment_passages', content_rowid='id', tokenize='trigram'
    )
    """,
    """
    CREATE TRIGGER attachment_passages_ai AFTER INSERT ON attachment_passages BEGIN
        INSERT INTO attachment_passages_fts(rowid, text) VALUES (new.id, new.text);
    END
    """,
    """
    CREATE TRIGGER attachment_passages_ad AFTER DELETE ON attachment_passages BEGIN
        INSERT INTO attachment_passages_fts(attachment_passages_fts, rowid, text)
        VALUES ('delete', old.id, old.text);
    END
    """,
    # The last link to a file gone (a message deleted, by cascade too): the file goes.
    """
    CREATE TRIGGER message_attachments_ad AFTER DELETE ON message_attachments
    WHEN NOT EXISTS (SELECT 1 FROM message_attachments WHERE sha256 = old.sha256) BEGIN
        DELETE FROM attachments WHERE sha256 = old.sha256;
    END
    """,
    # Merge the index so no old segment keeps a deleted file's words (FTS5 'optimize').
    """
    CREATE TRIGGER attachments_ad AFTER DELETE ON attachments BEGIN
        INSERT INTO attachment_passages_fts(attachment_passages_fts) VALUES ('optimize');
    END
    """,
)


def migration_attachments(conn: sqlite3.Connection) -> None:
    """Create the attachment tables, their search index and triggers (module docstring)."""
    for statement in _SCHEMA:
        conn.execute(statement)


@dataclass(frozen=True)
class StoredPassage:
    """A stored passage: ``number`` in its document, ``page`` (None without pages), ``text``."""

    number: int
    page: int | None
    text: str


@dataclass(frozen=True)
class StoredAttachment:
    """One file as linked to one message: ``name`` it was attached under, ``sha256``,
    ``kind``, ``paged``, ``size`` (bytes), ``images``, ``pages`` (page count, or None),
    ``passages`` (all of them, in order) and ``sent`` (the numbers of the passages the
    prompt holds when the whole text did not fit; None: the whole text)."""

    name: str
    sha256: str
    kind: str
    paged: bool
    size: int
    images: int
    passages: tuple[StoredPassage, ...]
    sent: tuple[int, ...] | None

    @property
    def pages(self) -> int | None:
        """The page count (None for a file without pages)."""
        return max((p.page or 0 for p in self.passages), default=0) if self.paged else None


@dataclass(frozen=True)
class AttachmentSummary:
    """One file as linked to one message, without its text (``AttachmentStore.summaries``):
    ``name``, ``sha256``, ``kind``, ``pages`` (None for a file without pages) and ``sent``
    (the passage numbers sent, or None for the whole text)."""

    name: str
    sha256: str
    kind: str
    pages: int | None
    sent: tuple[int, ...] | None


@dataclass(frozen=True)
class AttachmentHit:
    """A search hit in an attached file: the chat and message holding it, the file ``name``,
    the ``page`` (None without pages), the passage ``number`` and a one-line ``snippet``."""

    conversation_id: int
    message_id: int
    name: str
    page: int | None
    number: int
    snippet: str


_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def for_chats(chats) -> AttachmentStore:
    """The ``AttachmentStore`` on ``chats``'s file (a ``storage.chats.ChatStore``), opened
    once per chat store and closed when that store is garbage-collected."""
    with _STORES_LOCK:
        store = _STORES.get(chats)
        if store is None:
            store = _STORES[chats] = AttachmentStore(chats.path, read_only=chats.database.read_only)
        return store


class AttachmentStore:
    """The attachment tables of one ``chats.sqlite3`` (opened by a ``ChatStore`` first, so
    migrated). Thread-safe: one connection used under a lock.

    Raises (from any method): sqlite3.Error from SQLite (a full disk among them).
    """

    def __init__(self, path: Path, read_only: bool = False) -> None:
        """Connect to ``path`` with the chat store's pragmas (WAL, foreign keys, secure_delete);
        ``read_only`` as the chat store was opened on a full disk (immutable: reads only)."""
        self.path = Path(path)
        self._lock = threading.RLock()
        if read_only:
            self._conn = open_read_only(self.path)
            return
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = ON", "secure_delete = ON"):
            self._conn.execute(f"PRAGMA {pragma}")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def put(self, sha256: str, name: str, kind: str, paged: bool, size: int, images: int,
            encoding: str | None, passages: Sequence[tuple[int, int | None, str]],
            original: bytes | None = None) -> bool:
        """Store a file once (``passages``: (number, page, text) in order). The original is
        kept when it is at most MAX_STORED_ORIGINAL_BYTES. Returns False when the file was
        already stored (nothing is written then)."""
        keep = original if original is not None and len(original) <= MAX_STORED_ORIGINAL_BYTES else None
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM attachments WHERE sha256 = ?", (sha256,)).fetchone():
                return False
            conn.execute(
                "INSERT INTO attachments (sha256, name, kind, paged, size, encoding, images, original, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sha256, name, kind, int(paged), size, encoding, images, keep, time.time()))
            conn.executemany("INSERT INTO attachment_passages (sha256, number, page, text) VALUES (?, ?, ?, ?)",
                             ((sha256, n, page, text) for n, page, text in passages))
            return True

    def link(self, message_id: int, files: Iterable[tuple[str, str, Sequence[int] | None]]) -> None:
        """Attach stored files to a message: ``files`` is (sha256, name, sent passage numbers or
        None for the whole text), in order. Raises sqlite3.IntegrityError for an unknown
        message or file."""
        with self._tx() as conn:
            start = conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM message_attachments"
                                 " WHERE message_id = ?", (message_id,)).fetchone()[0]
            for i, (sha256, name, sent) in enumerate(files):
                conn.execute("INSERT INTO message_attachments (message_id, position, sha256, name, passages_json)"
                             " VALUES (?, ?, ?, ?, ?)",
                             (message_id, start + i, sha256, name, None if sent is None else json.dumps(list(sent))))

    def drop_unlinked(self, older_than_s: float | None = None) -> int:
        """Delete files no message links to (a store interrupted between ``put`` and
        ``link``, or a window that ended before it sent a file it had read); with
        ``older_than_s``, only those stored at least that many seconds ago (a file another
        window holds on its composer is younger). Returns how many went."""
        cutoff = time.time() - older_than_s if older_than_s is not None else float("inf")
        with self._tx() as conn:
            return conn.execute("DELETE FROM attachments WHERE created_at < ? AND sha256 NOT IN"
                                " (SELECT sha256 FROM message_attachments)", (cutoff,)).rowcount

    def sweep_unlinked(self, older_than_s: float) -> int:
        """:meth:`drop_unlinked` older than ``older_than_s`` seconds, then truncate the WAL so
        nothing of the dropped files stays in it (the deletes zero their pages, the trigger
        merges the search index). Returns how many went."""
        dropped = self.drop_unlinked(older_than_s)
        if dropped:
            with self._lock:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return dropped

    def of_messages(self, message_ids: Sequence[int]) -> dict[int, list[StoredAttachment]]:
        """``{message id: its attachments in order}`` for those of ``message_ids`` that have any
        (one query for the links; the passages of each distinct file once)."""
        if not message_ids:
            return {}
        out: dict[int, list[StoredAttachment]] = {}
        with self._lock:
            rows: list[tuple] = []
            ids = list(message_ids)
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                rows += self._conn.execute(
                    "SELECT l.message_id, l.name, l.sha256, l.passages_json, a.kind, a.paged, a.size, a.images"
                    " FROM message_attachments AS l JOIN attachments AS a ON a.sha256 = l.sha256"
                    f" WHERE l.message_id IN ({', '.join('?' * len(chunk))}) ORDER BY l.message_id, l.position",
                    chunk).fetchall()
            texts = {sha: self._passages(sha) for sha in {r[2] for r in rows}}
        for mid, name, sha, sent, kind, paged, size, images in rows:
            out.setdefault(mid, []).append(StoredAttachment(
                name, sha, kind, bool(paged), size, images, texts[sha],
                None if sent is None else tuple(json.loads(sent))))
        return out

    def drop_if_unlinked(self, sha256: str) -> bool:
        """Delete the file ``sha256`` when no message links to it (an attachment removed
        before it was sent); True when it went. A file some message holds stays."""
        with self._tx() as conn:
            return conn.execute("DELETE FROM attachments WHERE sha256 = ? AND NOT EXISTS"
                                " (SELECT 1 FROM message_attachments WHERE sha256 = ?)",
                                (sha256, sha256)).rowcount > 0

    def summaries(self, message_ids: Sequence[int]) -> dict[int, list[AttachmentSummary]]:
        """``{message id: what its attachments are, in order}`` without their text: name,
        kind, page count (the page of the last passage, one index lookup) and the passages
        sent. Its cost does not grow with the documents' length."""
        out: dict[int, list[AttachmentSummary]] = {}
        ids = list(message_ids)
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                rows = self._conn.execute(
                    "SELECT l.message_id, l.name, l.sha256, l.passages_json, a.kind, a.paged,"
                    " (SELECT p.page FROM attachment_passages AS p WHERE p.sha256 = l.sha256"
                    "  ORDER BY p.number DESC LIMIT 1)"
                    " FROM message_attachments AS l JOIN attachments AS a ON a.sha256 = l.sha256"
                    f" WHERE l.message_id IN ({', '.join('?' * len(chunk))}) ORDER BY l.message_id, l.position",
                    chunk).fetchall()
                for mid, name, sha, sent, kind, paged, last_page in rows:
                    out.setdefault(mid, []).append(AttachmentSummary(
                        name, sha, kind, (last_page or 1) if paged else None,
                        None if sent is None else tuple(json.loads(sent))))
        return out

    def passages(self, sha256: str, numbers: Sequence[int] | None = None) -> list[StoredPassage]:
        """The passages of the file ``sha256`` in order: all of them (its whole extracted
        text), or those numbered ``numbers``. Empty for an unknown file."""
        with self._lock:
            if numbers is None:
                return list(self._passages(sha256))
            wanted = sorted(set(numbers))
            out: list[StoredPassage] = []
            for i in range(0, len(wanted), 500):
                chunk = wanted[i:i + 500]
                out += [StoredPassage(*r) for r in self._conn.execute(
                    "SELECT number, page, text FROM attachment_passages WHERE sha256 = ?"
                    f" AND number IN ({', '.join('?' * len(chunk))}) ORDER BY number", [sha256, *chunk])]
            return out

    def original(self, sha256: str) -> bytes | None:
        """The stored bytes of a file (None when too large to keep, or unknown)."""
        with self._lock:
            row = self._conn.execute("SELECT original FROM attachments WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else row[0]

    def count(self) -> int:
        """How many distinct files are stored."""
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM attachments").fetchone()[0]

    def best_passages(self, sha256: str, terms: Sequence[str], limit: int) -> list[StoredPassage]:
        """Up to ``limit`` passages of one file that best match any of ``terms`` (words of
        three or more characters), best first by FTS5's BM25 over the trigram index."""
        terms = [t for t in terms if len(t) >= 3]
        if not terms or limit <= 0:
            return []
        query = _fts_query(terms, "OR")
        with self._lock:
            rows = self._conn.execute(
                "SELECT p.number, p.page, p.text FROM attachment_passages_fts AS f"
                " JOIN attachment_passages AS p ON p.id = f.rowid"
                " WHERE attachment_passages_fts MATCH ? AND p.sha256 = ?"
                " ORDER BY bm25(attachment_passages_fts), p.number LIMIT ?",
                (query, sha256, limit)).fetchall()
        return [StoredPassage(*r) for r in rows]

    def search(self, query: str, limit: int = 50) -> list[AttachmentHit]:
        """Attached passages holding every word of ``query`` (three characters or more each),
        best first (BM25): each hit names its chat, message, file and page."""
        terms = [w for w in query.split() if len(w) >= 3]
        if not terms:
            return []
        match = _fts_query(terms, "AND")
        with self._lock:
            rows = self._conn.execute(
                "SELECT m.conversation_id, l.message_id, l.name, p.page, p.number, p.text"
                " FROM attachment_passages_fts AS f JOIN attachment_passages AS p ON p.id = f.rowid"
                " JOIN message_attachments AS l ON l.sha256 = p.sha256 JOIN messages AS m ON m.id = l.message_id"
                " WHERE attachment_passages_fts MATCH ? ORDER BY bm25(attachment_passages_fts), l.message_id"
                " LIMIT ?", (match, limit)).fetchall()
        return [AttachmentHit(c, mid, name, page, number, _snippet(text, terms[0]))
                for c, mid, name, page, number, text in rows]

    def _passages(self, sha256: str) -> tuple[StoredPassage, ...]:
        rows = self._conn.execute("SELECT number, page, text FROM attachment_passages WHERE sha256 = ?"
                                  " ORDER BY number", (sha256,)).fetchall()
        return tuple(StoredPassage(*r) for r in rows)

    def _tx(self):
        return _Transaction(self._conn, self._lock)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` under the lock; ROLLBACK on any error."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock) -> None:
        self.conn, self.lock = conn, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.conn.execute("COMMIT")
            elif self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        finally:
            self.lock.release()


def _snippet(text: str, term: str, width: int = 160) -> str:
    """One line of ``text`` around the first ``term`` (any case)."""
    flat = " ".join(text.split())
    at = flat.lower().find(term.lower())
    start = max(0, at - width // 3) if at >= 0 else 0
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


# -- export and import (Branchwise's own JSON) ------------------------------------------------


def exported(a: StoredAttachment) -> dict:
    """One attachment as the JSON export holds it: name, sha256, kind, paged, size, images,
    ``passages`` ([number, page, text], the whole extracted text) and ``sent`` (the passage
    numbers in the prompt, or None for the whole text). The original bytes stay out."""
    return {"name": a.name, "sha256": a.sha256, "kind": a.kind, "paged": a.paged, "size": a.size,
            "images": a.images, "passages": [[p.number, p.page, p.text] for p in a.passages],
            "sent": None if a.sent is None else list(a.sent)}


def import_exported(conn: sqlite3.Connection, message_id: int, items: list) -> None:
    """Store the exported attachments ``items`` (``exported``'s dicts) of a message being
    imported, on ``conn`` inside the import's transaction: a file already stored is shared.

    Raises:
        ValueError: an item is not of ``exported``'s shape (the message names what).
    """
    if not isinstance(items, list):
        raise ValueError("its attachments are not a list")
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"attachment #{position + 1} is not an object")
        sha, name, kind = item.get("sha256"), item.get("name"), item.get("kind")
        passages = item.get("passages")
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            raise ValueError(f"attachment #{position + 1} has no SHA-256")
        if not isinstance(name, str) or not isinstance(kind, str) or not isinstance(passages, list):
            raise ValueError(f"attachment #{position + 1} has no name, kind or passages")
        rows = []
        for p in passages:
            if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], int)
                    and (p[1] is None or isinstance(p[1], int)) and isinstance(p[2], str)):
                raise ValueError(f"attachment {name!r} has a passage that is not [number, page, text]")
            rows.append((sha, p[0], p[1], p[2]))
        sent = item.get("sent")
        if sent is not None and not (isinstance(sent, list) and all(isinstance(n, int) for n in sent)):
            raise ValueError(f"attachment {name!r}: sent is not a list of passage numbers")
        if conn.execute("SELECT 1 FROM attachments WHERE sha256 = ?", (sha,)).fetchone() is None:
            size, images = item.get("size"), item.get("images")
            conn.execute(
                "INSERT INTO attachments (sha256, name, kind, paged, size, encoding, images, original, created_at)"
                " VALUES (?, ?, ?, ?, ?, NULL, ?, NULL, ?)",
                (sha, name, kind, int(bool(item.get("paged"))), size if isinstance(size, int) else 0,
                 images if isinstance(images, int) else 0, time.time()))
            conn.executemany("INSERT INTO attachment_passages (sha256, number, page, text) VALUES (?, ?, ?, ?)",
                             rows)
        conn.execute("INSERT INTO message_attachments (message_id, position, sha256, name, passages_json)"
                     " VALUES (?, ?, ?, ?, ?)",
                     (message_id, position, sha, name, None if sent is None else json.dumps(sent)))


def _fts_query(terms: Sequence[str], operator: str) -> str:
    """An FTS5 MATCH string: each term a quoted phrase (its quotes made spaces), joined by
    ``operator`` ("AND" or "OR")."""
    return f" {operator} ".join('"' + t.replace('"', " ") + '"' for t in terms)
