"""The Models window (Model → Find models…, Ctrl+Shift+M): find GGUF models on a hub, see
whether each file fits this machine, download one, and keep a library.

Nothing here touches the network until the user searches, opens a repository or
downloads; the window names the host it contacts (``HF_ENDPOINT`` when set). With an empty
search box it shows the starter list (``engine/hub/starter_models.json``, no network).
Every hub request, header read and library listing runs as a task of the window's
``Workers``; a newer search or repository supersedes an older one (its result is dropped).
Every text from the hub (names, licences) is shown as plain text: tree items and
plain-text labels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QSize, Qt, Signal
from PySide6.QtWidgets import (QDialog, QHBoxLayout, QHeaderView, QInputDialog, QLabel, QLineEdit, QPushButton,
                               QSplitter, QTabWidget, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from app.window.flows.download_flow import DownloadFlow, DownloadState, progress_text
from app.window.flows.models_library import LibraryTab
from app.window.shell.plain import plain_label
from app.window.shell.status_bar import OVER_COLOR
from app.window.workers.tasks import Workers

ROLE = Qt.ItemDataRole.UserRole
SEARCH_COLUMNS = ["Repository", "Downloads", "Likes", "Licence", "Updated"]


def _tree(columns: list[str], name: str) -> QTreeWidget:
    tree = QTreeWidget()
    tree.setObjectName(name)
    tree.setHeaderLabels(columns)
    tree.setRootIsDecorated(False)
    tree.setUniformRowHeights(True)
    tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    tree.header().setStretchLastSection(False)
    for i in range(1, len(columns)):
        tree.header().setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
    tree.setAccessibleName(name.replace("_", " ").capitalize())
    return tree


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


class ModelsWindow(QDialog):
    """The window itself. Collaborators: ``workers`` (its tasks), ``downloads`` (the
    window's ``DownloadFlow``), ``data_dir`` (the hub token, the library), ``fit_context``
    (a callable giving (context tokens, KV type, bytes the loaded model frees) for the fit
    estimate).

    Signals: use_requested(path) (Use on a downloaded or library model).
    """

    use_requested = Signal(str)

    def __init__(self, *, workers: Workers, downloads: DownloadFlow, data_dir: Path,
                 fit_context: Callable[[], tuple[int, str, int]], parent: QWidget | None = None):
        super().__init__(parent)
        from engine.hub import catalog

        self.workers, self.downloads, self.data_dir, self.fit_context = workers, downloads, Path(data_dir), fit_context
        self.setWindowTitle("Models")
        self.setModal(False)
        self.resize(980, 680)
        self._search_job = 0
        self._files_job = 0
        self.repo_files = None  # the catalog.RepoFiles shown
        self._freed = 0  # bytes the loaded model gives back, counted in the available memory
        self.searches = 0  # searches sent to the hub (tests: none before the user asks)
        lay = QVBoxLayout(self)
        self.host_label = plain_label(QLabel())
        self.host_label.setObjectName("hub_host")
        self.host_label.setWordWrap(True)
        via = " (set by HF_ENDPOINT)" if catalog.endpoint() != catalog.DEFAULT_ENDPOINT else ""
        self.host_label.setText(f"Searches and downloads contact {catalog.host()}{via}, and only when you ask: "
                                "nothing is sent before you search, open a repository or download.")
        lay.addWidget(self.host_label)
        self.tabs = QTabWidget()
        lay.addWidget(self.tabs, 1)
        self.tabs.addTab(self._find_tab(catalog.host()), "Find")
        self.library = LibraryTab(workers=workers, data_dir=self.data_dir, parent=self)
        self.library.use_requested.connect(self.use_requested)
        self.tabs.addTab(self.library, "Library")
        self.tabs.currentChanged.connect(lambda i: self.library.refresh() if self.tabs.widget(i) is self.library
                                         else None)
        downloads.changed.connect(self._download_changed)
        downloads.finished.connect(lambda _n, _p: self.library.refresh())
        self.show_starters()

    # -- building --------------------------------------------------------------------------

    def _find_tab(self, host: str) -> QWidget:
        tab = QWidget()
        lay = QVBoxLayout(tab)
        row = QHBoxLayout()
        self.search_box = QLineEdit()
        self.search_box.setObjectName("model_search")
        self.search_box.setPlaceholderText(f"Search GGUF models on {host} (for example: qwen, gemma, llama)")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.returnPressed.connect(self.search)
        self.search_box.textChanged.connect(lambda t: self.show_starters() if not t.strip() else None)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        row.addWidget(self.search_box, 1)
        row.addWidget(self.search_button)
        lay.addLayout(row)
        split = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        self.results_caption = plain_label(QLabel())
        self.results_caption.setWordWrap(True)
        self.results = _tree(SEARCH_COLUMNS, "search_results")
        self.results.itemActivated.connect(lambda item, _c: self.open_repo(item.data(0, ROLE)["repo"]))
        self.results.itemSelectionChanged.connect(
            lambda: self.open_button.setEnabled(bool(self.results.selectedItems())))
        self.open_button = QPushButton("Show files")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self._open_selected)
        tl.addWidget(self.results_caption)
        tl.addWidget(self.results, 1)
        tl.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignRight)
        bottom = QWidget()
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(0, 0, 0, 0)
        self.files_caption = plain_label(QLabel("Choose a repository to see its files and whether each fits."))
        self.files_caption.setObjectName("files_caption")
        self.files_caption.setWordWrap(True)
        self.files = _tree(["File", "Size", "Fit", "Memory needed", "Largest context"], "repo_files")
        self.files.setRootIsDecorated(True)
        fm = self.files.fontMetrics()  # room for the longest size and verdict, before any file is listed
        for col, widest in ((1, "999.9 GB"), (2, "Too large · Recommended")):
            self.files.headerItem().setSizeHint(col, QSize(fm.horizontalAdvance(widest) + 3 * fm.averageCharWidth(),
                                                           fm.height() + 8))
        self.files.itemSelectionChanged.connect(self._file_selected)
        self.files.itemActivated.connect(lambda _i, _c: self.download_selected())
        buttons = QHBoxLayout()
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        buttons.addStretch(1)
        buttons.addWidget(self.download_button)
        bl.addWidget(self.files_caption)
        bl.addWidget(self.files, 1)
        bl.addLayout(buttons)
        bl.addWidget(self._downloads_box())
        split.addWidget(top)
        split.addWidget(bottom)
        split.setSizes([240, 420])
        lay.addWidget(split, 1)
        return tab

    def _downloads_box(self) -> QWidget:
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 0, 0, 0)
        self.downloads_view = _tree(["Download", "Progress"], "downloads")
        self.downloads_view.header().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.downloads_view.setMaximumHeight(110)
        self.downloads_view.itemSelectionChanged.connect(self._download_selected)
        row = QHBoxLayout()
        self.cancel_button = QPushButton("Cancel download")
        self.resume_button = QPushButton("Resume")
        self.use_download_button = QPushButton("Use")
        for b, fn in ((self.cancel_button, self.downloads.cancel), (self.resume_button, self.downloads.resume),
                      (self.use_download_button, self._use_download)):
            b.setEnabled(False)
            b.clicked.connect(lambda _c=False, f=fn: self._on_selected_download(f))
            row.addWidget(b)
        row.addStretch(1)
        lay.addWidget(self.downloads_view)
        lay.addLayout(row)
        box.setVisible(False)
        self.downloads_box = box
        return box

    # -- searching ---------------------------------------------------------------------------

    def show_starters(self) -> None:
        """The starter list (no network): source, size, and which models reason."""
        from engine.hub import catalog

        self._search_job += 1  # a search still running is not shown over it
        self.results.clear()
        self.results.setHeaderLabels(["Model (source repository)", "Size", "Kind", "Licence", "Parameters"])
        for m in catalog.starter_models():
            kind = "reasoning" if m["reasoning"] else "instruct"
            item = QTreeWidgetItem([m["repo"], f"≈ {m['size_gb']:.1f} GB ({m['quantization']})", kind,
                                    m["licence"], m["params"]])
            if m.get("note"):
                item.setToolTip(0, m["note"])
            item.setData(0, ROLE, m)
            self.results.addTopLevelItem(item)
        self._caption("Well-known instruct models (a list shipped with Branchwise; nothing was "
                                     "searched). Reasoning models think before they answer: longer replies, "
                                     "better at maths and code.")

    def search(self) -> None:
        """Search the hub for the box's text (a task); an empty box shows the starter list."""
        from engine.hub import catalog

        query = self.search_box.text().strip()
        if not query:
            self.show_starters()
            return
        self._search_job += 1
        job = self._search_job
        self.searches += 1
        token = catalog.read_token(self.data_dir)
        self.results.clear()  # the starter list (or the last search) is not this search's results
        self.results.setHeaderLabels(SEARCH_COLUMNS)
        self._caption(f"Searching {catalog.host()} for {query!r}…")
        self.workers.start(lambda _t: catalog.search(query, token=token), name="hub search",
                           success=lambda results: self._results(job, query, results),
                           failure=lambda exc: self._search_failed(job, exc))

    def _results(self, job: int, query: str, results) -> None:
        from engine.hub import catalog

        if job != self._search_job:
            return
        self.results.clear()
        self.results.setHeaderLabels(SEARCH_COLUMNS)
        for r in results:
            item = QTreeWidgetItem([r.repo + ("  (gated)" if r.gated else ""), _count(r.downloads),
                                    _count(r.likes), r.licence or "?", r.updated or "?"])
            item.setData(0, ROLE, {"repo": r.repo})
            for col in (1, 2):
                item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.results.addTopLevelItem(item)
        n = len(results)
        self._caption(f"{n} GGUF repositor{'y' if n == 1 else 'ies'} on {catalog.host()} "
                                     f"match {query!r}, most downloaded first." if n else
                                     f"No GGUF repositories on {catalog.host()} match {query!r}.")

    def _search_failed(self, job: int, exc: Exception) -> None:
        if job == self._search_job:
            self.results.clear()
            self._caption(str(exc), error=True)

    def _caption(self, text: str, error: bool = False) -> None:
        """The results' caption; ``error``: in the error colour (a failed search)."""
        self.results_caption.setText(text)
        self.results_caption.setStyleSheet(f"color:{OVER_COLOR}; font-weight:bold;" if error else "")

    # -- a repository's files ----------------------------------------------------------------

    def _open_selected(self) -> None:
        items = self.results.selectedItems()
        if items:
            self.open_repo(items[0].data(0, ROLE)["repo"], items[0].data(0, ROLE).get("file"))

    def open_repo(self, repo: str, select: str | None = None, token_asked: bool = False) -> None:
        """List ``repo``'s GGUF files by quantization with their fit labels (a task: the
        listing and one ranged header read per model); ``select`` a file name to select."""
        from engine.hub import catalog, fit

        self._files_job += 1
        job = self._files_job
        self.files.clear()
        self.download_button.setEnabled(False)
        token = catalog.read_token(self.data_dir)
        n_ctx, kv_type, freed = self.fit_context()
        self.files_caption.setText(f"Reading {repo} from {catalog.host()} (the list, then the first MB of each "
                                   "model's header)…")

        def work(_task):
            listing = catalog.repo_files(repo, token=token)
            rows, available = fit.fit_repo_files(listing, token, n_ctx, kv_type, freed_bytes=freed)
            return listing, available

        self._freed = freed
        self.workers.start(work, name="hub files", success=lambda r: self._files(job, r, select),
                           failure=lambda exc: self._files_failed(job, repo, select, exc, token_asked))

    def _files(self, job: int, result, select: str | None) -> None:
        from engine.hub import catalog, fit

        if job != self._files_job:
            return
        listing, available = result
        self.repo_files = listing
        self.files.clear()
        chosen = None
        for quant, models in listing.by_quantization().items():
            group = QTreeWidgetItem([quant, "", "", "", ""])
            group.setFlags(group.flags() & ~Qt.ItemFlag.ItemIsSelectable)
            self.files.addTopLevelItem(group)
            for f in models:
                lab = f.labels
                parts = f" ({len(f.parts)} parts)" if len(f.parts) > 1 else ""
                verdict = lab["fit"] + (" · Recommended" if lab["recommended"] else "")
                spare = f"none with {100 - round(fit.HEADROOM * 100)} % to spare"  # a Tight file: it fits, barely
                largest = (f"{lab['largest_context']:,} tokens" if lab["largest_context"]
                           else spare if lab["fit"] == fit.TIGHT else "none fits")
                item = QTreeWidgetItem([Path(f.name).name + parts, fit.gb(f.size), verdict,
                                        f"≈ {fit.gb(lab['needs'])} at {lab['n_ctx']:,} tokens", largest])
                item.setToolTip(2, lab["text"])
                item.setData(0, ROLE, f)
                group.addChild(item)
                if select and select in (f.name, Path(f.name).name) or (not select and lab["recommended"]):
                    chosen = item
            group.setExpanded(True)
        if chosen is not None:
            self.files.setCurrentItem(chosen)
        n = len(listing.files)
        self.files_caption.setText(
            f"{listing.repo} ({listing.licence or 'licence not stated'}) on {catalog.host()}: {n} model file"
            f"{'' if n == 1 else 's'}; {fit.gb(available)} of memory available"
            f"{' (counting the loaded model as freed)' if self._freed else ''}. Fits: within 80 % of it; Tight: up "
            "to all of it." if n else
            f"{listing.repo} on {catalog.host()} has no GGUF model files.")

    def _files_failed(self, job: int, repo: str, select: str | None, exc: Exception, token_asked: bool) -> None:
        from engine.hub import catalog

        if job != self._files_job:
            return
        if isinstance(exc, catalog.GatedError) and not token_asked:
            token = self.ask_token(repo)
            if token:
                try:
                    catalog.save_token(self.data_dir, token)
                except (ValueError, OSError) as err:
                    self.files_caption.setText(str(err))
                    return
                self.open_repo(repo, select, token_asked=True)
                return
        self.files_caption.setText(str(exc))

    def ask_token(self, repo: str) -> str | None:
        """Ask for a hub access token for the gated ``repo`` (hidden as typed); None: cancelled."""
        from engine.hub import catalog

        text, ok = QInputDialog.getText(
            self, "Access token",
            f"{repo} is gated on {catalog.host()}. Accept its licence on the hub, then paste an access token "
            f"here. It is stored in {self.data_dir / catalog.TOKEN_FILE}, readable by you only, and sent only to "
            f"{catalog.host()}.", QLineEdit.EchoMode.Password)
        return text.strip() if ok and text.strip() else None

    def _file_selected(self) -> None:
        items = self.files.selectedItems()
        self.download_button.setEnabled(bool(items) and items[0].data(0, ROLE) is not None)

    def download_selected(self) -> None:
        """Download the selected file (every part of a split one) into the library."""
        from engine.hub import catalog

        items = self.files.selectedItems()
        model = items[0].data(0, ROLE) if items else None
        if model is None or self.repo_files is None:
            return
        files, extra = catalog.download_plan(self.repo_files, model)
        self.downloads.start(Path(model.name).name, self.repo_files.repo, files, extra,
                             catalog.read_token(self.data_dir))

    # -- downloads ---------------------------------------------------------------------------

    def _download_changed(self, name: str) -> None:
        d = self.downloads.downloads.get(name)
        if d is None:
            return
        self.downloads_box.setVisible(True)
        item = next((self.downloads_view.topLevelItem(i) for i in range(self.downloads_view.topLevelItemCount())
                     if self.downloads_view.topLevelItem(i).data(0, ROLE) == name), None)
        if item is None:
            item = QTreeWidgetItem([name, ""])
            item.setData(0, ROLE, name)
            self.downloads_view.addTopLevelItem(item)
            self.downloads_view.setCurrentItem(item)
        item.setText(1, progress_text(d))
        item.setToolTip(1, progress_text(d))
        self._download_selected()

    def _selected_download(self):
        items = self.downloads_view.selectedItems()
        return self.downloads.downloads.get(items[0].data(0, ROLE)) if items else None

    def _download_selected(self) -> None:
        d = self._selected_download()
        state = d.state if d else None
        self.cancel_button.setEnabled(state == DownloadState.RUNNING)
        self.resume_button.setEnabled(state in (DownloadState.CANCELLED, DownloadState.FAILED))
        self.use_download_button.setEnabled(state == DownloadState.DONE)

    def _on_selected_download(self, fn) -> None:
        d = self._selected_download()
        if d is not None:
            fn(d.name)

    def _use_download(self, name: str) -> None:
        d = self.downloads.downloads.get(name)
        if d is not None and d.paths:
            self.use_requested.emit(str(d.paths[0]))


class ModelsFlow(QObject):
    """Opens the Models window (one, made when first asked for) and owns the downloads.
    ``status`` gets the downloads' bar; ``load`` is called with a model file to use."""

    def __init__(self, *, workers: Workers, data_dir: Path, status, load: Callable[[str], None],
                 fit_context: Callable[[], tuple[int, str, int]], parent: QWidget):
        super().__init__(parent)
        from engine.hub.library import models_dir

        self.workers, self.data_dir, self.load, self.fit_context = workers, Path(data_dir), load, fit_context
        self.parent_widget = parent
        self.downloads = DownloadFlow(workers=workers, models_dir=models_dir(self.data_dir), parent=self)
        status.bar.addPermanentWidget(self.downloads.status_bar)
        self.window: ModelsWindow | None = None

    def open(self) -> ModelsWindow:
        """Show the Models window (made the first time) and return it."""
        if self.window is None:
            self.window = ModelsWindow(workers=self.workers, downloads=self.downloads, data_dir=self.data_dir,
                                       fit_context=self.fit_context, parent=self.parent_widget)
            self.window.use_requested.connect(self.load)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
        return self.window

    def shutdown(self) -> None:
        """Stop every download (the window closes); the bytes stay for the next attempt."""
        for d in self.downloads.running:
            self.downloads.cancel(d.name)
