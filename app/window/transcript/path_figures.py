"""What the window asks the engine about the shown path, in the background: how many tokens
its prompt takes (the status bar's context figure, and what ``OverflowFlow._surely_fits``
starts from) and how much of each node's prompt the prefix store holds (the tree panel's
shading). An answer that comes after the path changed is dropped.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from typing import TYPE_CHECKING

from app.window.flows.model_controller import ModelState
from app.window.tree.tree_coverage import TreeCoverage
from app.window.workers.chat_reader import ChatReader
from app.window.workers.engine_client import PendingRequest
from engine.events import CountEvent, Phase
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)


class PathFigures(QObject):
    """The figures of ``chat``'s shown path (``chat`` emits ``coverage_ready`` when the tree
    panel got its shading); it uses the chat's ``model``, ``settings``, ``status``, ``tree``
    and ``lifetime``, and reads the path with ``reader``.

    ``counted_path``: (chat, leaf, prompt tokens) of the last count the engine answered."""

    def __init__(self, chat: ChatController, reader: ChatReader):
        super().__init__(chat)
        self.chat, self.reader = chat, reader
        self.model, self.status = chat.model, chat.status
        self.coverage = TreeCoverage(chat, chat.tree, chat.model, reader)  # the tree panel's "KV stored" bars
        self.coverage.ready.connect(chat.coverage_ready)
        self._count: PendingRequest | None = None
        self.counted_path: tuple[int, int | None, int] | None = None

    @property
    def coverage_pending(self) -> bool:
        """True while the tree panel's coverage request is in flight (for tools and tests)."""
        return self.coverage.pending

    def n_ctx(self) -> int:
        """The context size in tokens: the loaded model's, else the setting."""
        return (self.model.facts or {}).get("n_ctx") or self.chat.settings.n_ctx

    def update_context_label(self, stats: dict | None = None) -> None:
        self.status.set_context_from_stats(stats, self.n_ctx())

    def request_context_count(self) -> None:
        """Ask the engine how many tokens the shown path takes (the context figure); older
        answers are dropped. Does nothing while a reply streams or no model is ready. The
        path is the shown branch's prompt, read and pickled on the window's reader thread
        once per branch (``ChatController.shown_prompt``); only its bytes are sent from here."""
        chat = self.chat
        if chat.lifetime.closed:  # a deferred call after the window shut down
            return
        cid, self._count = chat.conversation_id, None
        if cid is None or chat.streaming or self.model.state != ModelState.READY:
            if cid is None:
                self.status.set_context(0, self.n_ctx())
            return
        packed = chat.shown_prompt.want(self._prompt_read)
        if packed is None:
            return  # asked again when it has been read
        if not packed.count:
            if not self._overflow_shown():
                self.status.set_context(0, self.n_ctx())
            return
        handle = self.model.client.count(packed.data)
        if handle is not None:
            self._count = handle
            handle.done.connect(lambda e, h=handle, c=cid, leaf=packed.leaf_id: self._counted(h, c, e, leaf))
            handle.failed.connect(lambda e: log.info("count failed: %s", e.message))

    def _prompt_read(self, _packed) -> None:
        self.request_context_count()

    def _counted(self, handle: PendingRequest, cid: int, event: CountEvent, leaf: int | None = None) -> None:
        self.counted_path = (cid, leaf, event.prompt_tokens)
        if handle is self._count and cid == self.chat.conversation_id and not self.chat.streaming:
            self._count = None
            if not self._overflow_shown():
                self.status.set_context(event.prompt_tokens, event.n_ctx or self.n_ctx())

    def _overflow_shown(self) -> bool:
        """True while the "too long" choices are open: the status bar shows the count of the
        message being sent (``OverflowFlow``), which a count of the path drawn before it,
        answered later (the reader runs a turn after it is asked), must not overwrite."""
        box = self.chat.overflow.box
        return box is not None and box.isVisible()

    def follow_reply(self, handle: PendingRequest) -> None:
        """Show ``handle``'s restore and prefill progress in the status bar, and move the context
        figure with it: the tokens restored, then those plus the tokens prefilled so far (the
        exact figure comes with the reply's stats)."""
        status, base = self.status, [None]

        def progress(phase: str, done: int, total: int) -> None:
            status.reply_progress(phase, done, total)
            if phase == Phase.RESTORE:
                base[0] = total
            elif base[0] is None:  # the live context held the rest: the path counted before
                base[0] = status.context_used
            status.set_context(max(status.context_used, base[0] + (done if phase != Phase.RESTORE else 0)),
                               self.n_ctx())

        handle.progress.connect(progress)

    def first_turn(self, user_message_id: int | None) -> bool:
        """Whether ``user_message_id`` is its conversation's first message (none before it but
        a system message): a reply to it restores only what every chat shares."""
        store = self.chat.store
        try:
            parent = store.get_message(user_message_id).parent_id if user_message_id else None
            return user_message_id is not None and (parent is None or store.get_message(parent).role == "system")
        except StorageError:
            return False

    def prewarmed(self, result: dict) -> None:
        """A prewarm answered (``engine.prewarm.PrewarmResult`` as a dict): when it opened the
        chat shown and restored tokens from the store, the status line says so (what this run
        restored, not the saved figures of an earlier one)."""
        chat = self.chat
        if (result.get("kind") == "open" and result.get("restored_tokens", 0) > 0 and not chat.streaming
                and chat.conversation_id is not None and len(chat.transcript.path[-2:]) == 2):
            self.status.show_restored(result["restored_tokens"], result.get("ms", 0.0))

    def refresh_coverage(self) -> None:
        """Ask the engine how much of each node's prompt the prefix store holds (tree panel)."""
        self.coverage.refresh()

    def engine_gone(self) -> None:
        """The engine process ended: the requests in flight will not be answered."""
        self._count = None
        self.coverage.engine_gone()
