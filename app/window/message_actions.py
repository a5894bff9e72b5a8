"""What the window does with one message or the shown branch, beside sending: open a search
hit on its branch, delete a message with its replies (undoable from the banner), and copy
the shown branch as Markdown (``app.session.markdown_export``).

Deleting is carried out at once (``ChatStore.delete_subtree``, one transaction) and the
removed messages are kept in memory: Undo in the banner puts them back
(``ChatStore.restore_messages``, new ids, the same text, token ids and stats, so their KV
cache is found again). The undo lasts until the next message delete or until the window
closes. As for a deleted chat, a worker then scrubs the deleted text out of the search
index and the WAL.
"""

from __future__ import annotations

import logging

from PySide6.QtGui import QGuiApplication

from app.session.markdown_export import branch_markdown
from app.window.sidebar import scrub_in_background
from storage.errors import NotFoundError, StorageError

log = logging.getLogger(__name__)


class MessageActionsMixin:
    """MainWindow's message actions (see the module docstring). Needs ``store``, ``chat``
    (ChatController), ``transcript``, ``banner`` and ``show_conversation``."""

    _deleted_messages: tuple = ()  # what Undo puts back (set per window by delete_message)
    _deleted_active_leaf: int | None = None

    def changed_elsewhere(self, text: str) -> bool:
        """Before sending ``text``: when the shown chat's branch no longer ends where it did
        when it was drawn (another process added to it or moved it), a message sent now would
        land under messages the user has not seen. Then redraw, put ``text`` back in the box,
        say so, and return True."""
        cid, shown = self.chat.conversation_id, self.chat.shown_leaf
        if cid is None or shown is None or shown[0] != cid:
            return False
        try:
            if self.store.get_conversation(cid).active_leaf_id == shown[1]:
                return False
        except StorageError:
            return False
        self.show_external_changes()
        self.chat.render()
        self.composer.set_text(text)
        self.banner.show_message(
            "This chat was changed elsewhere (the command line or another Branchwise window) and is now shown as "
            "it is. Your message is still in the box: send it again to add it at the end.", "info", chat_id=cid)
        return True

    def open_search_hit(self, conversation_id: int, message_id: int) -> None:
        """Show the branch that holds ``message_id`` (down to its newest leaf), scrolled to
        that message, highlighted."""
        if self.chat.streaming and self.chat.conversation_id == conversation_id:
            self.show_conversation(conversation_id)
        else:
            try:
                self.chat.session.select(message_id)
            except StorageError as exc:
                log.warning("could not open search hit %s: %s", message_id, exc)
            self.show_conversation(conversation_id)
        self.transcript.reveal(message_id)

    def delete_message(self, message_id: int) -> None:
        """Delete ``message_id`` and every reply under it; the banner offers Undo."""
        if self.chat.streaming:
            self.banner.show_message("Wait for the reply to finish (or stop it) before deleting a message.",
                                     "info", chat_id=self.chat.conversation_id)
            return
        try:
            cid = self.store.get_message(message_id).conversation_id
            leaf = self.store.get_conversation(cid).active_leaf_id
            removed = self.store.delete_subtree(message_id)
        except StorageError as exc:
            self.storage_failed(exc)
            return
        self._deleted_messages, self._deleted_active_leaf = removed, leaf
        scrub_in_background(self.store.path)  # Undo puts back the copies held here
        self.chat.render()
        self.chat.figures.refresh_coverage()
        n = len(removed)
        what = "1 message" if n == 1 else f"{n:,} messages"
        self.banner.show_message(f"Deleted {what}.", "info", [("Undo", self.undo_message_delete)], chat_id=cid)

    def undo_message_delete(self) -> None:
        """Put back the messages of the last message delete (see the module docstring)."""
        removed, self._deleted_messages = list(self._deleted_messages), ()
        if not removed:
            return
        try:
            self.store.restore_messages(removed, self._deleted_active_leaf)
        except NotFoundError:
            self.banner.show_message("The deleted messages cannot be put back: the message they "
                                     "answered is gone too.", "error")
            return
        except StorageError as exc:
            self.storage_failed(exc)
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
        self.statusBar().showMessage("Copied this branch as Markdown.", 4000)
