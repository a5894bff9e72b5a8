"""The Open model dialog: a file dialog for GGUF files whose Size column reads "93.3 MiB"
(Qt's own says "93.30 MiB", and cut it to "93....MiB" in a narrow column)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QIdentityProxyModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QFileDialog, QFileSystemModel, QHeaderView, QTreeView, QWidget

SIZE_COLUMN = 1  # QFileSystemModel's columns: name, size, type, date modified


def file_size_text(n: int) -> str:
    """``n`` bytes as the Size column shows them: "512 bytes", "12.0 KiB", "93.3 MiB",
    "4.1 GiB" (powers of 1024, one decimal)."""
    if n < 1024:
        return f"{n:,} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:,.1f} {unit}"
    return ""


class _SizeColumn(QIdentityProxyModel):
    """The file system model with a file's size written by ``file_size_text``."""

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        source = self.sourceModel()
        if (role == Qt.ItemDataRole.DisplayRole and index.column() == SIZE_COLUMN
                and isinstance(source, QFileSystemModel)):
            src = self.mapToSource(index)
            if not source.isDir(src):
                return file_size_text(source.size(src))
        return super().data(index, role)


def open_model_dialog(parent: QWidget, folder: Path, chosen: Callable[[str], None]) -> QFileDialog:
    """Open (not exec) the dialog in ``folder``; ``chosen(path)`` when a file is picked.
    Returns the dialog (it deletes itself when closed)."""
    dialog = QFileDialog(parent, "Open model", str(folder), "GGUF models (*.gguf);;All files (*)")
    dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    view = dialog.findChild(QTreeView, "treeView")
    if view is not None:  # Qt's own dialog (a desktop's native one shows sizes its own way)
        dialog.setProxyModel(_SizeColumn(dialog))
        view.header().setSectionResizeMode(SIZE_COLUMN, QHeaderView.ResizeMode.ResizeToContents)
    dialog.fileSelected.connect(lambda path: path and chosen(path))
    dialog.open()
    return dialog
