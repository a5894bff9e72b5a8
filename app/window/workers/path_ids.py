"""The whole id list of a shown branch, read off the UI thread: ``PathIds``.

Opening a branch reads the ids of its newest messages only (``app.session.path_view``); the
transcript needs the rest to say how many earlier messages it does not show. They are a
walk of the whole branch (30 ms for 10,000 messages of 2 KB), so a job of the window's
``ChatReader`` reads them, and the transcript's path takes them when they arrive.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject

from app.window.workers.chat_reader import ChatReader

log = logging.getLogger(__name__)


class PathIds(QObject):
    """Reads, with ``reader``, the ids of a ``PathView`` that knows only its newest ones, and
    tells ``transcript`` (its ``path`` and ``path_completed()``) when they came for the path
    it still shows. A newer request supersedes an older one."""

    def __init__(self, reader: ChatReader, transcript, parent: QObject | None = None):
        super().__init__(parent)
        self.reader, self.transcript = reader, transcript

    def want(self, path) -> None:
        """Read the whole path's ids of ``path`` (a ``PathView`` not ``complete``: nothing
        otherwise) on the reader's thread."""
        if getattr(path, "complete", True) or not path.tail_ids:
            return
        leaf = path.tail_ids[-1]

        def done(ids: list[int]) -> None:
            if path.complete_with(ids) and self.transcript.path is path:
                self.transcript.path_completed()

        self.reader.submit("path-ids", lambda store: store.branches.path_ids(leaf), done,
                           lambda exc: log.info("the shown branch's ids could not be read: %s", exc))
