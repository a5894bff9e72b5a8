"""Chat titles by the loaded model: after a chat's first reply, the model writes a 3-6 word
title in the background (``engine/title.py``), off the critical path.

The request is a ``TitleRequest``: in the engine process it runs only when no other
request waits, stops between decode steps as soon as one arrives (a send, a prewarm, a
count) and runs again after them, so it never holds a reply back by more than one decode
step; while a draft the prewarm prepared is live, it waits until the reply that uses it. It
runs on sequence 0 and its KV is never stored: no chat's prefix-store entries
change (the chat's own prompt is its prefix, so the next turn still finds the chat's KV
live). A title that :func:`engine.title.usable_title` refuses leaves the first words
(``storage.chat_text.auto_title``). A title the user gave wins: the model's is written only
while the chat still has the title it had when the job started, and that was its first
words.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from app.session import ConversationSession
from app.window.flows.model_controller import ModelState
from engine.events import TitleEvent
from engine.title import usable_title
from storage.chat_text import auto_title
from storage.errors import StorageError

log = logging.getLogger(__name__)


class TitleJob(QObject):
    """Titles for ``chat``'s chats on ``model``'s engine; the path is read with ``reader``.

    Signal ``titled(conversation id, title or "", what the model wrote)`` when a job ended
    ("": the first words stay). ``handle``: the request in flight (tests), or None."""

    titled = Signal(int, str, str)

    def __init__(self, *, chat, model, reader, parent: QObject):
        super().__init__(parent)
        self.chat, self.model, self.reader = chat, model, reader
        self.handle = None
        self._asked: set[int] = set()  # chats asked for in this window's life
        chat.reply_finished.connect(self.reply_finished)

    def reply_finished(self, message_id: int) -> None:
        """A reply was saved: ask for a title when it is its chat's first and the chat still
        has its first words as title."""
        if not message_id or self.model.state != ModelState.READY or (self.model.facts or {}).get("remote"):
            return
        store = self.chat.store
        try:
            reply = store.get_message(message_id)
            user = store.get_message(reply.parent_id) if reply.parent_id is not None else None
            if reply.role != "assistant" or not reply.content or user is None or user.parent_id is not None:
                return
            conv = store.get_conversation(reply.conversation_id)
        except StorageError:
            return
        cid = conv.id
        if cid in self._asked or conv.title != auto_title(user.content):
            return
        self._asked.add(cid)
        expected, first = conv.title, user.content

        def job(reader_store):  # on the reader thread: the chat's messages up to this reply
            return ConversationSession(reader_store).prompt(message_id)

        self.reader.submit(f"title-{cid}", job, lambda messages: self._send(cid, messages, expected, first),
                           lambda exc: log.info("no title: %s", exc))

    def _send(self, cid: int, messages, expected: str, first: str) -> None:
        if self.model.state != ModelState.READY:
            return
        handle = self.handle = self.model.client.title(messages)
        if handle is None:
            return
        handle.done.connect(lambda event: self._answered(cid, event, expected, first))
        handle.failed.connect(lambda e: log.info("title failed: %s", e.message))

    def _answered(self, cid: int, event: TitleEvent, expected: str, first: str) -> None:
        self.handle = None
        title = usable_title(event.text, first) if event.finished else None
        try:
            if title and self.chat.store.get_conversation(cid).title == expected:  # not renamed meanwhile
                self.chat.store.rename(cid, title)
                self.chat.chats_changed.emit()
                self.chat.refresh_title()
            else:
                title = None
        except StorageError as exc:
            log.info("the title was not saved: %s", exc)
            title = None
        self.titled.emit(cid, title or "", event.text)
