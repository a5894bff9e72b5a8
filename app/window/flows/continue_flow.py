"""Continue: more of a reply that was stopped (Stop, Esc) or cut at max tokens, appended to
the same message (``app/session/continuation.py`` says which replies can go on).

The request's prompt is the history's prompt plus the reply's token ids so far
(``EngineClient.generate(reply_prefix=...)``): the reply's KV was stored when it ended, so
the prefix store restores all of it but the last two tokens, and the engine goes on from
there. The reply streams into its own bubble (``ChatController.start_reply`` with a
``ContinuationRecorder``), with the text it had.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from app.session.continuation import ContinuationRecorder, can_continue
from app.window.transcript.chat_controller import ChatController
from storage.errors import StorageError

log = logging.getLogger(__name__)


class ContinueFlow(QObject):
    """Continue on ``chat``: from a bubble's Continue button (``transcript.continue_requested``)
    or Chat → Continue reply (the shown branch's last message)."""

    def __init__(self, chat: ChatController, parent: QObject | None = None):
        super().__init__(parent or chat)
        self.chat = chat

    def continue_last(self) -> None:
        """Continue the shown branch's last message, when it is a reply that can go on."""
        chat = self.chat
        if chat.conversation_id is None or chat.streaming:
            return
        try:
            path = chat.store.active_path(chat.conversation_id)
        except StorageError:
            return
        if path and can_continue(path[-1]):
            self.continue_reply(path[-1].id)
        else:
            chat.banner.show_message("The last reply ended on its own; only a reply that was stopped or hit "
                                     "max tokens can be continued.", "info")

    def continue_reply(self, message_id: int) -> bool:
        """Start the continuation of reply ``message_id``; False when it cannot start (a reply
        streams, no model, the reply cannot be continued, the database cannot be written)."""
        chat = self.chat
        if not chat.can_generate():
            return False
        try:
            message = chat.store.get_message(message_id)
            if not can_continue(message) or message.parent_id is None:
                return False
            sampling = dict(chat.store.get_conversation(message.conversation_id).sampling)
            messages = chat.session.prompt(message.parent_id)
        except StorageError as exc:
            chat.banner.show_message(f"The reply could not be continued: {exc}", "error")
            return False
        chat.timeline.start()
        handle = chat.client.generate(messages, sampling, use_cache=chat.use_cache,
                                      reply_prefix=list(message.token_ids))
        if handle is None:
            return False
        try:
            recorder = ContinuationRecorder(chat.store, message, chat.model.label)
        except StorageError as exc:
            chat.client.cancel(handle)
            chat.banner.show_message(f"The reply could not be continued: {exc}", "error")
            return False
        chat.start_reply(message.parent_id, handle, reply=recorder)
        return True
