"""What the window does with one message or the shown branch, beside sending: delete a
message with its replies (undoable from the banner) and copy the shown branch as Markdown
(``MessageActions``; the Markdown is ``app.session.markdown_export``).

Deleting is carried out at once (``ChatStore.deletion.delete_subtree``, one transaction) and the
removed messages are kept in memory: Undo in the banner puts them back
(``ChatStore.deletion.restore_messages``, new ids, the same text, token ids and stats, so their KV
cache is found again). The undo lasts until the next message delete or until the window
closes. As for a deleted chat, a task then scrubs the deleted text out of the search
index and the WAL.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtGui import QGuiApplication

from app.session.markdown_export import branch_markdown
from app.window.shell.banner import Banner
from app.window.shell.status_bar import StatusBar
from app.window.workers.scrub import scrub_deleted
from app.window.workers.tasks import Workers
from storage.chats import ChatStore
from storage.errors import NotFoundError, StorageError

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)


class MessageActions(QObject):
    """The message actions (see the module docstring) on ``store``, for ``chat``'s shown
    branch; ``banner`` offers Undo, ``status`` confirms a copy, ``workers`` scrubs."""

    def __init__(self, *, store: ChatStore, chat: ChatController, banner: Banner, status: StatusBar,
                 workers: Workers, parent: QObject | None = None):
        super().__init__(parent)
        self.store, self.chat, self.banner, self.status, self.workers = store, chat, banner, status, workers
        self._deleted_messages: tuple = ()  # what Undo puts back
        self._deleted_active_leaf: int | None = None

    def delete_message(self, message_id: int) -> None:
        """Delete ``message_id`` and every reply under it; the banner offers Undo."""
        chat = self.chat
        if chat.streaming:
            self.banner.show_message("Wait for the reply to finish (or stop it) before deleting a message.",
                                     "info", chat_id=chat.conversation_id)
            return
        try:
            cid = self.store.get_message(message_id).conversation_id
            leaf = self.store.get_conversation(cid).active_leaf_id
            removed = self.store.deletion.delete_subtree(message_id)
        except StorageError as exc:
            self.banner.storage_failed(exc)
            return
        self._deleted_messages, self._deleted_active_leaf = removed, leaf
        scrub_deleted(self.workers, self.store.path)  # Undo puts back the copies held here
        chat.render()
        chat.figures.refresh_coverage()
        n = len(removed)
        what = "1 message" if n == 1 else f"{n:,} messages"
        self.banner.show_message(f"Deleted {what}.", "info", [("Undo", self.undo_message_delete)], chat_id=cid)

    def undo_message_delete(self) -> None:
        """Put back the messages of the last message delete (see the module docstring)."""
        removed, self._deleted_messages = list(self._deleted_messages), ()
        if not removed:
            return
        try:
            self.store.deletion.restore_messages(removed, self._deleted_active_leaf)
        except NotFoundError:
            self.banner.show_message("The deleted messages cannot be put back: the message they "
                                     "answered is gone too.", "error")
            return
        except StorageError as exc:
            self.banner.storage_failed(exc)
            return
        if self.chat.conversation_id == removed[0].conversation_id:
            self.chat.render()
            self.chat.figures.refresh_coverage()

    def copy_conversation_markdown(self) -> None:
        """Copy the shown branch as Markdown (Chat menu and the message's menu)."""
        cid = self.chat.conversation_id
        if cid is None:
            return
        QGuiApplication.clipboard().setText(branch_markdown(self.store, cid))
        self.status.flash("Copied this branch as Markdown.", 4000)
