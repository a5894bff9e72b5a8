"""What the window asks the engine about the shown path, in the background: how many tokens
its prompt takes (the status bar's context figure, and what ``OverflowFlow._surely_fits``
starts from) and how much of each node's prompt the prefix store holds (the tree panel's
shading). An answer that comes after the path changed is dropped.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from app.window.engine_client import PendingRequest
from app.window.model_controller import ModelState
from engine.events import CountEvent, CoverageEvent
from storage.errors import StorageError

log = logging.getLogger(__name__)


class PathFigures(QObject):
    """The figures of ``chat``'s shown path (``chat``: a ChatController; it emits
    ``coverage_ready`` when the tree panel got its shading).

    ``counted_path``: (chat, leaf, prompt tokens) of the last count the engine answered."""

    def __init__(self, chat):
        super().__init__(chat)
        self.chat = chat
        self.w = chat.w
        self._coverage: PendingRequest | None = None
        self._coverage_ids: list[int] = []
        self._count: PendingRequest | None = None
        self.counted_path: tuple[int, int | None, int] | None = None

    @property
    def coverage_pending(self) -> bool:
        """True while the tree panel's coverage request is in flight (for tools and tests)."""
        return self._coverage is not None

    def n_ctx(self) -> int:
        """The context size in tokens: the loaded model's, else the setting."""
        return (self.w.model.facts or {}).get("n_ctx") or self.w.settings.n_ctx

    def update_context_label(self, stats: dict | None = None) -> None:
        self.w.status.set_context_from_stats(stats, self.n_ctx())

    def request_context_count(self) -> None:
        """Ask the engine how many tokens the shown path takes (the context figure); older
        answers are dropped. Does nothing while a reply streams or no model is ready."""
        w, chat = self.w, self.chat
        if w.closed:  # a deferred call after the window shut down
            return
        cid, self._count = chat.conversation_id, None
        if cid is None or chat.streaming or w.model.state != ModelState.READY:
            if cid is None:
                w.status.set_context(0, self.n_ctx())
            return
        try:
            messages = chat.session.active_prompt(cid)
        except StorageError:
            return
        if not messages:
            w.status.set_context(0, self.n_ctx())
            return
        handle = w.client.count(messages)
        if handle is not None:
            self._count = handle
            leaf = w.store.get_conversation(cid).active_leaf_id
            handle.done.connect(lambda e, h=handle, c=cid, leaf=leaf: self._counted(h, c, e, leaf))
            handle.failed.connect(lambda e: log.info("count failed: %s", e.message))

    def _counted(self, handle: PendingRequest, cid: int, event: CountEvent, leaf: int | None = None) -> None:
        self.counted_path = (cid, leaf, event.prompt_tokens)
        if handle is self._count and cid == self.chat.conversation_id and not self.chat.streaming:
            self._count = None
            self.w.status.set_context(event.prompt_tokens, event.n_ctx or self.n_ctx())

    def refresh_coverage(self) -> None:
        """Ask the engine how much of each node's prompt the prefix store holds (tree panel)."""
        w, cid = self.w, self.chat.conversation_id
        if (not w.tree.isVisible() or cid is None or w.model.state != ModelState.READY
                or self._coverage is not None):
            return
        ids, paths = self.chat.session.coverage_paths(cid)
        if not paths:
            return
        handle = w.client.coverage(paths)
        if handle is not None:
            self._coverage, self._coverage_ids = handle, ids
            handle.done.connect(self._covered)
            handle.failed.connect(lambda _e: setattr(self, "_coverage", None))

    def _covered(self, event: CoverageEvent) -> None:
        self._coverage = None
        self.w.tree.set_coverage({mid: (int(r[0]), int(r[1])) for mid, r in zip(self._coverage_ids, event.results)})
        self.chat.coverage_ready.emit()

    def engine_gone(self) -> None:
        """The engine process ended: the requests in flight will not be answered."""
        self._coverage = self._count = None
