"""Schema of ``chats.sqlite3`` and its migrations.

The schema version is ``PRAGMA user_version``: the number of migrations
applied. ``MIGRATIONS[i]`` takes a database from version ``i`` to ``i + 1``;
to change the schema, append a function, never edit one that has shipped.
All pending migrations run in one ``BEGIN IMMEDIATE`` transaction together with
the ``user_version`` bump, so a crash leaves the database at the old version or the
new one, never between. The version is read again after the write lock is taken:
any number of processes may open a new data folder at once, the first one migrates
and the others find the work done.

Tables are written as SQL because sqlite-utils cannot express their CHECK
constraints and ``ON DELETE`` actions; full-text search (the FTS5 tables, their
triggers, rebuilding them when the tokenizer changes) and schema inspection use
sqlite-utils (https://sqlite-utils.datasette.io/en/stable/python-api.html#full-text-search).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from typing import Final

import sqlite_utils

from storage.errors import StorageError
from storage.reasoning_quotes import split_reasoning_quotes

Migration = Callable[[sqlite3.Connection], None]

_SCHEMA_1 = (
    """
    CREATE TABLE conversations (
        id             INTEGER PRIMARY KEY,
        title          TEXT    NOT NULL DEFAULT 'New chat',
        system_prompt  TEXT    NOT NULL DEFAULT '',
        sampling_json  TEXT    NOT NULL DEFAULT '{}',
        active_leaf_id INTEGER NULL REFERENCES messages(id) ON DELETE SET NULL,
        pinned         INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1)),
        created_at     REAL    NOT NULL,
        updated_at     REAL    NOT NULL
    )
    """,
    """
    CREATE TABLE messages (
        id              INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id       INTEGER NULL REFERENCES messages(id) ON DELETE CASCADE,
        role            TEXT    NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content         TEXT    NOT NULL DEFAULT '',
        token_ids       BLOB    NULL,
        stats_json      TEXT    NULL,
        status          TEXT    NOT NULL DEFAULT 'complete'
                        CHECK (status IN ('complete', 'stopped', 'error', 'streaming')),
        model           TEXT    NULL,
        created_at      REAL    NOT NULL
    )
    """,
    # children(parent, conversation) and roots (parent_id IS NULL) of one conversation.
    "CREATE INDEX messages_by_conversation_parent ON messages(conversation_id, parent_id)",
    # The ON DELETE CASCADE of parent_id looks children up by parent_id alone.
    "CREATE INDEX messages_by_parent ON messages(parent_id)",
    "CREATE INDEX conversations_by_activity ON conversations(pinned, updated_at)",
    # Full-text search: external-content FTS5 tables kept in sync by triggers
    # (https://sqlite.org/fts5.html#external_content_tables). These hand-written
    # triggers remain only because migration 1 has shipped: migration 2 drops them
    # and lets sqlite-utils create the search tables and triggers.
    """
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, content='messages', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END
    """,
    """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    END
    """,
    """
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END
    """,
    """
    CREATE VIRTUAL TABLE conversations_fts USING fts5(
        title, content='conversations', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER conversations_fts_insert AFTER INSERT ON conversations BEGIN
        INSERT INTO conversations_fts(rowid, title) VALUES (new.id, new.title);
    END
    """,
    """
    CREATE TRIGGER conversations_fts_delete AFTER DELETE ON conversations BEGIN
        INSERT INTO conversations_fts(conversations_fts, rowid, title)
        VALUES ('delete', old.id, old.title);
    END
    """,
    """
    CREATE TRIGGER conversations_fts_update AFTER UPDATE OF title ON conversations BEGIN
        INSERT INTO conversations_fts(conversations_fts, rowid, title)
        VALUES ('delete', old.id, old.title);
        INSERT INTO conversations_fts(rowid, title) VALUES (new.id, new.title);
    END
    """,
)


def _migration_1(conn: sqlite3.Connection) -> None:
    """Create conversations, messages, their indexes and full-text search."""
    for statement in _SCHEMA_1:
        conn.execute(statement)


SEARCH_TOKENIZER: Final = "trigram"
"""FTS5 tokenizer of both search tables. ``trigram`` indexes every run of three
characters, so words in scripts without spaces (Chinese "苹果" inside "我喜欢苹果"),
emoji and symbols ("C++") are found; case is folded (https://sqlite.org/fts5.html,
"The Trigram Tokenizer"). Terms shorter than three characters fall back to a scan
(``storage.chats``). Changing it needs a migration that calls ``_enable_search``."""

SEARCHED_COLUMNS: Final = {"messages": "content", "conversations": "title"}
"""Each searchable table and its text column; the FTS5 table is ``<table>_fts``."""


class _Database(sqlite_utils.Database):
    """sqlite-utils on a connection inside our transaction.

    ``Database.executescript`` calls ``sqlite3.Connection.executescript``, which on
    Python < 3.12 first COMMITs the open transaction; that would end the
    ``BEGIN IMMEDIATE`` that makes migrations safe under concurrent openers. Here a
    script runs statement by statement in the transaction instead.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn, recursive_triggers=False)

    def executescript(self, sql: str) -> sqlite3.Cursor:  # type: ignore[override]
        cursor = self.conn.cursor()
        statement = ""
        for line in sql.splitlines(keepends=True):
            statement += line
            if sqlite3.complete_statement(statement):
                cursor.execute(statement)
                statement = ""
        if statement.strip():
            cursor.execute(statement)
        return cursor


