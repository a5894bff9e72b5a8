"""File → Import… and files dropped on the window: chats from other apps, on a worker thread.

``ImportController.start(paths)`` runs ``storage.importers.import_files`` as a task of the
window's ``Workers`` (its own thread and SQLite connection), shows a progress dialog only when the import lasts
over ``SHOW_PROGRESS_MS``, then a summary dialog (``summary_text``) and refreshes the
sidebar. The importer holds the chat database's write lock for the whole of each file,
so while an import runs the window keeps a message the user sends (``hold``; the
window's ``ChatCommands`` asks it before each change) and
sends it when the import has finished, instead of waiting on the lock on the UI thread;
and an import asked for while a reply streams (which writes as it goes) starts when the
reply ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QLabel, QMessageBox, QProgressDialog, QWidget

from app.window.shell.banner import Banner
from app.window.shell.lifetime import Lifetime
from app.window.tree.sidebar import Sidebar
from app.window.workers.tasks import SHUTDOWN_S, Task, Workers
from storage.errors import StorageError
from storage.importers.records import FileStatus, ImportProgress, ImportSummary

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)

SHOW_PROGRESS_MS = 500
"""An import that lasts longer than this (milliseconds) shows a progress dialog."""
SKIPPED_SHOWN = 20
"""Skipped items listed in the summary dialog's details (the rest are counted)."""
IMPORT_SUFFIXES = (".json", ".jsonl", ".zip")
FILE_FILTER = "Chat exports (*.json *.jsonl *.zip);;All files (*)"


class ImportState(StrEnum):
    """The lifecycle of the window's import: IDLE → RUNNING → IDLE."""

    IDLE = "idle"
    RUNNING = "running"


def summary_text(summary: ImportSummary) -> tuple[str, str]:
    """The summary dialog's (main text, details) for ``summary``, both plain text.

    The main text gives the totals (conversations, messages, branches), each failed file
    with its reason, and the note that imported chats have no KV cache yet; the details
    list skipped items ("where: reason"), at most ``SKIPPED_SHOWN`` of them."""
    n = summary.conversations
    lines = [f"Imported {n:,} conversation{'s' * (n != 1)}, {summary.messages:,} "
             f"message{'s' * (summary.messages != 1)}, {summary.branches:,} "
             f"branch{'es' * (summary.branches != 1)}."]
    updated = sum(f.conversations_updated for f in summary.files)
    unchanged = sum(f.conversations_unchanged for f in summary.files)
    if updated:
        lines.append(f"{updated:,} conversation{'s' * (updated != 1)} imported before gained new messages.")
    if unchanged:
        lines.append(f"{unchanged:,} conversation{'s were' if unchanged != 1 else ' was'} already imported "
                     "and left as they were.")
    if summary.cancelled:
        lines.append("The import was cancelled: the file being read was rolled back; "
                     "files finished before it are kept.")
    for f in summary.failed:
        reason = (f.error or "unknown error").removeprefix(f"{f.path}: ")  # the importer names the path
        lines.append(f"Nothing was imported from {Path(f.path).name}: {reason}")
    skipped = [s for f in summary.files for s in f.skipped]
    if skipped:
        lines.append(f"{len(skipped):,} item{'s were' if len(skipped) != 1 else ' was'} skipped "
                     "(see Show Details).")
    if n or updated:
        lines.append(summary.note)
    details = [f"{s.where}: {s.reason}" for s in skipped[:SKIPPED_SHOWN]]
    if len(skipped) > SKIPPED_SHOWN:
        details.append(f"… and {len(skipped) - SKIPPED_SHOWN:,} more.")
    return "\n\n".join(lines), "\n".join(details)


