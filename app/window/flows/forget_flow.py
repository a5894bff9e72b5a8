"""Delete and forget (issue #16.4), the window's half: when a "Delete and forget" in the
sidebar outlives its undo time, the engine process deletes the chat's rows and drops the
KV blocks no other chat shares (``engine.forget.delete_and_forget``, a ``CacheAction.FORGET``
request), so the UI thread never renders or tokenizes a conversation.

Undo: the sidebar defers both kinds of delete the same way (``UNDO_MS``); nothing is
removed, rows or KV blocks, before the undo time is up (or the window closes, which
carries the pending delete out before the engine stops), so Undo never needs a block back.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.window.flows.model_controller import ModelController, ModelState
from app.window.shell.banner import Banner
from app.window.shell.lifetime import Lifetime
from app.window.tree.sidebar import Sidebar
from storage.chats import ChatStore
from storage.errors import StorageError


class ForgetFlow(QObject):
    """Carries out Delete and forget of chats in ``store`` with ``model``'s engine, for the
    ``sidebar`` (its rows and list), saying what happened in ``banner`` (unless ``lifetime``
    is closed). ``pending`` is the engine request in flight (None when there is none).

    Signal ``forgotten(conversation_id, blocks)``: done, ``blocks`` KV blocks dropped."""

    forgotten = Signal(int, int)

    def __init__(self, *, store: ChatStore, model: ModelController, sidebar: Sidebar, banner: Banner,
                 lifetime: Lifetime, parent: QObject | None = None):
        super().__init__(parent)
        self.store, self.model, self.sidebar, self.banner, self.lifetime = store, model, sidebar, banner, lifetime
        self.pending = None

    def forget(self, cid: int) -> None:
        """Delete and forget ``cid`` (its undo time is up): the engine process deletes the
        rows and drops the KV blocks no other chat shares (``engine.forget``), off the UI
        thread. Without a loaded model the rows are deleted here and the banner says the
        KV blocks stay until evicted."""
        try:
            title = self.store.get_conversation(cid).title
        except StorageError:
            title = "the chat"
        handle, client = None, self.model.client
        if self.model.state == ModelState.READY and client.is_running():
            handle = client.forget(cid, str(self.store.path))
        if handle is None:
            self.sidebar.delete_rows(cid)
            if not self.lifetime.closed:
                self.banner.show_message(
                    f"Deleted “{title}”. No model is loaded, so its KV blocks could not be matched: "
                    "they stay in kvcache.sqlite3 until the cache budget evicts them or you clear "
                    "the cache.", "info")
            return
        self.pending = handle
        handle.done.connect(lambda event: self._forgotten(cid, title, int(getattr(event, "dropped", 0))))
        handle.failed.connect(lambda event: self._forget_failed(title, event.message))

    def _forgotten(self, cid: int, title: str, dropped: int) -> None:
        self.pending = None
        self.sidebar.refresh()
        self.sidebar.delete_committed.emit(cid)
        self.banner.show_message(
            f"Deleted and forgot “{title}”: {dropped:,} KV block{' it alone used was' if dropped == 1 else 's it alone used were'} "
            "removed from kvcache.sqlite3. Blocks it shares with other chats stay.", "info")
        self.forgotten.emit(cid, dropped)

    def _forget_failed(self, title: str, message: str) -> None:
        self.pending = None
        self.sidebar.refresh()
        self.banner.show_message(f"“{title}” could not be deleted and forgotten: {message}", "error")

