"""Showing a chat so that nothing its data holds can stop the window: ``SafeOpenMixin``
(part of ``MainWindow``)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class SafeOpenMixin:
    """``show_conversation`` and the start's ``_open_newest`` for ``MainWindow``: a chat whose
    data cannot be shown (an error of any kind while reading or drawing it, now or in its
    tree panel's layout, which is read off the UI thread) is replaced by the empty page, with
    a banner that names the chat."""

    _opening: list[int] | None = None  # at start: the chats still to try, newest first
    _start_chat: int | None = None  # the chat shown at start

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

    def chat_unshowable(self, conversation_id: int, exc: Exception) -> None:
        """``conversation_id`` could not be shown because of ``exc``: unless another chat is
        shown by now, show the empty page (at start: the next chat that can be shown) and a
        banner that names it. The chat is left unchanged, still listed, so it can be deleted."""
        if self.closed or self.chat.conversation_id not in (conversation_id, None):
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

    def _open_newest(self) -> None:
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