def _enable_search(db: sqlite_utils.Database) -> None:
    """(Re)create the FTS5 tables with SEARCH_TOKENIZER, their triggers, and fill them.

    sqlite-utils' ``enable_fts(replace=True)`` keeps an index whose SQL already
    matches and otherwise drops and rebuilds it, so this is also the way to change
    the tokenizer. Old hand-written triggers (migration 1's) are dropped first.
    """
    for table, column in SEARCHED_COLUMNS.items():
        for trigger in db[table].triggers:
            if trigger.name.startswith(f"{table}_fts_"):
                db.execute(f"DROP TRIGGER {sqlite_utils.db.quote_identifier(trigger.name)}")
        fts = db[f"{table}_fts"]
        # sqlite-utils replaces an index it made itself; migration 1's (content='table'
        # in quotes) it does not recognise, so that one is dropped here.
        if fts.exists() and f"tokenize='{SEARCH_TOKENIZER}'" not in (fts.schema or ""):
            fts.drop()
        db[table].enable_fts(
            [column], fts_version="FTS5", create_triggers=True, tokenize=SEARCH_TOKENIZER,
            replace=True,
        )


def _migration_2(conn: sqlite3.Connection) -> None:
    """Search with the trigram tokenizer, tables and triggers made by sqlite-utils."""
    _enable_search(_Database(conn))




def _migration_import_sources(conn: sqlite3.Connection) -> None:
    """Remember where imported conversations and messages came from (``branchwise import``).

    ``conversations.source`` is "<format>:<the export's conversation id>" and
    ``messages.source_id`` the export's message id, both NULL for chats made in
    Branchwise; a re-import looks them up so it adds nothing twice
    (``storage/importers/writer.py``). Copies (fork, duplicate) do not carry them.
    """
    conn.execute("ALTER TABLE conversations ADD COLUMN source TEXT NULL")
    conn.execute("ALTER TABLE messages ADD COLUMN source_id TEXT NULL")
    conn.execute(
        "CREATE UNIQUE INDEX conversations_by_source ON conversations(source)"
        " WHERE source IS NOT NULL"
    )
    conn.execute(
        "CREATE UNIQUE INDEX messages_by_source ON messages(conversation_id, source_id)"
        " WHERE source_id IS NOT NULL"
    )


def _migration_reasoning(conn: sqlite3.Connection) -> None:
    """A reply's reasoning beside its answer: ``messages.reasoning`` (NULL: the model wrote
    none), searched with the content (``messages_fts`` gets the column). Replies imported
    before kept their reasoning as a quote in the text (``storage.reasoning_quotes``); it
    moves into the column."""
    conn.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NULL")
    rows = conn.execute(
        "SELECT id, content FROM messages WHERE source_id IS NOT NULL AND role = 'assistant'"
        " AND content LIKE '%> **%'").fetchall()
    moved = []
    for mid, content in rows:
        found, answer = split_reasoning_quotes(content)
        if found is not None:
            moved.append((answer, found, mid))
    conn.executemany("UPDATE messages SET content = ?, reasoning = ? WHERE id = ?", moved)
    db = _Database(conn)
    for trigger in db["messages"].triggers:  # sqlite-utils' messages_ai/_ad/_au, made again below
        if trigger.name in ("messages_ai", "messages_ad", "messages_au"):
            db.execute(f"DROP TRIGGER {sqlite_utils.db.quote_identifier(trigger.name)}")
    db["messages_fts"].drop()
    db["messages"].enable_fts(
        list(MESSAGE_SEARCH_COLUMNS), fts_version="FTS5", create_triggers=True,
        tokenize=SEARCH_TOKENIZER, replace=True,
    )


MESSAGE_SEARCH_COLUMNS: Final = ("content", "reasoning")
"""The columns of ``messages_fts`` from schema 4 on (SEARCHED_COLUMNS names the column of
schema 2, which migration 2 builds)."""


def _migration_attachments(conn: sqlite3.Connection) -> None:
    """Attached files, stored once by SHA-256, their passages and search (``storage.attachments``)."""
    from storage.attachments import migration_attachments

    migration_attachments(conn)


def _migration_chat_models(conn: sqlite3.Connection) -> None:
    """Each conversation remembers the model it last ran on (``storage.chats.chat_models``):
    the file's path and its name as the replies store it (``messages.model``); NULL until
    a reply is written after this migration."""
    conn.execute("ALTER TABLE conversations ADD COLUMN model_path TEXT NULL")
    conn.execute("ALTER TABLE conversations ADD COLUMN model_name TEXT NULL")


