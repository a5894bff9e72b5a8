"""What the user asks of the shown chat from the composer, a bubble, the tree or a menu:
``ChatCommands``, the one entry point in front of ``ChatController``.

Each change to the chats (a send, an edit, a regeneration, a fork) is held while an import
writes to the database (``ImportController.hold``: the importer holds the write lock for a
whole file) and carried out when it ends; otherwise it goes to the ``ChatController`` at
once. The menu's "last message" commands and Restart engine are here too.
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from app.session import ReplyState
from app.window.flows.import_dialog import ImportController
from app.window.flows.model_controller import ModelController
from app.window.transcript.chat_controller import ChatController
from app.window.transcript.transcript_view import TranscriptView


class ChatCommands(QObject):
    """The commands on ``chat``, held by ``importer`` while it writes; ``transcript`` has the
    bubbles Edit last opens, ``model`` the engine Restart engine restarts."""

    def __init__(self, *, chat: ChatController, importer: ImportController, transcript: TranscriptView,
                 model: ModelController, parent: QObject | None = None):
        super().__init__(parent)
        self.chat, self.importer, self.transcript, self.model = chat, importer, transcript, model

    def send(self, text: str) -> None:
        """Send ``text`` (``ChatController.send``); during an import, when it ends."""
        if not self.importer.hold(lambda: self.chat.send(text), "your message will be sent"):
            self.chat.send(text)

    def edit(self, message_id: int, text: str) -> None:
        if not self.importer.hold(lambda: self.chat.edit(message_id, text), "your edit will be sent"):
            self.chat.edit(message_id, text)

    def regenerate(self, message_id: int) -> None:
        if not self.importer.hold(lambda: self.chat.regenerate(message_id), "the reply will be regenerated"):
            self.chat.regenerate(message_id)

    def fork(self, message_id: int) -> None:
        if not self.importer.hold(lambda: self.chat.fork(message_id), "the fork will be made"):
            self.chat.fork(message_id)

    def _last_message_id(self) -> int | None:
        cid = self.chat.conversation_id
        if cid is None:
            return None
        path = self.chat.store.active_path(cid)
        return path[-1].id if path else None

    def regenerate_last(self) -> None:
        mid = self._last_message_id()
        if mid is not None:
            self.regenerate(mid)

    def fork_last(self) -> None:
        mid = self._last_message_id()
        if mid is not None:
            self.fork(mid)

    def edit_last(self) -> None:
        """Open the inline editor on the last user message shown (not while a reply streams)."""
        if self.chat.streaming:
            return
        w = next((w for w in reversed(self.transcript.widgets) if w.role == "user" and w.message), None)
        if w is not None:
            w.begin_edit()

    def restart_engine(self) -> None:
        """A new engine process; a reply in progress is saved as stopped first."""
        if self.chat.streaming:
            self.chat.abandon(ReplyState.STOPPED)
        self.model.restart()
