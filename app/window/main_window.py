"""The main window: assembles the sidebar, transcript, composer, tree panel, banner, status
bar and menus, and wires them to the controllers that do the work.

- ``ChatController`` (transcript_controller.py): the shown conversation and its reply,
  on top of ``app.session``;
- ``ModelController`` (model_controller.py): the engine process and the model;
- ``StatusBar`` (status_bar.py) and ``actions.py`` (every menu action, by name).

This class keeps only the glue: signals to slots, settings, theme, the sidebar's delete
and undo, and closing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QMainWindow, QSplitter, QVBoxLayout, QWidget

from app.session import ReplyState
from app.window import theme
from app.window.a11y import name_controls
from app.window.actions import build_menus
from app.window.app_settings import AppSettings
from app.window.banner import Banner
from app.window.chat_reader import ChatReader
from app.window.composer import Composer
from app.window.forget_flow import ForgetFlow
from app.window.gc_policy import GcPolicy
from app.window.import_dialog import ImportController, ImportDropMixin
from app.window.link_dialog import LinkConfirmMixin
from app.window.message_actions import MessageActionsMixin
from app.window.model_controller import ModelController
from app.window.prewarm_controller import PrewarmController
from app.window.server_controller import ServerActionsMixin, ServerController
from app.window.overflow_flow import OverflowFlow
from app.window.settings_flow import SettingsFlow
from app.window.safe_open import SafeOpenMixin
from app.window.sidebar import FORGET_NOTE, Sidebar
from app.window.status_bar import StatusBar
from app.window.transcript import TranscriptView
from app.window.transcript_controller import ChatController
from app.window.tree_panel import TreePanel
from storage.chats import ChatStore
from storage.errors import NotFoundError, StorageError
from storage.paths import CHATS_DB

log = logging.getLogger(__name__)


class MainWindow(ImportDropMixin, ServerActionsMixin, LinkConfirmMixin, MessageActionsMixin, SafeOpenMixin,
                 QMainWindow):
    """The Branchwise window on ``data_dir``.

    Args:
        data_dir: the data folder (``chats.sqlite3``, ``kvcache.sqlite3``, ``settings.json``, ``logs/``).
        model_path: a GGUF to load instead of the last used / default model.
        use_cache: False generates without the prefix store (for comparisons).
        start_engine: False leaves the engine process unstarted (tests of the bare window).

    Public hooks (tests and tools/): the signals model_ready(facts), model_failed(message),
    reply_finished(message id or 0), engine_died(message), coverage_ready(); ``chat`` (the
    ChatController: ``figures.coverage_pending``, ``flush_timer``, ``timeline``), ``model`` (ModelController),
    ``status`` (StatusBar) and ``client`` (EngineClient).
    """

    model_ready = Signal(dict)
    model_failed = Signal(str)
    reply_finished = Signal(int)
    engine_died = Signal(str)
    coverage_ready = Signal()
    forgotten = Signal(int, int)  # conversation id, KV blocks dropped (Delete and forget done)

    def __init__(self, data_dir: Path, model_path: str | None = None, use_cache: bool = True,
                 start_engine: bool = True):
        super().__init__()
        self.data_dir = Path(data_dir)
        self.logs_dir = self.data_dir / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.store = ChatStore(self.data_dir / CHATS_DB)
        interrupted = self.store.mark_interrupted_streams()
        self.settings = AppSettings.load(self.data_dir)
        self._data_version = self.store.data_version()  # to notice other processes' writes
        self.use_cache = use_cache
        self.colors = theme.apply(QApplication.instance(), self.settings.theme)
        self.closed = False
        self.overflow_box = None
        self.unanswered_box = None  # "Your last message has no reply" while it is shown
        self.link_dialog = None  # the "Open link?" dialog while it is shown
        self.settings_dialog = None
        self._undo_text = ""  # the banner text that offers to undo a delete

        self._build_ui()
        self.banner.restyle(self.colors)  # a dark theme from the settings, before any message
        self.status = StatusBar(self.statusBar())
        self.model = ModelController(self, model_path)
        self.chat = ChatController(self)
        self.importer = ImportController(self)
        self.api_server = ServerController(self)
        self.forget_flow = ForgetFlow(self)
        self.prewarm = PrewarmController(self)
        self.settings_flow = SettingsFlow(self)
        self.overflow_flow = OverflowFlow(self)
        self.gc_policy = GcPolicy(self)  # no full garbage collection in the middle of a redraw
        self._connect()
        self.menu_actions = build_menus(self)
        self.menu_actions["toggle_tree"].setChecked(self.settings.show_tree)
        self.api_server.state_changed.connect(self._api_state_changed)
        self._api_state_changed(self.api_server.state)
        self.resize(1180, 760)
        self.setAcceptDrops(True)
        self.sidebar.refresh()
        self._open_newest()
        if interrupted:
            self.banner.show_message(
                f"{interrupted} reply{'s were' if interrupted > 1 else ' was'} cut short when Branchwise "
                "last closed; the partial text is kept and marked as stopped.", "info")
        self.settings_flow.report_reset_fields()
        if start_engine:
            QTimer.singleShot(0, self.start_engine)

    # -- building ------------------------------------------------------------------------

    def _build_ui(self) -> None:
        self.reader = ChatReader(self.data_dir / CHATS_DB, self)  # reads big things off the UI thread
        self.sidebar = Sidebar(self.store, self.reader)
        self.banner = Banner()
        self.transcript = TranscriptView()
        self.composer = Composer()
        center = QWidget()
        lay = QVBoxLayout(center)
        lay.setContentsMargins(8, 8, 8, 0)
        lay.setSpacing(4)
        lay.addWidget(self.banner)
        lay.addWidget(self.transcript, 1)
        lay.addWidget(self.composer)
        self.tree = TreePanel(self.reader)
        self.tree.setVisible(self.settings.show_tree)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.sidebar)
        split.addWidget(center)
        split.addWidget(self.tree)
        split.setStretchFactor(1, 1)
        split.setSizes([250, 680, 250])
        split.setChildrenCollapsible(False)
        self.splitter = split
        self.setCentralWidget(split)
        name_controls(self)  # the composer's box and button, and what has no name of its own

    def _connect(self) -> None:
        chat, model = self.chat, self.model
        self.sidebar.selected.connect(self.show_conversation)
        self.sidebar.hit_opened.connect(self.open_search_hit)
        self.sidebar.new_chat.connect(self.new_chat)
        self.sidebar.deleted.connect(self._conversation_deleted)
        self.sidebar.restored.connect(self.show_conversation)
        self.sidebar.delete_committed.connect(self._delete_committed)
        self.sidebar.forget_requested.connect(self.forget_flow.forget)
        self.sidebar.stop_requested.connect(lambda _cid: chat.stop())  # a deleted chat's reply ends first
        self.sidebar.changed.connect(self.refresh_title)
        self.transcript.sibling_requested.connect(chat.switch_sibling)
        self.transcript.edit_saved.connect(self.edit_message)
        self.transcript.regenerate_requested.connect(self.regenerate)
        self.transcript.fork_requested.connect(self.fork)
        self.transcript.link_requested.connect(self.confirm_link)
        self.transcript.delete_requested.connect(self.delete_message)
        self.transcript.copy_conversation_requested.connect(self.copy_conversation_markdown)
        self.composer.send_requested.connect(self.send_message)
        self.composer.stop_requested.connect(chat.stop)
        self.tree.node_clicked.connect(chat.select)
        chat.reply_finished.connect(self.reply_finished)
        chat.coverage_ready.connect(self.coverage_ready)
        chat.path_shown.connect(self.prewarm.path_changed)
        self.prewarm.connect()
        model.ready.connect(self._model_ready)
        model.failed.connect(self.model_failed)
        model.died.connect(self._engine_died)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._system_scheme_changed)

    # -- what tests, tools and the controllers read ----------------------------------------

    @property
    def client(self):
        return self.model.client

    @property
    def model_state(self) -> str:
        return self.model.state

    @property
    def facts(self) -> dict | None:
        return self.model.facts

    @property
    def conversation_id(self) -> int | None:
        return self.chat.conversation_id

    @property
    def context_used(self) -> int:
        return self.status.context_used

    @property
    def stats_label(self):
        return self.status.stats_label

    @property
    def context_label(self):
        return self.status.context_label

    @property
    def model_label(self):
        return self.status.model_label

    # -- the engine and the model (ModelController) ---------------------------------------

    def start_engine(self) -> None:
        if not self.closed:
            self.model.start()

    def restart_engine(self) -> None:
        if self.chat.streaming:
            self.chat.abandon(ReplyState.STOPPED)
        self.model.restart()

    def load_model(self, path: str | None) -> None:
        self.model.load(path)

    def open_model_dialog(self) -> None:
        self.model.open_dialog()

    def fill_recent(self) -> None:
        self.model.fill_recent(self.recent_menu)

    def show_model_info(self) -> None:
        self.model.show_info()

    def _model_ready(self, facts: dict) -> None:
        if self.chat.conversation_id is None:
            self.chat.figures.update_context_label()
        self.chat.figures.request_context_count()
        self.prewarm.path_changed()
        self.model_ready.emit(facts)
        self.chat.figures.refresh_coverage()

    def _engine_died(self, message: str) -> None:
        self.chat.engine_gone()
        self.engine_died.emit(message)

    # -- conversations (ChatController) ---------------------------------------------------

    def new_chat(self) -> None:
        """Show an empty chat; it is created when the first message is sent."""
        self.show_conversation(None)
        self.composer.input.setFocus()

    def render(self) -> None:
        self.chat.render()

    def send_message(self, text: str) -> None:
        """Send ``text``; while an import holds the database's write lock, it is sent after
        (so are edits, regenerations and forks: ``ImportController.hold``)."""
        if not self.importer.hold_send(text):
            self.chat.send(text)

    def edit_message(self, message_id: int, text: str) -> None:
        if not self.importer.hold(lambda: self.chat.edit(message_id, text), "your edit will be sent"):
            self.chat.edit(message_id, text)

    def regenerate(self, message_id: int) -> None:
        if not self.importer.hold(lambda: self.chat.regenerate(message_id), "the reply will be regenerated"):
            self.chat.regenerate(message_id)

    def switch_sibling(self, message_id: int, delta: int) -> None:
        self.chat.switch_sibling(message_id, delta)

    def select_node(self, message_id: int) -> None:
        self.chat.select(message_id)

    def fork(self, message_id: int) -> None:
        if not self.importer.hold(lambda: self.chat.fork(message_id), "the fork will be made"):
            self.chat.fork(message_id)

    def stop_reply(self) -> None:
        self.chat.stop()

    def regenerate_last(self) -> None:
        mid = self.chat.last_message_id()
        if mid is not None:
            self.regenerate(mid)

    def fork_last(self) -> None:
        mid = self.chat.last_message_id()
        if mid is not None:
            self.fork(mid)

    def edit_last(self) -> None:
        if self.chat.streaming:
            return
        w = next((w for w in reversed(self.transcript.widgets) if w.role == "user" and w.message), None)
        if w is not None:
            w.begin_edit()

    def focus_search(self) -> None:
        self.sidebar.focus_search()

    def refresh_coverage(self) -> None:
        self.chat.figures.refresh_coverage()

    def refresh_title(self) -> None:
        title = "Branchwise"
        if self.chat.conversation_id is not None:
            try:
                title = f"{self.store.get_conversation(self.chat.conversation_id).title} — Branchwise"
            except StorageError:
                pass
        self.setWindowTitle(title)

    def storage_failed(self, exc: Exception) -> None:
        log.error("storage error: %s", exc)
        self.banner.show_message(f"Branchwise could not save to its database: {exc}", "error")

    def _conversation_deleted(self, cid: int) -> None:
        """The sidebar hid ``cid`` (its delete is pending): move away from it, offer Undo."""
        try:
            title = self.store.get_conversation(cid).title
        except StorageError:
            title = "the chat"
        if cid == self.chat.conversation_id:
            ids = self.sidebar.ids()
            self.show_conversation(ids[0] if ids else None)
        self._undo_text = f"Deleted “{title}”."
        if self.sidebar.pending_forget:
            self._undo_text += f" When Undo goes, it is forgotten: {FORGET_NOTE}"
        self.banner.show_message(self._undo_text, "info", [("Undo", self.sidebar.undo_delete)])

    def _delete_committed(self, _cid: int) -> None:
        if self.banner.isVisible() and self.banner.text == self._undo_text:
            self.banner.hide()

    # -- view, settings and theme -----------------------------------------------------------

    def toggle_tree(self) -> None:
        self.tree.setVisible(not self.tree.isVisible())
        self.menu_actions["toggle_tree"].setChecked(self.tree.isVisible())
        self.settings.show_tree = self.tree.isVisible()
        self.save_settings()
        self.chat.figures.refresh_coverage()

    def open_settings(self) -> None:
        self.settings_flow.open()

    def set_theme(self, name: str) -> None:
        self.settings.theme = name
        self.save_settings()
        self._apply_theme()

    def _apply_theme(self) -> None:
        self.colors = theme.apply(QApplication.instance(), self.settings.theme)
        self.banner.restyle(self.colors)
        self.chat.render()
        self.chat.figures.refresh_coverage()

    def _system_scheme_changed(self, *_args) -> None:
        if self.settings.theme == "system":
            self._apply_theme()

    def save_settings(self) -> None:
        try:
            self.settings.save(self.data_dir)
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

    # -- closing -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Save a reply in progress as "stopped", stop the engine and close the database.
        Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self.sidebar.commit_delete()  # before the engine stops: it carries out a Delete and forget
        self.importer.shutdown()
        self.api_server.shutdown()
        self.chat.shutdown()
        self.save_settings()
        self.reader.close()
        self.transcript.stop_building()  # a scroll event after this must not read the closed store
        self.store.close()
        self.gc_policy.release()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow() and not self.closed:
            self.show_external_changes()

    def show_external_changes(self) -> bool:
        """Coming back to the window, or sending: if another process (the CLI, a second
        window) or a worker wrote to the chats since, redraw the sidebar and the shown
        branch. Returns True when it did."""
        try:
            version = self.store.data_version()
        except StorageError:
            return False
        seen, self._data_version = self._data_version, version
        if version == seen or self.chat.streaming:
            return False
        self.sidebar.refresh()
        cid = self.chat.conversation_id
        if cid is not None:
            try:
                self.store.get_conversation(cid)
            except NotFoundError:  # deleted by the other process
                cid = None
            self.show_conversation(cid)
        return True

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.shutdown()
        super().closeEvent(event)
