"""The token ids of the replies the server generated, keyed by their text.

A client resends a reply as text. Re-tokenizing a generated reply often gives other ids
than the ones the model produced (BPE has many spellings of one string), and then the
prompt stops being a token-prefix of what the prefix store holds at the first reply.
So the server remembers, per model, which ids each reply it sent was made of, and a
resent reply contributes those ids (:mod:`engine.chat_template`, "prefix stability").
The memory is a small SQLite file next to the prefix store, so it survives a restart as
the store does; it holds reply texts, so it lives in the user's data folder and is
bounded (oldest rows go first). A row is used only for the exact text and model it was
written for, and its ids are checked to decode to that text before they are stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sqlite3
import threading
from array import array
from pathlib import Path

from app.serve.tool_protocol import calls_key

log = logging.getLogger(__name__)

FILE_NAME = "serve-replies.sqlite3"
MAX_ROWS = 20_000


class ReplyMemory:
    """``remember(model_key, text, ids)`` / ``recall(model_key, text) -> ids | None``.

    Never raises for a damaged or full file: the memory is an optimisation, and a miss
    only means the resent reply is tokenized from its text (and prefilled).
    """

    def __init__(self, path: Path | None, max_rows: int = MAX_ROWS):
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._mem: dict[bytes, bytes] = {}
        if path is None:
            return
        try:
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key BLOB PRIMARY KEY, ids BLOB NOT NULL, "
                             "used INTEGER NOT NULL)")
        except sqlite3.Error as exc:
            log.warning("reply memory %s unusable (%s); resent replies will be re-tokenized", path, exc)
            self._db = None

    @staticmethod
    def _key(model_key: bytes, text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20, key=model_key[:64]).digest()

    def remember(self, model_key: bytes, text: str, ids: list[int]) -> None:
        if not text or not ids:
            return
        key, blob = self._key(model_key, text), array("i", ids).tobytes()
        with self._lock:
            if self._db is None:
                self._mem[key] = blob
                if len(self._mem) > self.max_rows:
                    self._mem.pop(next(iter(self._mem)))
                return
            try:
                self._db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, "
                                 "(SELECT IFNULL(MAX(used), 0) + 1 FROM replies))", (key, blob))
                self._db.execute("DELETE FROM replies WHERE used <= (SELECT MAX(used) FROM replies) - ?",
                                 (self.max_rows,))
            except sqlite3.Error as exc:
                log.warning("reply memory not written: %s", exc)

    def recall(self, model_key: bytes, text: str) -> list[int] | None:
        key = self._key(model_key, text)
        with self._lock:
            if self._db is None:
                blob = self._mem.get(key)
            else:
                try:
                    row = self._db.execute("SELECT ids FROM replies WHERE key = ?", (key,)).fetchone()
                except sqlite3.Error:
                    row = None
                blob = row[0] if row else None
        if blob is None:
            return None
        ids = array("i")
        try:
            ids.frombytes(blob)
        except (ValueError, TypeError):  # a damaged row
            return None
        return ids.tolist()

    def resent(self, model_key: bytes, messages: list, spell) -> list:
        """``messages`` (``ChatMessage``) with every assistant reply this server generated
        given its generated ids; a reply of tool calls is found by its calls
        (``tool_protocol.calls_key``) and then stands as those ids alone, without the
        calls (the template would render them a second time), its content being
        ``spell(ids)``, the text those ids decode to: the engine uses a reply's ids only
        when they spell its content (``engine.generated_ids``), and the call's markup is
        in the ids, not in the content the client sent."""
        out = []
        for m in messages:
            if m.role != "assistant":
                out.append(m)
                continue
            if m.tool_calls:
                ids = self.recall(model_key, calls_key(m.content, m.tool_calls))
                out.append(dataclasses.replace(m, token_ids=ids, tool_calls=None, content=spell(ids)) if ids else m)
                continue
            out.append(dataclasses.replace(m, token_ids=self.recall(model_key, m.content)))
        return out

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
