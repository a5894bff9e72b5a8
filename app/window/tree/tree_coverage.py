"""The tree panel's "KV stored" bars: ``TreeCoverage`` asks the engine how much of each
node's prompt the prefix store holds.

The prompts of the first ``coverage_paths`` nodes (each the path from the root to the
node) are read, built and pickled on the ``ChatReader``'s worker thread (half a megabyte
for a 200-message chat, which took 180 ms on the UI thread); only the sending of the bytes
and the answer's bars are handled on the UI thread.
"""

from __future__ import annotations

import logging

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.session import ConversationSession
from app.window.flows.model_controller import ModelController, ModelState
from app.window.tree.tree_panel import TreePanel
from app.window.workers.chat_reader import ChatReader
from app.window.workers.engine_client import PendingRequest
from engine.events import CoverageEvent

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)


class TreeCoverage(QObject):
    """The coverage of the tree of ``chat``'s conversation, drawn on ``tree``, asked of
    ``model``'s engine with the prompts ``reader`` builds. Signal ``ready()``: the bars were
    updated."""

    ready = Signal()

    def __init__(self, chat: ChatController, tree: TreePanel, model: ModelController, reader: ChatReader):
        super().__init__(chat)
        self.chat, self.tree, self.model, self.reader = chat, tree, model, reader
        self._reading: int | None = None  # the conversation whose prompts the worker builds
        self._request: PendingRequest | None = None
        self._ids: list[int] = []
        self._again = False  # asked again while a request was in flight: ask once it is answered

    @property
    def pending(self) -> bool:
        """True while the prompts are being read or the engine's answer is awaited."""
        return self._reading is not None or self._request is not None

    def refresh(self) -> None:
        """Ask again, for the conversation shown, unless the panel is hidden or no model is
        ready; while a request is in flight, once it is answered (a reply's snapshot may land
        while the coverage of the path before it is still being read)."""
        cid = self.chat.conversation_id
        if self.pending:
            self._again = True
            return
        self._again = False
        if (not self.tree.isVisible() or cid is None or self.model.state != ModelState.READY
                or self.reader.closed):
            return
        self._reading, client = cid, self.model.client

        def job(store):  # on the worker: read the paths and pickle the request
            ids, paths = ConversationSession(store).coverage_paths(cid)
            return ids, (client.pack_coverage(paths) if paths else None)

        self.reader.submit("coverage", job, lambda result: self._ask(cid, client, *result), self._read_failed)

    def _read_failed(self, exc: Exception) -> None:
        self._reading = None
        log.info("could not read the prompts for the tree's coverage: %s", exc)
        self._ask_again()

    def _ask_again(self) -> None:
        """The request ended (answered, failed or not sent): ask again if that was asked for."""
        if self._again and not self.pending:
            self.refresh()

    def _ask(self, cid: int, client, ids: list[int], packed: tuple[int, bytes] | None) -> None:
        self._reading = None
        if cid != self.chat.conversation_id:  # another chat was opened meanwhile
            self.refresh()
            return
        if packed is None or self.model.state != ModelState.READY or client is not self.model.client:
            self._ask_again()
            return
        handle = client.send_packed(packed)
        if handle is not None:
            self._request, self._ids = handle, ids
            handle.done.connect(self._covered)
            handle.failed.connect(self._request_failed)
        else:
            self._ask_again()

    def _request_failed(self, _event) -> None:
        self._request = None
        self._ask_again()

    def _covered(self, event: CoverageEvent) -> None:
        self._request = None
        self.tree.set_coverage({mid: (int(r[0]), int(r[1])) for mid, r in zip(self._ids, event.results)})
        if self._again:  # the path changed meanwhile (a reply was stored): these bars are not the last
            self.refresh()
            if self.pending:
                return  # ``ready`` comes with the newer answer
        self.ready.emit()

    def engine_gone(self) -> None:
        """The engine process ended: its answer will not come."""
        self._request = None
