"""Attachments between the store and the prompt: store a ``Document``, link it to a message,
and render a path's user messages with their attachments for the engine.

The person's own text stays the message's ``content`` (what the window shows, searches and
exports as the message); ``prompt_messages`` puts each attached block before it
(``engine.documents.render``) whenever a prompt is built, so every prompt of every front end
(CLI, window, prewarm, token counts, ``engine.forget``) sees the same text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from engine.chat_template import ChatMessage, conversation_messages
from engine.documents.passages import cut, pages_of, query_terms
from engine.documents.render import AttachedText, Passage, render_message
from engine.documents.sandbox import Document
from storage.attachments import AttachmentStore, StoredAttachment, for_chats


def attached_text(doc: Document, passages: Sequence[Passage] | None = None) -> AttachedText:
    """What ``doc`` renders as: the whole text, or (``passages``) those passages only."""
    e = doc.extracted
    return AttachedText(doc.name, e.kind, e.pages, e.paged, None if passages is None else tuple(passages))


def stored_text(a: StoredAttachment) -> AttachedText:
    """What a stored attachment renders as (the passages sent, when it was searched)."""
    passages = [Passage(p.number, p.page, p.text) for p in a.passages]
    pages = pages_of(passages, a.paged)
    sent = None
    if a.sent is not None:
        by_number = {p.number: p for p in passages}
        sent = tuple(by_number[n] for n in a.sent if n in by_number)
    return AttachedText(a.name, a.kind, pages, a.paged, sent)


def store(chats, doc: Document) -> None:
    """Store ``doc`` in ``chats``'s database once (its passages, its original when small
    enough); nothing is written when the same bytes are already stored."""
    put(for_chats(chats), doc)


def put(attachments: AttachmentStore, doc: Document) -> bool:
    """``store`` on a given ``AttachmentStore`` (e.g. a worker thread's own connection);
    False when the same bytes were stored already."""
    e = doc.extracted
    passages = [(p.number, p.page, p.text) for p in cut(e.pages, e.paged)]
    return attachments.put(doc.sha256, doc.name, e.kind, e.paged, doc.size, e.images, e.encoding,
                           passages, doc.data)


def link(chats, message_id: int, docs: Sequence[Document],
         sent: Sequence[Sequence[int] | None] | None = None) -> None:
    """Attach the stored ``docs`` to ``message_id`` in order; ``sent[i]`` lists the passage
    numbers sent for ``docs[i]`` (None: the whole text)."""
    sent = list(sent) if sent is not None else [None] * len(docs)
    for_chats(chats).link(message_id, [(d.sha256, d.name, s) for d, s in zip(docs, sent, strict=True)])


STATS_KEY = "attachments"
"""The key of a user message's stats under which its attachments' figures are kept: a list,
in order, of ``{"name", "sha256", "kind", "pages", "tokens", "passages"}`` (``passages``:
None for the whole text, else ``[{"number", "page"}]`` sent), what the chips show."""


def link_message(chats, message_id: int, docs: Sequence[Document], sent: Sequence[Sequence[int] | None],
                 info: Sequence[dict]) -> None:
    """``link`` the stored ``docs`` to ``message_id`` and keep ``info`` (one dict per
    document, ``STATS_KEY``'s shape) in the message's stats. Raises sqlite3.Error,
    StorageError."""
    link(chats, message_id, docs, sent)
    if info:
        chats.update_message(message_id, stats={STATS_KEY: [dict(i) for i in info]})


def figures(doc: Document, tokens: int | None, passages: Sequence[Passage] | None = None) -> dict:
    """``STATS_KEY``'s dict for ``doc`` (``tokens``: what its block adds to the prompt)."""
    return {"name": doc.name, "sha256": doc.sha256, "kind": doc.extracted.kind, "pages": doc.pages,
            "tokens": tokens,
            "passages": None if passages is None else [{"number": p.number, "page": p.page} for p in passages]}


def with_attachments(chats, path: Sequence) -> list:
    """``path`` (``storage.chats.Message`` records) with each user message that has
    attachments replaced by a copy whose ``content`` is the rendered message."""
    wanted = [m.id for m in path if m.role == "user"]
    found = for_chats(chats).of_messages(wanted) if wanted else {}
    if not found:
        return list(path)
    return [dataclasses.replace(m, content=render_message(m.content, [stored_text(a) for a in found[m.id]]))
            if m.id in found else m for m in path]


def prompt_messages(chats, system_prompt: str, path: Sequence) -> list[ChatMessage]:
    """``conversation_messages`` of ``path`` with its attachments rendered in."""
    return conversation_messages(system_prompt, with_attachments(chats, path))


def ranked_passages(chats, doc: Document, question: str, limit: int = 64) -> list[Passage]:
    """Up to ``limit`` passages of the stored ``doc`` that match words of ``question``
    (``passages.query_terms``), best first by BM25 over the trigram index. Empty when no
    word of the question is in the document."""
    best = for_chats(chats).best_passages(doc.sha256, query_terms(question), limit=limit)
    return [Passage(p.number, p.page, p.text) for p in best]
