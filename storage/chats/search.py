"""Search: conversations whose title and messages hold every word of a query, and the
message that matched best, with a plain-text snippet and the spans of the words.

Words of three or more characters are looked up in the FTS5 trigram index
(``storage.chat_schema.SEARCH_TOKENIZER``); shorter ones scan the text with LIKE. A word
is looked for in its composed and decomposed Unicode forms."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from storage.chat_records import Conversation
from storage.chat_text import mark_spans, search_terms, snippet_spans
from storage.chats import queries
from storage.chats.connection import Part

_TRIGRAM = 3  # shortest term the trigram index can find; shorter ones are scanned (LIKE)


@dataclass(frozen=True)
class SearchHit:
    """One conversation found by ``ChatStore.search_hits``: ``message_id`` is the message
    that matched best (None: only the title matched), ``snippet`` a one-line excerpt of it
    (plain text) and ``spans`` the (start, end) character ranges of the words in it;
    ``in_reasoning`` says the words were found in the message's reasoning only."""

    conversation: Conversation
    message_id: int | None
    snippet: str
    spans: list[tuple[int, int]]
    in_reasoning: bool = False  # the snippet is from the message's reasoning, not its answer


class Search(Part):
    """The store's search (``ChatStore.search`` and ``ChatStore.search_hits``)."""

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
            conversations = queries.conversations_where(
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
            texts = {row[0]: row[1:] for row in self._conn.execute(
                f"SELECT id, content, reasoning FROM messages WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).fetchall()} if ids else {}
        hits = []
        for c in conversations:
            mid = best[c.id][1] if c.id in best else None
            text, in_reasoning = c.title, False
            if mid is not None:
                text, in_reasoning = _hit_text(*texts[mid], terms)
            piece, spans = snippet_spans(text, terms)
            hits.append(SearchHit(c, mid, piece, spans, in_reasoning))
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
        sql = (r"SELECT id, conversation_id FROM messages WHERE content LIKE ?1 ESCAPE '\'"
               r" OR reasoning LIKE ?1 ESCAPE '\'")
        return dict(self._conn.execute(sql, (_like(term),)).fetchall())

    def _quote(self, term: str) -> str:
        """``term`` as one FTS5 string (sqlite-utils' quoting: syntax characters are text)."""
        return self._db.quote_fts(term.replace('"', " "))


def _forms(term: str) -> list[str]:
    """``term`` in its composed (NFC) and decomposed (NFD) Unicode forms, without repeats:
    stored text keeps the form it was typed or pasted in."""
    forms = [term, unicodedata.normalize("NFC", term), unicodedata.normalize("NFD", term)]
    return list(dict.fromkeys(forms))


def _hit_text(content: str, reasoning: str | None, terms: list[str]) -> tuple[str, bool]:
    """The text a search snippet is cut from: the reasoning when it holds more of the words
    of ``terms`` (any case) than the answer, else the answer; ``(text, from_reasoning)``."""
    if not reasoning:
        return content, False

    def held(text: str) -> int:
        folded = text.casefold()
        return sum(t.casefold() in folded for t in terms)

    return (reasoning, True) if held(reasoning) > held(content) else (content, False)


def _like(term: str) -> str:
    """A LIKE pattern finding ``term`` anywhere (``\\`` escapes ``%`` and ``_``)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
