"""The main window: builds the widgets (sidebar, transcript, composer, tree panel, banner,
status bar, menus), creates the flows that do the work, each with the collaborators it
uses, and connects them by their signals.

- ``ChatController`` (transcript/chat_controller.py): the shown conversation and its reply,
  on top of ``app.session``; ``ChatCommands`` (flows/commands.py) is what the composer, the
  bubbles and the menus ask of it;
- ``Navigator`` (flows/navigator.py): which chat is shown, and changes made elsewhere;
- ``ModelController`` (flows/model_controller.py): the engine process and the model;
- ``SettingsModel`` (settings/settings_model.py) and ``Look`` (shell/look.py): the settings
  and what follows them (the theme, the tree panel);
- ``Workers`` (workers/tasks.py): every thread of the window, ended by ``shutdown``.

This class keeps only the assembly, the Qt events of the window itself (activation, close,
drag and drop) and the hooks tests and tools use.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import QMainWindow, QScrollArea, QSplitter, QVBoxLayout, QWidget

from app.window.flows.attach_flow import AttachFlow, AttachingSession
from app.window.flows.attach_input import AttachInput
from app.window.flows.chat_model_flow import ChatModelFlow
from app.window.flows.commands import ChatCommands
from app.window.flows.document_search import DocumentSearch
from app.window.flows.extras import install_extras
from app.window.flows.forget_flow import ForgetFlow
from app.window.flows.import_dialog import ImportController, accept_drag, dropped_paths
from app.window.flows.link_dialog import LinkOpener
from app.window.flows.message_actions import MessageActions
from app.window.flows.model_controller import ModelController
from app.window.flows.models_window import ModelsFlow
from app.window.flows.navigator import Navigator
from app.window.flows.prewarm_controller import PrewarmController
from app.window.flows.server_controller import ApiState, ServerController
from app.window.settings.settings_flow import SettingsFlow
from app.window.settings.settings_model import SettingsModel
from app.window.shell.a11y import name_controls
from app.window.shell.actions import build_menus
from app.window.shell.banner import Banner
from app.window.shell.gc_policy import GcPolicy
from app.window.shell.lifetime import Lifetime
from app.window.shell.look import Look
from app.window.shell.status_bar import StatusBar
from app.window.shell.window_layout import WindowLayout
from app.window.transcript.attachment_chip import AttachmentBar
from app.window.transcript.attachment_marks import AttachmentMarks
from app.window.transcript.chat_controller import ChatController
from app.window.transcript.composer import Composer
from app.window.transcript.transcript_view import TranscriptView
from app.window.tree.sidebar import Sidebar
from app.window.tree.tree_panel import TreePanel
from app.window.workers.chat_reader import ChatReader
from app.window.workers.path_ids import PathIds
from app.window.workers.tasks import SHUTDOWN_S, Workers
from storage.chats import ChatStore
from storage.paths import CHATS_DB

log = logging.getLogger(__name__)


class MainWindow(QMainWindow):
    """The Branchwise window on ``data_dir``.

    Args:
        data_dir: the data folder (``chats.sqlite3``, ``kvcache.sqlite3``, ``settings.json``, ``logs/``).
        model_path: a GGUF to load instead of the last used / default model.
        use_cache: False generates without the prefix store (for comparisons; later, set
            ``chat.use_cache``).
        start_engine: False leaves the engine process unstarted (tests of the bare window).

    Public hooks (tests and tools/): the signals model_ready(facts), model_failed(message),
    reply_finished(message id or 0), engine_died(message), coverage_ready(),
    forgotten(conversation id, KV blocks dropped); the widgets (``sidebar``, ``transcript``,
    ``composer``, ``tree``, ``banner``, ``status``), the settings (``settings``, ``look``) and
    the flows (``chat``: ``figures.coverage_pending``, ``flush_timer``, ``timeline``;
    ``commands``, ``navigator``, ``model``, ``client``, ``importer``, ``api_server``,
    ``forget_flow``, ``prewarm``, ``settings_flow``, ``overflow_flow``, ``messages``, ``links``).
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
        self.settings = SettingsModel(self.data_dir, parent=self)
        self.lifetime = Lifetime()
        self.look = Look(self.settings, self)  # applies the theme before any widget is built
        self._build_ui()
        self.banner.restyle(self.look.colors)  # a dark theme from the settings, before any message
        self.attachments_bar.colors = self.look.colors
        self.status = StatusBar(self.statusBar())
        self._build_flows(model_path, use_cache)
        self.extras = install_extras(self)  # Continue, Export chat…, the draft count, model titles
        self.gc_policy = GcPolicy(self)  # no full garbage collection in the middle of a redraw
        self._connect()
        self.menu_actions = build_menus(self, self._menu_handlers(), self.settings.theme)
        self.menu_actions["toggle_tree"].setChecked(self.settings.show_tree)
        self._api_state_changed(self.api_server.state)
        self.layout_keeper.restore()  # the size and panel widths of the last run (else the shares)
        self.setAcceptDrops(True)
        self.sidebar.refresh()
        self.navigator.open_newest()
        if interrupted:
            self.banner.show_message(
                f"{interrupted} reply{'s were' if interrupted > 1 else ' was'} cut short when Branchwise "
                "last closed; the partial text is kept and marked as stopped.", "info")
        self.settings_flow.report_reset_fields()
        if start_engine:
            QTimer.singleShot(0, self, lambda: None if self.lifetime.closed else self.model.start())

    # -- building ------------------------------------------------------------------------

    def _build_ui(self) -> None:
        self.workers = Workers(self)  # every thread of the window (workers/tasks.py)
        self.reader = ChatReader(self.data_dir / CHATS_DB, self.workers, self)  # reads big things off the UI thread
        self.sidebar = Sidebar(self.store, self.workers, self.reader)
        self.banner = Banner()
        self.transcript = TranscriptView()
        self.composer = Composer()
        self.attachments_bar = AttachmentBar()  # the composer's file chips, and its note under it
        center = QWidget()
        lay = QVBoxLayout(center)
        lay.setContentsMargins(8, 8, 8, 0)
        lay.setSpacing(4)
        lay.addWidget(self.banner)
        lay.addWidget(self.transcript, 1)
        lay.addWidget(self.attachments_bar)
        lay.addWidget(self.composer)
        lay.addWidget(self.attachments_bar.note)
        self.tree = TreePanel(self.reader)
        self.look.follow_tree(self.tree)
        for area in self.tree.findChildren(QScrollArea):  # one Tab stop: the canvas, not its frame too
            area.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.sidebar)
        split.addWidget(center)
        split.addWidget(self.tree)
        self.splitter = split
        self.center = center  # the banner, the chat's model bar, the transcript, the composer
        self.layout_keeper = WindowLayout(self, split, self.settings)  # shares, stretch, remembered sizes
        self.setCentralWidget(split)
        name_controls(self)  # the composer's box and button, and what has no name of its own

    def _build_flows(self, model_path: str | None, use_cache: bool) -> None:
        """The flows, each given the collaborators it uses (see their docstrings)."""
        store, settings, banner, status, lifetime = self.store, self.settings, self.banner, self.status, self.lifetime
        self.model = ModelController(settings=settings, banner=banner, status=status, workers=self.workers,
                                     data_dir=self.data_dir, logs_dir=self.logs_dir, parent=self,
                                     explicit_model=model_path)
        self.chat = chat = ChatController(
            store=store, settings=settings, model=self.model, reader=self.reader, look=self.look, lifetime=lifetime,
            transcript=self.transcript, tree=self.tree, composer=self.composer, status=status, banner=banner,
            parent=self, use_cache=use_cache)
        self.overflow_flow = chat.overflow
        self.navigator = Navigator(store=store, chat=chat, sidebar=self.sidebar, banner=banner,
                                   transcript=self.transcript, composer=self.composer, lifetime=lifetime, parent=self)
        self.importer = ImportController(db_path=store.path, workers=self.workers, chat=chat, sidebar=self.sidebar,
                                         banner=banner, lifetime=lifetime, parent=self)
        self.commands = ChatCommands(chat=chat, importer=self.importer, transcript=self.transcript, model=self.model,
                                     parent=self)
        self.api_server = ServerController(settings=settings, model=self.model, banner=banner, status=status,
                                           data_dir=self.data_dir, parent=self)
        self.forget_flow = ForgetFlow(store=store, model=self.model, sidebar=self.sidebar, banner=banner,
                                      lifetime=lifetime, parent=self)
        self.prewarm = PrewarmController(chat=chat, model=self.model, settings=settings, composer=self.composer,
                                         transcript=self.transcript, reader=self.reader, lifetime=lifetime,
                                         window=self)
        self.settings_flow = SettingsFlow(settings=settings, store=store, chat=chat, model=self.model, banner=banner,
                                          parent=self)
        self.messages = MessageActions(store=store, chat=chat, banner=banner, status=status, workers=self.workers,
                                       parent=self)
        self.links = LinkOpener(self)
        self.models = ModelsFlow(workers=self.workers, data_dir=self.data_dir, status=status, load=self.model.load,
                                 fit_context=self._fit_context, parent=self)
        self.chat_model = ChatModelFlow(store=store, model=self.model, settings=settings, status=status,
                                        find_models=self.models.open, parent=self)
        self.center.layout().insertWidget(1, self.chat_model.bar)  # under the banner
        self.transcript.set_empty_extra(self.chat_model.first_screen)
        # attached documents: the composer's files, sent with the message (attach_flow.py)
        self.attach = AttachFlow(store=store, workers=self.workers, model=self.model, bar=self.attachments_bar,
                                 lifetime=lifetime, parent=self)
        self.attach_input = AttachInput(self.composer, self.attach, self)
        chat.session = AttachingSession(store, self.attach)
        self.document_search = DocumentSearch(chat=chat, flow=self.attach, workers=self.workers, parent=self)
        chat.overflow.attachments, chat.overflow.document_search = self.attach, self.document_search
        self.prewarm.attachments = self.attach
        self.attachment_marks = AttachmentMarks(store, self.workers, self)
        self.transcript.decorate = self.attachment_marks.decorate
        self.transcript.complete_path = PathIds(self.reader, self.transcript, self).want

    def _connect(self) -> None:
        chat, nav, commands, sidebar, transcript = self.chat, self.navigator, self.commands, self.sidebar, self.transcript
        sidebar.selected.connect(self.show_conversation)
        sidebar.hit_opened.connect(nav.open_search_hit)
        sidebar.hit_opened.connect(lambda _cid, mid: transcript.mark_terms(mid, sidebar.search.text()))
        sidebar.new_chat.connect(nav.new_chat)
        sidebar.deleted.connect(nav.conversation_deleted)
        sidebar.restored.connect(self.show_conversation)
        sidebar.delete_committed.connect(nav.delete_committed)
        sidebar.forget_requested.connect(self.forget_flow.forget)
        sidebar.stop_requested.connect(lambda _cid: chat.stop())  # a deleted chat's reply ends first
        sidebar.changed.connect(chat.refresh_title)
        transcript.sibling_requested.connect(chat.switch_sibling)
        transcript.edit_saved.connect(commands.edit)
        transcript.regenerate_requested.connect(commands.regenerate)
        transcript.fork_requested.connect(commands.fork)
        transcript.link_requested.connect(self.links.confirm)
        transcript.delete_requested.connect(self.messages.delete_message)
        transcript.copy_conversation_requested.connect(self.messages.copy_conversation_markdown)
        transcript.filling_changed.connect(self.reader.hold)  # a chat's first screen before its tree and prompt
        self.composer.send_requested.connect(commands.send)
        self.composer.stop_requested.connect(chat.stop)
        self.tree.node_clicked.connect(chat.select)
        chat.reply_finished.connect(self.reply_finished)
        chat.reply_finished.connect(self.chat_model.reply_saved)
        chat.current_changed.connect(self.chat_model.chat_shown)
        chat.coverage_ready.connect(self.coverage_ready)
        chat.path_shown.connect(self.prewarm.path_changed)
        chat.current_changed.connect(sidebar.set_current)
        chat.busy_changed.connect(lambda cid: setattr(sidebar, "busy_id", cid))
        chat.busy_changed.connect(self._reply_started)
        chat.chats_changed.connect(sidebar.refresh)
        chat.title_changed.connect(self.setWindowTitle)
        chat.changed_elsewhere.connect(nav.changed_elsewhere)
        chat.unshowable.connect(nav.chat_unshowable)
        self.prewarm.connect()
        self.attach.prewarm_wanted.connect(self.prewarm.attachments_changed)
        self.prewarm.answered.connect(chat.figures.prewarmed)  # what was restored now, in the status line
        for flow in (self.model, chat.overflow):
            flow.settings_requested.connect(self.open_settings)
        self.model.ready.connect(self._model_ready)
        self.model.failed.connect(self.model_failed)
        self.model.died.connect(lambda message: (chat.engine_gone(), self.engine_died.emit(message)))
        self.importer.show_requested.connect(self.show_conversation)
        self.forget_flow.forgotten.connect(self.forgotten)
        self.api_server.state_changed.connect(self._api_state_changed)
        self.look.restyled.connect(self.banner.restyle)
        self.look.restyled.connect(lambda colors: setattr(self.attachments_bar, "colors", colors))
        self.look.restyled.connect(lambda _colors: (chat.render(), chat.figures.refresh_coverage()))
        self.look.tree_shown.connect(lambda shown: (self.menu_actions["toggle_tree"].setChecked(shown),
                                                    chat.figures.refresh_coverage()))

    def _menu_handlers(self) -> dict:
        """What each action of ``actions.ACTIONS`` runs, by name."""
        chat, commands, model, importer = self.chat, self.commands, self.model, self.importer
        return {
            "new_chat": self.navigator.new_chat, "open_model_dialog": model.open_dialog,
            "recent_models": model.fill_recent, "show_model_info": model.show_info,
            "restart_engine": commands.restart_engine, "import_chats": importer.open_dialog,
            "import_folder": importer.open_folder_dialog, "open_settings": self.open_settings, "close": self.close,
            "focus_search": self.sidebar.focus_search, "regenerate_last": commands.regenerate_last,
            "edit_last": commands.edit_last, "stop_reply": chat.stop, "fork_last": commands.fork_last,
            "copy_conversation_markdown": self.messages.copy_conversation_markdown,
            "start_api_server": self.api_server.start, "stop_api_server": self.api_server.stop,
            "toggle_tree": self.look.toggle_tree, "theme": self.look.set_theme,
            "find_models": self.models.open,
            "export_chat": self.extras.exporting.open_dialog, "continue_reply": self.extras.continuing.continue_last,
        }

    def _fit_context(self) -> tuple[int, str, int]:
        """(context tokens, KV type, bytes the loaded model gives back) for the Models
        window's fit estimate."""
        f = self.model.facts or {}
        freed = int(f.get("size_bytes") or 0) + int(f.get("kv_bytes_per_token") or 0) * int(f.get("n_ctx") or 0)
        return self.settings.n_ctx, self.settings.type_v, 0 if f.get("remote") else freed

    def _reply_started(self, conversation_id: int | None) -> None:
        """A reply started: a notice about the model (a failed load, a fall-back) has been read."""
        if conversation_id is not None and self.banner.topic == "model" and self.model_state == "ready":
            self.banner.hide()

    def _api_state_changed(self, state: str) -> None:
        """The Server menu: each action enabled only when it can work."""
        self.menu_actions["start_api_server"].setEnabled(state in (ApiState.STOPPED, ApiState.FAILED))
        self.menu_actions["stop_api_server"].setEnabled(state in (ApiState.STARTING, ApiState.RUNNING))

    def _model_ready(self, facts: dict) -> None:
        figures = self.chat.figures
        if self.chat.conversation_id is None:
            figures.update_context_label()
        figures.request_context_count()
        self.prewarm.path_changed()
        self.model_ready.emit(facts)
        figures.refresh_coverage()

    # -- what tests and tools use most ---------------------------------------------------------

    @property
    def client(self):
        """The ``EngineClient`` (``model.client``)."""
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

    def show_conversation(self, conversation_id: int | None) -> bool:
        """Show ``conversation_id`` (None: the new-chat page); False when it cannot be
        (``Navigator.show_conversation``)."""
        return self.navigator.show_conversation(conversation_id)

    def send_message(self, text: str) -> None:
        """As Enter in the composer does (``ChatCommands.send``)."""
        self.commands.send(text)

    def open_settings(self) -> None:
        self.settings_flow.open()

    def load_model(self, path: str | None) -> None:
        """Load the GGUF at ``path`` (None: the embedded default model)."""
        self.model.load(path)

    # -- the window's own events, and closing ------------------------------------------------

    def shutdown(self) -> None:
        """Save a reply in progress as "stopped", stop the engine, close the database and end
        the window's threads (within ``SHUTDOWN_S``). Safe to call twice."""
        if self.lifetime.closed:
            return
        self.lifetime.close()
        self.sidebar.commit_delete()  # before the engine stops: it carries out a Delete and forget
        self.importer.shutdown()  # before anything writes: the import holds the write lock
        self.api_server.shutdown()
        self.models.shutdown()  # downloads stop; their bytes stay for the next attempt
        self.chat.tools.shutdown()  # a tool call is abandoned, the MCP client's thread ends
        if self.settings_flow.dialog is not None:
            self.settings_flow.dialog.tools_tab.shutdown()  # a tool listing under way ends too
        self.chat.shutdown()
        self.attach.shutdown()  # files attached but never sent are not kept
        self.layout_keeper.save()
        self.settings.save()
        self.reader.close()
        self.transcript.stop_building()  # a scroll event after this must not read the closed store
        self.store.close()
        self.workers.shutdown(SHUTDOWN_S)  # the chat reader, a scrub: each ends, or is named in the log
        self.gc_policy.release()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow() and not self.lifetime.closed:
            self.navigator.show_external_changes()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.shutdown()
        super().closeEvent(event)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        accept_drag(event)

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt override
        paths = dropped_paths(event)
        if paths:
            self.importer.start(paths)
