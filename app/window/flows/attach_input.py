"""Where attached files come from: the paperclip button beside the composer (a file dialog),
files dropped on the composer, and copied files pasted into it (Ctrl+V with file URLs on the
clipboard, as a file manager's Copy puts them).

``AttachInput`` watches the composer, its box and the box's viewport (where a drop lands)
with an event filter, so the composer's own key handling is untouched: a drag of local files
is accepted there (a drop elsewhere on the window still imports chats), and a paste of files
attaches them instead of inserting their URLs as text. Text drops and pastes go on as before.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, QSize, Qt
from PySide6.QtGui import QGuiApplication, QKeySequence
from PySide6.QtWidgets import QFileDialog, QToolButton, QWidget

from app.window.flows.attach_flow import AttachFlow
from app.window.transcript.attachment_chip import paperclip_icon
from app.window.transcript.composer import Composer

FILE_FILTER = ("Documents (*.pdf *.docx *.txt *.md *.markdown *.html *.htm *.csv *.tsv *.json *.jsonl "
               "*.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java *.rb *.sh *.toml *.yaml *.yml *.xml *.log);;"
               "All files (*)")


def local_files(mime: QMimeData | None) -> list[Path]:
    """The local files (not folders) among ``mime``'s URLs, in order."""
    if mime is None or not mime.hasUrls():
        return []
    out = []
    for url in mime.urls():
        if url.isLocalFile():
            p = Path(url.toLocalFile())
            if not p.is_dir():
                out.append(p)
    return out


class AttachInput(QObject):
    """The paperclip (``button``, added beside ``composer``'s Send) and the composer's drops
    and pastes of files, handed to ``flow``."""

    def __init__(self, composer: Composer, flow: AttachFlow, parent: QWidget):
        super().__init__(parent)
        self.composer, self.flow, self.parent_widget = composer, flow, parent
        self.button = QToolButton()
        self.button.setObjectName("attach_button")
        self.button.setIcon(paperclip_icon("#888888"))
        self.button.setIconSize(QSize(22, 22))
        self.button.setToolTip("Attach files (PDF, DOCX, HTML, Markdown, CSV, JSON, text); or drop or paste them here")
        self.button.setAccessibleName("Attach files")
        self.button.setMinimumSize(40, 40)
        self.button.clicked.connect(self.open_dialog)
        composer.add_tool_button(self.button)
        self.dialog: QFileDialog | None = None
        for widget in (composer, composer.input, composer.input.viewport()):
            widget.setAcceptDrops(True)
            widget.installEventFilter(self)

    def open_dialog(self) -> None:
        """The file dialog (several files may be chosen); opened, not run modally."""
        dialog = QFileDialog(self.parent_widget, "Attach files")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.setNameFilter(FILE_FILTER)
        dialog.filesSelected.connect(lambda files: self.flow.attach_paths([Path(f) for f in files]))
        self.dialog = dialog
        dialog.open()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            if local_files(event.mimeData()):
                event.setDropAction(Qt.DropAction.CopyAction)
                event.accept()
                return True
        elif kind == QEvent.Type.Drop:
            files = local_files(event.mimeData())
            if files:
                event.setDropAction(Qt.DropAction.CopyAction)
                event.accept()
                self.flow.attach_paths(files)
                return True
        elif kind == QEvent.Type.KeyPress and watched is self.composer.input and event.matches(QKeySequence.StandardKey.Paste):
            files = local_files(QGuiApplication.clipboard().mimeData())
            if files:
                self.flow.attach_paths(files)
                return True
        return super().eventFilter(watched, event)
