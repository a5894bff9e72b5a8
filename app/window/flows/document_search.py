""""Search the document": the "too long" dialog's choice for attached files that do not fit
(``branchwise chat --search-document`` in the window).

The files' stored passages (SQLite FTS5, BM25 over the trigram index,
``AttachmentStore.best_passages``) are ranked for the question's words
(``engine.documents.passages.query_terms``) on a worker thread over its own connection; the
best that fit the room left (at ``SEARCH_CHARS_PER_TOKEN``) are taken, the prompt with them
is counted by the engine, and the lowest-ranked passage is dropped until it fits. Then the
message is sent as any other (``ChatController.store_and_reply``): the request holds the
chosen passages in document order, each under ``[Passage N, page P]``, and the message keeps
which were sent, so its follow-ups render the same ones and its reply's footer names them.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from app.session.overflow import reply_room
from app.window.flows.attach_flow import AttachFlow
from app.window.workers.tasks import Workers
from engine.documents.passages import SEARCH_CHARS_PER_TOKEN, query_terms
from engine.documents.render import Passage
from storage.attachments import AttachmentStore

log = logging.getLogger(__name__)

RANKED_PASSAGES = 64
"""Passages ranked per file (the best first); more never fit a context this window offers."""


class DocumentSearch(QObject):
    """The search for ``chat``'s unsent message with ``flow``'s files (``start``); ranking on
    ``workers``. Signal ``failed(sentence)``: even the question alone does not fit."""

    failed = Signal(str)

    def __init__(self, *, chat, flow: AttachFlow, workers: Workers, parent: QObject | None = None):
        super().__init__(parent)
        self.chat, self.flow, self.workers = chat, flow, workers
        self.searching = False  # True from ``start`` until the message is sent or refused

    def start(self, unsent: tuple, n_ctx: int, prompt_tokens: int, max_tokens: int) -> None:
        """Search the files for ``unsent`` = (conversation id or None, question, new chat
        settings), whose prompt with the whole files is ``prompt_tokens`` of ``n_ctx``."""
        cid, text, _new_chat = unsent
        items = self.flow.ready
        if not items:
            self.chat.composer.set_text(text)
            return
        limit = n_ctx - reply_room(n_ctx, max_tokens)
        whole = self.flow.document_tokens()
        if whole is None:  # not counted yet: estimated from the characters
            whole = int(self.flow.blocks_chars() / SEARCH_CHARS_PER_TOKEN)
        base = max(0, prompt_tokens - whole)
        budget_chars = int(max(0, limit - base) * SEARCH_CHARS_PER_TOKEN / len(items))
        terms, shas, db = query_terms(text), [i.doc.sha256 for i in items], self.chat.store.path
        self.searching = True
        self.chat.composer.set_streaming(True)
        self.chat.status.stats_label.setText("Searching the document…")

        def job(_task) -> list[list[Passage]]:  # a worker thread: BM25 over the trigram index
            attachments = AttachmentStore(db)
            try:
                chosen = []
                for sha in shas:
                    picked, used = [], 0
                    for p in attachments.best_passages(sha, terms, RANKED_PASSAGES):
                        if used + len(p.text) <= budget_chars:
                            picked.append(Passage(p.number, p.page, p.text))
                            used += len(p.text)
                    chosen.append(picked)
                return chosen
            finally:
                attachments.close()

        def ranked(chosen: list[list[Passage]]) -> None:
            for item, picked in zip(items, chosen, strict=True):
                item.passages = picked
            self._fit(unsent, limit, base, items)

        def failed(exc: Exception) -> None:
            log.warning("document search failed: %s", exc)
            self._refuse(unsent, f"The document could not be searched (chats.sqlite3): {exc}.")

        if self.workers.start(job, name="search the document", success=ranked, failure=failed) is None:
            self._refuse(unsent, "")

    def _fit(self, unsent: tuple, limit: int, base: int, items: list) -> None:
        """Count the prompt with the chosen passages; drop the lowest-ranked until it fits."""
        cid, text, new_chat = unsent
        system = new_chat[0] if cid is None and new_chat else ""
        try:
            messages, _ids = self.chat.session.prompt_for_send(cid, text, system)
        except Exception as exc:  # noqa: BLE001 - StorageError: said, the text kept
            self._refuse(unsent, f"Your message could not be prepared: {exc}.")
            return
        handle = self.chat.model.client.count(messages)
        if handle is None:
            self._refuse(unsent, "")
            return

        def counted(event) -> None:
            if event.prompt_tokens <= limit:
                self._send(unsent, event.prompt_tokens - base, items)
            elif any(i.passages for i in items):
                longest = max(items, key=lambda i: len(i.passages or []))
                longest.passages.pop()  # ranked best first: the last is the weakest match
                self._fit(unsent, limit, base, items)
            else:
                self._refuse(unsent, "Even without the attached files' text this message does not fit the "
                                     f"context window ({limit:,} tokens before the reply); raise the context size "
                                     "in Settings or shorten the message.")

        handle.done.connect(counted)
        handle.failed.connect(lambda e: self._refuse(unsent, e.message or "The engine could not count the message."))

    def _send(self, unsent: tuple, tokens: int, items: list) -> None:
        chars = [sum(len(p.text) for p in i.passages or []) for i in items]
        for item, n in zip(items, chars, strict=True):  # the passages' share of the tokens, by their characters
            item.tokens = int(max(0, tokens) * n / sum(chars)) if sum(chars) else 0
        self._done()
        self.chat.store_and_reply(*unsent)

    def _refuse(self, unsent: tuple, sentence: str) -> None:
        for item in self.flow.items:
            item.passages = None
        self._done()
        self.chat.composer.set_text(unsent[1])
        if sentence:
            self.flow.bar.show_note(sentence)
            self.failed.emit(sentence)

    def _done(self) -> None:
        self.searching = False
        self.chat.composer.set_streaming(False)
        self.chat.status.stats_label.setText("")
