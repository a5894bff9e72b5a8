"""The Models window's Library tab: the models Branchwise downloaded (``<data dir>/models``),
the embedded default model (marked built-in, so a user can switch back to it) and, when asked, those other apps keep (LM Studio, Ollama, GPT4All, Jan: used in place,
never modified). Use loads one; Remove deletes one of Branchwise's own, and offers to free
its KV blocks in the prefix store too (``engine.hub.library.forget_blocks``: the file is
hashed for its fingerprints first, so it runs as a task, before the file goes).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QHeaderView, QLabel, QMessageBox, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from app.window.shell.plain import plain_label
from app.window.workers.tasks import Workers
from engine.hub.library import BUILTIN, builtin_models

ROLE = Qt.ItemDataRole.UserRole
COLUMNS = ["Name", "Quantization", "Size", "Trained context", "Architecture", "Prefix store", "Where"]


class LibraryTab(QWidget):
    """The library as a table with Use and Remove. ``workers`` runs the listing (a header
    read per file) and the removal. Signals: use_requested(path), removed(name, blocks
    deleted or -1 when they were kept)."""

    use_requested = Signal(str)
    removed = Signal(str, int)

    def __init__(self, *, workers: Workers, data_dir: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.workers, self.data_dir = workers, Path(data_dir)
        self._job = 0
        self.models: list = []  # engine.hub.library.LibraryModel, as listed
        lay = QVBoxLayout(self)
        self.caption = plain_label(QLabel())
        self.caption.setObjectName("library_caption")
        self.caption.setWordWrap(True)
        self.view = QTreeWidget()
        self.view.setObjectName("library")
        self.view.setAccessibleName("Library")
        self.view.setHeaderLabels(COLUMNS)
        self.view.setRootIsDecorated(False)
        self.view.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for i in range(1, len(COLUMNS)):
            self.view.header().setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
        self.view.itemSelectionChanged.connect(self._selected)
        self.view.itemActivated.connect(lambda _i, _c: self.use_selected())
        self.others = QCheckBox("Also show the models other apps downloaded (LM Studio, Ollama, GPT4All, Jan), "
                                "used in place")
        self.others.toggled.connect(lambda _on: self.refresh())
        row = QHBoxLayout()
        self.use_button = QPushButton("Use")
        self.remove_button = QPushButton("Remove…")
        self.use_button.clicked.connect(self.use_selected)
        self.remove_button.clicked.connect(self.remove_selected)
        for b in (self.use_button, self.remove_button):
            b.setEnabled(False)
            row.addWidget(b)
        row.addStretch(1)
        lay.addWidget(self.caption)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.others)
        lay.addLayout(row)

    def refresh(self) -> None:
        """List the library again (a task: each model's header is read)."""
        from engine.hub import library

        self._job += 1
        job, others = self._job, self.others.isChecked()
        self.caption.setText("Reading the library…")

        def work(_task):
            return (library.list_library(self.data_dir) + builtin_models()
                    + (library.list_others() if others else []))

        self.workers.start(work, name="model library", success=lambda models: self._listed(job, models),
                           failure=lambda exc: self.caption.setText(f"The library could not be read: {exc}"))

    def _listed(self, job: int, models) -> None:
        from engine.hub import fit, library

        if job != self._job:
            return
        self.models = list(models)
        self.view.clear()
        for m in self.models:
            where = {"Branchwise": "Branchwise", BUILTIN: "Built-in (embedded in Branchwise)"}.get(
                m.origin, f"{m.origin} (used in place)")
            parts = f" ({m.parts} parts)" if m.parts > 1 else ""
            item = QTreeWidgetItem([m.name + parts, m.quantization, fit.gb(m.size),
                                    f"{m.context_length:,}" if m.context_length else "?", m.architecture or "?",
                                    m.treatment, where])
            item.setToolTip(0, m.path)
            item.setData(0, ROLE, m)
            self.view.addTopLevelItem(item)
        own = sum(m.origin == "Branchwise" for m in self.models)
        self.caption.setText(f"{own} model{'' if own == 1 else 's'} downloaded to {library.models_dir(self.data_dir)}."
                             if own else
                             f"No models downloaded yet ({library.models_dir(self.data_dir)}); the Find tab gets "
                             "some. The built-in model is always here.")

    def _current(self):
        items = self.view.selectedItems()
        return items[0].data(0, ROLE) if items else None

    def _selected(self) -> None:
        m = self._current()
        self.use_button.setEnabled(m is not None)
        self.remove_button.setEnabled(m is not None and m.origin == "Branchwise")

    def use_selected(self) -> None:
        m = self._current()
        if m is not None:
            self.use_requested.emit(m.path)

    def ask_remove(self, model) -> tuple[bool, bool]:
        """Ask whether to remove ``model`` and free its KV blocks: (remove, free blocks)."""
        box = QMessageBox(self)
        box.setWindowTitle("Remove model")
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setText(f"Remove {model.name} ({model.size / 1e9:,.2f} GB) from {Path(model.path).parent}?")
        box.setInformativeText("Its KV blocks in the prefix store are of no use to another model; they can go "
                               "with it now, or stay until the budget evicts them.")
        both = box.addButton("Remove and free its KV blocks", QMessageBox.ButtonRole.DestructiveRole)
        only = box.addButton("Remove the file only", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(both)
        box.exec()
        return box.clickedButton() in (both, only), box.clickedButton() is both

    def remove_selected(self) -> None:
        """Remove the selected model (one of Branchwise's own) after asking."""
        m = self._current()
        if m is None or m.origin != "Branchwise":
            return
        remove, free = self.ask_remove(m)
        if remove:
            self.remove(m, free)

    def remove(self, model, free_blocks: bool) -> None:
        """Delete ``model``'s files, with ``free_blocks`` its KV blocks first (a task)."""
        from engine.hub import library

        self.caption.setText(f"Removing {model.name}…")

        def work(_task):
            freed = library.forget_blocks(self.data_dir, model) if free_blocks else -1
            library.remove(self.data_dir, model.name)
            return freed

        def done(freed: int) -> None:
            self.removed.emit(model.name, freed)
            self.refresh()

        self.workers.start(work, name="remove model", success=done,
                           failure=lambda exc: self.caption.setText(f"{model.name} could not be removed: {exc}"))