_OLD_ROLES = "CHECK (role IN ('system', 'user', 'assistant'))"
_NEW_ROLES = "CHECK (role IN ('system', 'user', 'assistant', 'tool'))"


def _migration_tools(conn: sqlite3.Connection) -> None:
    """Tool calls in the tree: ``messages.tool_json`` (an assistant's ``{"tool_calls": [..]}``,
    a tool result's ``{"tool_call_id", "name", "server", "arguments", "duration_ms", "error"}``;
    NULL for other messages), and ``role`` may be ``'tool'``. The role's CHECK only widens,
    so every stored row still meets it: the table's SQL is edited in place as SQLite's
    ALTER TABLE page describes for constraint changes (writable_schema, then a new
    schema_version), with no copy of the table.

    Raises:
        sqlite3.DatabaseError: the messages table's SQL does not have the expected CHECK.
    """
    conn.execute("ALTER TABLE messages ADD COLUMN tool_json TEXT NULL")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'").fetchone()[0]
    if _OLD_ROLES not in sql:
        raise sqlite3.DatabaseError("the messages table has not the role CHECK this migration widens")
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'messages'",
                     (sql.replace(_OLD_ROLES, _NEW_ROLES),))
        conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")


_PLAIN_KEY = re.compile(r"\bid\s+INTEGER\s+PRIMARY\s+KEY\s*,")


def _migration_ids_never_reused(conn: sqlite3.Connection) -> None:
    """Conversation and message ids are never given out again after a delete (the CLI and
    the API name messages by id: a ``regenerate 21`` noted before a delete must not reach
    another chat). A plain ``INTEGER PRIMARY KEY`` takes the largest id plus one, so
    deleting the newest chat freed its ids; ``AUTOINCREMENT`` keeps the largest id ever
    used in ``sqlite_sequence`` (https://sqlite.org/autoinc.html). The keyword changes how a
    new rowid is chosen, not how rows are stored, so the tables' SQL is edited in place as
    in :func:`_migration_tools`; ``sqlite_sequence`` (made by SQLite with the first
    AUTOINCREMENT table, here a throwaway one) starts at each table's largest id.

    Raises:
        sqlite3.DatabaseError: a table's SQL does not have the expected key.
    """
    conn.execute("CREATE TABLE branchwise_sequence_probe (id INTEGER PRIMARY KEY AUTOINCREMENT)")
    conn.execute("DROP TABLE branchwise_sequence_probe")
    rows = dict(conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN ('conversations', 'messages')"))
    version = conn.execute("PRAGMA schema_version").fetchone()[0]
    conn.execute("PRAGMA writable_schema = ON")
    try:
        for name in ("conversations", "messages"):
            sql, n = _PLAIN_KEY.subn("id INTEGER PRIMARY KEY AUTOINCREMENT,", rows.get(name, ""), count=1)
            if n != 1:
                raise sqlite3.DatabaseError(f"the {name} table has not the id key this migration changes")
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (sql, name))
        conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    for name in ("conversations", "messages"):
        conn.execute("INSERT INTO sqlite_sequence(name, seq) SELECT ?, coalesce(max(id), 0) FROM " + name, (name,))


MIGRATIONS: list[Migration] = [_migration_1, _migration_2, _migration_import_sources, _migration_reasoning,
                                _migration_attachments, _migration_chat_models, _migration_tools,
                                _migration_ids_never_reused]
"""Ordered migrations; ``MIGRATIONS[i]`` moves the schema from version i to i + 1."""


def schema_version(conn: sqlite3.Connection) -> int:
    """Return ``PRAGMA user_version``: how many migrations have been applied."""
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, where: str) -> int:
    """Apply the migrations ``conn`` has not seen yet, in one write transaction.

    ``conn`` must be in autocommit mode (``isolation_level=None``) with a busy
    timeout; ``where`` names the file in error messages. Safe when many processes
    open the same file at once: the version is read again under ``BEGIN
    IMMEDIATE`` (the write lock), so only one of them migrates. Returns the schema
    version afterwards.

    Raises:
        StorageError: the file was written by a newer Branchwise (its version
            is higher than ``len(MIGRATIONS)``).
        sqlite3.OperationalError: the lock was not granted within the busy timeout.
    """
    if _checked_version(conn, where) == len(MIGRATIONS):
        return len(MIGRATIONS)
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _checked_version(conn, where)  # another opener may have migrated meanwhile
        for target in range(version + 1, len(MIGRATIONS) + 1):
            MIGRATIONS[target - 1](conn)
            conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return schema_version(conn)


def _checked_version(conn: sqlite3.Connection, where: str) -> int:
    version = schema_version(conn)
    if version > len(MIGRATIONS):
        raise StorageError(
            f"{where} was saved by a newer version of Branchwise (schema {version}; "
            f"this version knows up to {len(MIGRATIONS)}). Update Branchwise to open it."
        )
    return version