class ImportController(QObject):
    """Runs imports into the chat database at ``db_path`` as tasks of ``workers``: after a
    reply of ``chat`` ends when one streams, refreshing ``sidebar``, saying what happens in
    ``banner`` and opening its dialogs over ``parent`` (nothing once ``lifetime`` is closed).

    Signals: ``progressed(ImportProgress)`` (from the worker, on the UI thread),
    ``finished(ImportSummary)`` after the summary dialog is shown, ``failed(str)`` when the
    import could not run at all (the database stayed locked, the disk is full),
    ``show_requested(conversation id)``: the first chat imported, to be shown.
    Attributes for tests: ``state``, ``progress_dialog`` (and its ``progress_label``), ``summary_box``.
    """

    progressed = Signal(object)
    finished = Signal(object)
    failed = Signal(str)
    show_requested = Signal(int)

    def __init__(self, *, db_path: Path, workers: Workers, chat: ChatController, sidebar: Sidebar, banner: Banner,
                 lifetime: Lifetime, parent: QWidget):
        super().__init__(parent)
        self.db_path, self.workers, self.chat, self.sidebar, self.banner = Path(db_path), workers, chat, sidebar, banner
        self.lifetime, self.parent_widget = lifetime, parent
        self.state = ImportState.IDLE
        self.progress_dialog: QProgressDialog | None = None
        self.progress_label: QLabel | None = None
        self.summary_box: QMessageBox | None = None
        self._task: Task | None = None
        self._held: list[Callable[[], None]] = []
        self._waiting: list[Path] | None = None  # paths to import once the streaming reply ends
        chat.reply_finished.connect(self._reply_finished)
        self._show_timer = QTimer(self)
        self._show_timer.setSingleShot(True)
        self._show_timer.timeout.connect(self._show_progress)
        self._last: ImportProgress | None = None
        self.progressed.connect(self._on_progress)

    @property
    def running(self) -> bool:
        return self.state == ImportState.RUNNING

    def open_dialog(self) -> None:
        """Ask for export files (.json, .jsonl, .zip) and import them."""
        paths, _ = QFileDialog.getOpenFileNames(self.parent_widget, "Import chats", str(Path.home()), FILE_FILTER)
        if paths:
            self.start([Path(p) for p in paths])

    def open_folder_dialog(self) -> None:
        """Ask for a folder of export files (LM Studio keeps one file per chat) and import it."""
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Import a folder of chats", str(Path.home()))
        if folder:
            self.start([Path(folder)])

    def start(self, paths: list[Path]) -> bool:
        """Import ``paths`` (files or folders) on a worker thread; False if one is already running."""
        if self.running:
            self.banner.show_message("An import is already running; wait for it to finish.", "info")
            return False
        if not paths:
            return False
        if self.chat.streaming:  # the reply writes as it streams; the import would hold the lock
            self._waiting = list(paths)
            self.banner.show_message("The import starts when this reply finishes.", "info")
            return True
        from storage.importers import import_files

        db_path, paths = self.db_path, list(paths)
        task = self.workers.start(lambda t: import_files(paths, db_path, progress=t.report, cancel=t.cancelled),
                                    name="branchwise-import", progress=self.progressed.emit,
                                    success=lambda summary: self._on_done(summary, ""), failure=self._failed)
        if task is None:  # the window is closing
            return False
        self.state, self._task, self._last = ImportState.RUNNING, task, None
        self._show_timer.start(SHOW_PROGRESS_MS)
        return True

    def _reply_finished(self, _message_id: int) -> None:
        paths, self._waiting = self._waiting, None
        if paths and not self.lifetime.closed:
            if self.banner.isVisible() and self.banner.text.startswith("The import starts when"):
                self.banner.hide()
            self.start(paths)

    def cancel(self) -> None:
        """Ask the worker to stop; the file being read is rolled back."""
        if self._task is not None:
            self._task.cancel()

    def hold(self, action: Callable[[], None], what: str) -> bool:
        """While an import runs, keep ``action`` (a change to the chats: a send, an edit, a
        regenerate, a fork) to run when it finishes, and say so in the banner ("An import
        is writing…; <what> as soon as it finishes."); False when idle (run it now).
        Held actions run in the order they were asked for."""
        if not self.running:
            return False
        self._held.append(action)
        self.banner.show_message(
            f"An import is writing to the chat database; {what} as soon as it finishes.", "info",
            [("Cancel import", self.cancel)])
        return True

    def shutdown(self) -> None:
        """Cancel a running import and wait for it (it rolls back the current file), at most
        ``SHUTDOWN_S``: it holds the database's write lock, which closing the window needs."""
        self._waiting = None
        self._show_timer.stop()
        if self._task is not None:
            self._task.drop()
            self._task.wait(SHUTDOWN_S)
            self._task = None
        self._close_progress()

    def _failed(self, exc: Exception) -> None:
        """The import could not run (the task's failure, on the UI thread)."""
        if isinstance(exc, StorageError):
            self._on_done(None, str(exc))
            return
        log.error("import failed", exc_info=exc)
        self._on_done(None, f"The import stopped on an unexpected error ({type(exc).__name__}: {exc}); "
                            "nothing from the file being read was saved. The log has the details.")

    # -- back on the UI thread ----------------------------------------------------------

    def _on_progress(self, p: ImportProgress) -> None:
        self._last = p
        dlg = self.progress_dialog
        if dlg is None:
            return
        dlg.setValue(_permille(p))
        dlg.setLabelText(f"Importing {p.path.name} ({p.file_index + 1} of {p.file_count}): "
                         f"{p.conversations:,} conversations, {p.messages:,} messages")

    def _show_progress(self) -> None:
        if not self.running:
            return
        dlg = QProgressDialog("", "Cancel", 0, 1000, self.parent_widget)
        label = QLabel("Importing…")
        label.setTextFormat(Qt.TextFormat.PlainText)  # it shows file names
        dlg.setLabel(label)
        self.progress_label = label
        dlg.setWindowTitle("Import chats")
        dlg.setWindowModality(Qt.WindowModality.NonModal)
        dlg.setMinimumDuration(0)
        dlg.setAutoClose(False)
        dlg.setAutoReset(False)
        dlg.canceled.connect(self.cancel)
        self.progress_dialog = dlg
        if self._last is not None:
            self._on_progress(self._last)
        dlg.show()

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.canceled.disconnect(self.cancel)
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = self.progress_label = None

    def _on_done(self, summary: ImportSummary | None, error: str) -> None:
        self._show_timer.stop()
        self._task = None
        self.state = ImportState.IDLE
        self._close_progress()
        if summary is None:
            self.banner.show_message(f"Import failed: {error}", "error")
            self.failed.emit(error)
        else:
            self._refresh(summary)
            self._show_summary(summary)
        held, self._held = self._held, []
        if held and self.banner.isVisible() and self.banner.button("Cancel import") is not None:
            self.banner.hide()
        for action in held:
            action()
        if summary is not None:
            self.finished.emit(summary)

    def _refresh(self, summary: ImportSummary) -> None:
        self.sidebar.refresh()
        ids = [i for f in summary.files if f.status == FileStatus.IMPORTED for i in f.conversation_ids]
        if ids and not self.chat.streaming:
            self.show_requested.emit(ids[0])

    def _show_summary(self, summary: ImportSummary) -> None:
        text, details = summary_text(summary)
        box = QMessageBox(self.parent_widget)
        box.setWindowTitle("Import chats")
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setIcon(QMessageBox.Icon.Warning if summary.failed else QMessageBox.Icon.Information)
        box.setText(text)
        if details:
            box.setDetailedText(details)
        box.setStandardButtons(QMessageBox.StandardButton.Ok)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda _r: setattr(self, "summary_box", None))
        self.summary_box = box
        box.open()


def _permille(p: ImportProgress) -> int:
    """Progress over all files, 0–1000: finished files plus the share of this one read."""
    share = p.bytes_done / p.bytes_total if p.bytes_total else 0.0
    return int(1000 * (p.file_index + min(1.0, share)) / max(1, p.file_count))


def droppable_paths(urls) -> list[Path]:
    """The local files and folders among dropped ``urls`` (QUrl) that an import may read."""
    out = []
    for url in urls:
        if not url.isLocalFile():
            continue
        p = Path(url.toLocalFile())
        if p.is_dir() or p.suffix.lower() in IMPORT_SUFFIXES:
            out.append(p)
    return out


def accept_drag(event) -> None:
    """A drag entering the window (its ``dragEnterEvent``): accepted when it carries files an
    import may read."""
    if event.mimeData().hasUrls() and droppable_paths(event.mimeData().urls()):
        event.acceptProposedAction()


def dropped_paths(event) -> list[Path]:
    """The importable paths of a drop on the window (its ``dropEvent``), accepting it when
    there are any."""
    paths = droppable_paths(event.mimeData().urls()) if event.mimeData().hasUrls() else []
    if paths:
        event.acceptProposedAction()
    return paths
