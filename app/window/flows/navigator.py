"""Which chat the window shows, and what it does when that cannot stay as it is: ``Navigator``.

- Showing a chat so that nothing its data holds can stop the window: a chat whose data
  cannot be shown (an error of any kind while reading or drawing it, now or in its tree
  panel's layout, which is read off the UI thread) is replaced by the empty page, with a
  banner that names the chat; at start, the newest chat that can be shown is opened.
- Another process (the CLI, a second window) or a worker wrote to the chats: coming back to
  the window, or sending on a branch that moved (``ChatController.changed_elsewhere``), the
  sidebar and the shown branch are drawn again.
- A search hit opens its branch scrolled to the message; a deleted chat is moved away from,
  with Undo in the banner.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from app.window.shell.banner import Banner
from app.window.shell.lifetime import Lifetime
from app.window.transcript.chat_controller import ChatController
from app.window.transcript.composer import Composer
from app.window.transcript.transcript_view import TranscriptView
from app.window.tree.sidebar import FORGET_NOTE, Sidebar
from storage.chats import ChatStore
from storage.errors import NotFoundError, StorageError

log = logging.getLogger(__name__)


class Navigator(QObject):
    """Shows chats of ``store`` through ``chat``; follows and refreshes ``sidebar``; says why in
    ``banner``; scrolls ``transcript`` to a search hit; focuses ``composer`` for a new chat;
    does nothing once ``lifetime`` is closed."""

    def __init__(self, *, store: ChatStore, chat: ChatController, sidebar: Sidebar, banner: Banner,
                 transcript: TranscriptView, composer: Composer, lifetime: Lifetime, parent: QObject | None = None):
        super().__init__(parent)
        self.store, self.chat, self.sidebar, self.banner = store, chat, sidebar, banner
        self.transcript, self.composer, self.lifetime = transcript, composer, lifetime
        self._opening: list[int] | None = None  # at start: the chats still to try, newest first
        self._start_chat: int | None = None  # the chat shown at start
        self._data_version = store.data_version()  # to notice other processes' writes
        self._undo_text = ""  # the banner text that offers to undo a delete

    # -- showing ---------------------------------------------------------------------------

    def show_conversation(self, conversation_id: int | None, _at_start: bool = False) -> bool:
        """Show the active path of ``conversation_id`` (None: the empty new-chat page).
        Returns False when it cannot be shown (see ``chat_unshowable``)."""
        if not _at_start:
            self._opening = self._start_chat = None  # the start is over: no next chat to try
        try:
            self.chat.show_conversation(conversation_id)
            if self.banner.chat_id is not None and self.banner.chat_id != conversation_id:
                self.banner.hide()  # it was about the chat shown before
            return True
        except Exception as exc:  # noqa: BLE001 - whatever the data holds, the window stays up
            if conversation_id is None:
                raise
            self.chat_unshowable(conversation_id, exc)
            return False

    def new_chat(self) -> None:
        """Show an empty chat; it is created when the first message is sent."""
        self.show_conversation(None)
        self.composer.input.setFocus()

    def chat_unshowable(self, conversation_id: int, exc: Exception) -> None:
        """``conversation_id`` could not be shown because of ``exc``: unless another chat is
        shown by now, show the empty page (at start: the next chat that can be shown) and a
        banner that names it. The chat is left unchanged, still listed, so it can be deleted."""
        if self.lifetime.closed or self.chat.conversation_id not in (conversation_id, None):
            return
        log.error("could not show chat %s", conversation_id, exc_info=exc)
        try:
            title = self.store.get_conversation(conversation_id).title
        except Exception:  # noqa: BLE001
            title = f"chat {conversation_id}"
        if self._opening is not None and conversation_id == self._start_chat:
            self._open_next()  # the chat opened at start failed late (its tree): try the next
        else:
            self.chat.show_conversation(None)
        self.banner.show_message(
            f"The chat “{title}” could not be shown ({type(exc).__name__}); it is left "
            "unchanged. Export it from the command line (branchwise conversations export) "
            "or delete it.", "error")

    def open_newest(self) -> None:
        """At start: show the newest chat that can be shown (see ``show_conversation``)."""
        self._opening = self.sidebar.ids()
        self._open_next()

    def _open_next(self) -> None:
        """At start: show the next chat that can be shown, else the empty page."""
        while self._opening:
            cid = self._opening.pop(0)
            if self.show_conversation(cid, _at_start=True):
                self._start_chat = cid
                return
        self._opening = self._start_chat = None
        self.show_conversation(None, _at_start=True)

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

    # -- changes made elsewhere --------------------------------------------------------------

    def show_external_changes(self) -> bool:
        """Coming back to the window, or sending: if another process (the CLI, a second
        window) or a worker wrote to the chats since, redraw the sidebar and the shown
        branch. Returns True when it did."""
        try:
            version = self.store.data_version()
        except StorageError:
            return False
        seen, self._data_version = self._data_version, version
        if version == seen or self.chat.streaming:
            return False
        self.sidebar.refresh()
        cid = self.chat.conversation_id
        if cid is not None:
            try:
                self.store.get_conversation(cid)
            except NotFoundError:  # deleted by the other process
                cid = None
            self.show_conversation(cid)
        return True

    def changed_elsewhere(self, conversation_id: int, text: str) -> None:
        """A send of ``text`` found the shown branch moved since it was drawn (another process
        added to it or moved it): redraw it, put ``text`` back in the box and say so."""
        self.show_external_changes()
        self.chat.render()
        self.composer.set_text(text)
        self.banner.show_message(
            "This chat was changed elsewhere (the command line or another Branchwise window) and is now shown as "
            "it is. Your message is still in the box: send it again to add it at the end.", "info",
            chat_id=conversation_id)

    # -- deleting a chat -----------------------------------------------------------------------

    def conversation_deleted(self, cid: int) -> None:
        """The sidebar hid ``cid`` (its delete is pending): move away from it, offer Undo."""
        try:
            title = self.store.get_conversation(cid).title
        except StorageError:
            title = "the chat"
        if cid == self.chat.conversation_id:
            ids = self.sidebar.ids()
            self.show_conversation(ids[0] if ids else None)
        self._undo_text = f"Deleted “{title}”."
        if self.sidebar.pending_forget:
            self._undo_text += f" When Undo goes, it is forgotten: {FORGET_NOTE}"
        self.banner.show_message(self._undo_text, "info", [("Undo", self.sidebar.undo_delete)])

    def delete_committed(self, _cid: int) -> None:
        """The delete is carried out: Undo is no longer offered."""
        if self.banner.isVisible() and self.banner.text == self._undo_text:
            self.banner.hide()
