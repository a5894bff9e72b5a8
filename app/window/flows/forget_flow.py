"""Delete and forget (issue #16.4), the window's half: when a "Delete and forget" in the
sidebar outlives its undo time, the engine process deletes the chat's rows and drops the
KV blocks no other chat shares (``engine.forget.delete_and_forget``, a ``CacheAction.FORGET``
request), so the UI thread never renders or tokenizes a conversation.

Undo: the sidebar defers both kinds of delete the same way (``UNDO_MS``); nothing is
removed, rows or KV blocks, before the undo time is up (or the window closes, which
carries the pending delete out before the engine stops), so Undo never needs a block back.
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from storage.errors import StorageError


class ForgetFlow(QObject):
    """Carries out Delete and forget for ``window`` (a MainWindow: its ``store``, ``model``,
    ``client``, ``sidebar``, ``banner`` and ``forgotten(conversation_id, blocks)`` signal).
    ``pending`` is the engine request in flight (None when there is none)."""

    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.pending = None

    def forget(self, cid: int) -> None:
        """Delete and forget ``cid`` (its undo time is up): the engine process deletes the
        rows and drops the KV blocks no other chat shares (``engine.forget``), off the UI
        thread. Without a loaded model the rows are deleted here and the banner says the
        KV blocks stay until evicted."""
        try:
            title = self.w.store.get_conversation(cid).title
        except StorageError:
            title = "the chat"
        handle = None
        if self.w.model.state == "ready" and self.w.client.is_running():
            handle = self.w.client.forget(cid, str(self.w.store.path))
        if handle is None:
            self.w.sidebar.delete_rows(cid)
            if not self.w.closed:
                self.w.banner.show_message(
                    f"Deleted “{title}”. No model is loaded, so its KV blocks could not be matched: "
                    "they stay in kvcache.sqlite3 until the cache budget evicts them or you clear "
                    "the cache.", "info")
            return
        self.pending = handle
        handle.done.connect(lambda event: self._forgotten(cid, title, int(getattr(event, "dropped", 0))))
        handle.failed.connect(lambda event: self._forget_failed(title, event.message))

    def _forgotten(self, cid: int, title: str, dropped: int) -> None:
        self.pending = None
        self.w.sidebar.refresh()
        self.w.sidebar.delete_committed.emit(cid)
        self.w.banner.show_message(
            f"Deleted and forgot “{title}”: {dropped:,} KV block{' it alone used was' if dropped == 1 else 's it alone used were'} "
            "removed from kvcache.sqlite3. Blocks it shares with other chats stay.", "info")
        self.w.forgotten.emit(cid, dropped)

    def _forget_failed(self, title: str, message: str) -> None:
        self.pending = None
        self.w.sidebar.refresh()
        self.w.banner.show_message(f"“{title}” could not be deleted and forgotten: {message}", "error")

