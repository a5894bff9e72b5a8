"""Deleted text scrubbed out of ``chats.sqlite3`` off the UI thread: ``scrub_deleted``.

After a chat or a message is deleted, its words are still in the full-text index's
segments and in the WAL until they are merged and truncated (``ChatStore.deletion.forget_deleted``).
That takes time in proportion to the whole database (seconds for 10,000 messages), so it
runs as a task of the window's ``Workers`` on a connection of its own."""

from __future__ import annotations

import logging
from pathlib import Path

from app.window.workers.tasks import Workers
from storage.chats import ChatStore

log = logging.getLogger(__name__)


def scrub_deleted(workers: Workers, path: Path) -> None:
    """Merge the search index and truncate the WAL of the ``chats.sqlite3`` at ``path`` as a
    task of ``workers``; a failure is logged (the next delete tries again), never raised."""
    def scrub(_task) -> None:
        with ChatStore(path) as chats:
            chats.deletion.forget_deleted()

    workers.start(scrub, name="forget-deleted",
                  failure=lambda exc: log.warning("could not scrub deleted chats from %s", path, exc_info=exc))
