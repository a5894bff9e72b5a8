"""File → Export chat…: the shown chat to a file, as Branchwise JSON (the whole tree, every
branch: ``storage.importers.branchwise.conversation_json``, which ``branchwise import``
reads back) or Markdown (the active branch, every message fenced verbatim:
``app.session.markdown_export.conversation_markdown``), the same output as
``branchwise conversations export``.

The chat is read and the file written on the window's reader thread (its own connection;
in proportion to the chat). The file is made beside the target with mode 0600 and renamed
over it when complete, so a failure (a full disk, a folder that cannot be written) leaves
no half file; the banner says what happened in one sentence.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from app.session.markdown_export import conversation_markdown
from app.window.shell.banner import Banner
from app.window.workers.chat_reader import ChatReader
from storage.errors import StorageError
from storage.importers.branchwise import conversation_json

log = logging.getLogger(__name__)

FILTERS = {"Markdown (*.md)": ".md", "Branchwise JSON (*.json)": ".json"}


def export_text(chats, conversation_id: int, fmt: str) -> str:
    """The export of ``conversation_id`` in ``fmt`` ("json" or "markdown") as text.

    Raises:
        NotFoundError: the chat is gone.
    """
    data = conversation_json(chats, conversation_id)
    if fmt == "json":
        return json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    return conversation_markdown(data, active_only=True) + "\n"


def write_private(target: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` with mode 0600, through a file beside it that is
    renamed over it once complete (nothing half-written is left).

    Raises:
        OSError: the folder cannot be written, the disk is full (nothing was written).
    """
    fd, tmp = tempfile.mkstemp(prefix=".branchwise-export-", dir=target.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def failure_sentence(target: Path, exc: OSError) -> str:
    """One sentence for a failed export to ``target``."""
    why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
           errno.EACCES: "that folder cannot be written", errno.EPERM: "that folder cannot be written",
           errno.EROFS: "that disk is read-only", errno.ENOENT: "that folder does not exist"}.get(
        exc.errno, exc.strerror or str(exc))
    return f"The chat was not exported to {target}: {why}; nothing was written there."


class ExportFlow(QObject):
    """File → Export chat… for ``chat``'s shown conversation, on ``reader``'s thread; the
    outcome in ``banner``. Signal ``exported(path or "", message)`` when a write ended."""

    exported = Signal(str, str)

    def __init__(self, *, chat, reader: ChatReader, banner: Banner, parent: QWidget):
        super().__init__(parent)
        self.chat, self.reader, self.banner, self.window = chat, reader, banner, parent

    def open_dialog(self) -> None:
        """Ask where (and as what) to export the shown chat, then export it."""
        cid = self.chat.conversation_id
        if cid is None:
            self.banner.show_message("Open a chat first: there is nothing to export on the new-chat page.", "info")
            return
        try:
            title = self.chat.store.get_conversation(cid).title
        except StorageError:  # only the suggested file name needs it
            title = "chat"
        stem = "".join(ch if ch.isalnum() or ch in " -_" else " " for ch in title).strip()[:60] or "chat"
        path, chosen = QFileDialog.getSaveFileName(self.window, "Export chat", str(Path.home() / f"{stem}.md"),
                                                   ";;".join(FILTERS))
        if not path:
            return
        target = Path(path)
        suffix = FILTERS.get(chosen) or (target.suffix.lower() if target.suffix.lower() in (".md", ".json") else ".md")
        if target.suffix.lower() not in (".md", ".json"):
            target = target.with_name(target.name + suffix)
        self.export(cid, target, "json" if target.suffix.lower() == ".json" else "markdown")

    def export(self, conversation_id: int, target: Path, fmt: str) -> None:
        """Write ``conversation_id`` to ``target`` as ``fmt`` ("json" or "markdown") off the UI thread."""
        def job(store):
            write_private(target, export_text(store, conversation_id, fmt))
            return str(target)

        def done(path: str) -> None:
            message = f"Exported the chat to {path}."
            self.banner.show_message(message, "info")
            self.exported.emit(path, message)

        def failed(exc: Exception) -> None:
            message = (failure_sentence(target, exc) if isinstance(exc, OSError)
                       else f"The chat was not exported to {target}: {exc}.")
            log.warning("export failed: %s", exc)
            self.banner.show_message(message, "error")
            self.exported.emit("", message)

        self.reader.submit(f"export-{target}", job, done, failed)
