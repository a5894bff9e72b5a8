"""The main window: sidebar, transcript, composer, tree panel, status bar, menus, and the
flow of one reply (send -> stream -> save) on top of ``EngineClient`` and ``ChatStore``.

Nothing here waits on the engine: requests go out through ``EngineClient`` and the
answers come back as signals. Streamed text is painted every ``FLUSH_MS`` and written
to ``chats.sqlite3`` every ``SAVE_MS`` (status "streaming"), so a crash loses at most
that much text; a stop or quit saves the partial reply as "stopped".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.window import theme
from app.window.app_settings import AppSettings
from app.window.banner import Banner
from app.window.composer import Composer
from app.window.engine_client import EngineClient
from engine.chat_template import conversation_messages
from app.window.settings_dialog import SettingsDialog, human_bytes
from app.window.sidebar import Sidebar
from app.window.transcript import TranscriptView
from app.window.tree_panel import TreePanel
from engine.errors import ModelLoadError
from engine.model_file import check_gguf, default_model_path
from storage.chats import ChatStore, Message
from storage.errors import NotFoundError, StorageError
from storage.paths import CHATS_DB

log = logging.getLogger(__name__)

FLUSH_MS = 40
SAVE_MS = 500
PROGRESS_MIN_TOKENS = 64  # show the progress bar only for prefills at least this long
EMPTY_TEXT = ("<h2>Branchwise</h2><p>Ask anything. Every reply is a branch you can edit, "
              "regenerate or fork,<br>and resuming a chat restores its KV cache instantly.</p>")


@dataclass
class _Stream:
    """The reply being generated."""

    rid: int
    conversation_id: int
    parent_id: int  # the user message being answered
    model: str
    message_id: int | None = None  # created at the first token
    text: str = ""
    dirty: bool = False
    saved_text: str = ""
    stopping: bool = False
    started: float = field(default_factory=time.monotonic)


def build_messages(system_prompt: str, path: list[Message]) -> list[dict]:
    """The ``generate`` request's messages for ``path``: the system prompt first (when set),
    assistant messages with the token ids saved from their ``done`` event."""
    return [m.to_dict() for m in conversation_messages(system_prompt, path)]


def reply_status_line(stats: dict, saved: bool = False) -> str:
    """"restored N tokens in X ms · prefilled M in Y s · Z tok/s" for a GenerationStats dict.

    ``saved`` True labels the line as the saved figures of the reply shown ("Last reply on this
    branch: …"), so that opening a chat or switching branches does not look like a new run.
    """
    parts = []
    if stats.get("restored_tokens"):
        parts.append(f"restored {stats['restored_tokens']:,} tokens in {stats.get('restore_ms', 0):.0f} ms")
    else:
        parts.append("nothing restored")
    parts.append(f"prefilled {stats.get('prefilled_tokens', 0):,} in {stats.get('prefill_ms', 0) / 1000:.2f} s")
    parts.append(f"{stats.get('decode_tokens_per_s', 0):.0f} tok/s")
    line = " · ".join(parts)
    return f"Last reply on this branch: {line}" if saved else line


def model_display_name(path: str | None, facts: dict | None = None) -> str:
    """The name the status bar shows for a model: the GGUF file name without ``.gguf``
    (for example "SmolLM2-135M-Instruct.Q4_1"); ``facts["name"]`` (GGUF ``general.name``)
    only when there is no path. The Model info dialog shows ``general.name`` as it is."""
    if path:
        name = Path(path).name
        return name[:-5] if name.lower().endswith(".gguf") else name
    return (facts or {}).get("name") or "model"


class MainWindow(QMainWindow):
    """The Branchwise window on ``data_dir``.

    Args:
        data_dir: the data folder (``chats.sqlite3``, ``kvcache.sqlite3``, ``settings.json``, ``logs/``).
        model_path: a GGUF to load instead of the last used / default model.
        use_cache: False generates without the prefix store (for comparisons).

    Signals (mostly for tests and the screenshot script):
        model_ready(facts), model_failed(message), reply_finished(message_id or 0),
        engine_died(message), coverage_ready().
    """

    model_ready = Signal(dict)
    model_failed = Signal(str)
    reply_finished = Signal(int)
    engine_died = Signal(str)
    coverage_ready = Signal()

    def __init__(self, data_dir: Path, model_path: str | None = None, use_cache: bool = True,
                 start_engine: bool = True):
        super().__init__()
        self.data_dir = Path(data_dir)
        self.logs_dir = self.data_dir / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.store = ChatStore(self.data_dir / CHATS_DB)
        interrupted = self.store.mark_interrupted_streams()
        self.settings = AppSettings.load(self.data_dir)
        self.use_cache = use_cache
        self.colors = theme.apply(QApplication.instance(), self.settings.theme)
        self.client = EngineClient(self.data_dir, self.logs_dir / "engine.log", self)
        self.conversation_id: int | None = None
        self.stream: _Stream | None = None
        self.facts: dict | None = None
        self.model_state = "none"  # none | loading | ready | failed | dead
        self.model_path: str | None = None  # the model asked for
        self.good_model_path: str | None = None  # the last model that loaded
        self._after_load = None
        self._coverage_rid: int | None = None
        self._coverage_ids: list[int] = []
        self._count_rid: int | None = None  # the newest ``count`` request (context figure)
        self._count_cid: int | None = None  # the conversation it was asked for
        self._undo_text = ""  # the banner text that offers to undo a delete
        self.context_used = 0  # tokens of the shown path, as last shown in the status bar
        self._closed = False
        self._explicit_model = model_path

        self._build_ui()
        self._build_menus()
        self._connect_engine()
        self.resize(1180, 760)
        self.sidebar.refresh()
        ids = self.sidebar.ids()
        self.show_conversation(ids[0] if ids else None)
        if interrupted:
            self.banner.show_message(
                f"{interrupted} reply{'s were' if interrupted > 1 else ' was'} cut short when Branchwise "
                "last closed; the partial text is kept and marked as stopped.", "info")
        if start_engine:
            QTimer.singleShot(0, self.start_engine)

    # -- building ------------------------------------------------------------------------

    def _build_ui(self) -> None:
        self.sidebar = Sidebar(self.store)
        self.sidebar.selected.connect(self.show_conversation)
        self.sidebar.new_chat.connect(self.new_chat)
        self.sidebar.deleted.connect(self._conversation_deleted)
        self.sidebar.restored.connect(self._conversation_restored)
        self.sidebar.delete_committed.connect(self._delete_committed)
        self.sidebar.changed.connect(self._refresh_title)
        self.banner = Banner()
        self.transcript = TranscriptView()
        self.transcript.sibling_requested.connect(self.switch_sibling)
        self.transcript.edit_saved.connect(self.edit_message)
        self.transcript.regenerate_requested.connect(self.regenerate)
        self.transcript.fork_requested.connect(self.fork)
        self.composer = Composer()
        self.composer.send_requested.connect(self.send_message)
        self.composer.stop_requested.connect(self.stop_reply)
        center = QWidget()
        lay = QVBoxLayout(center)
        lay.setContentsMargins(8, 8, 8, 0)
        lay.setSpacing(4)
        lay.addWidget(self.banner)
        lay.addWidget(self.transcript, 1)
        lay.addWidget(self.composer)
        self.tree = TreePanel()
        self.tree.node_clicked.connect(self.select_node)
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

        sb = self.statusBar()
        self.stats_label = QLabel()
        self.stats_label.setObjectName("reply_stats")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.context_label = QLabel()
        self.model_label = QLabel("No model")
        sb.addWidget(self.stats_label, 1)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.context_label)
        sb.addPermanentWidget(self.model_label)

        self._flush_timer = QTimer(self, interval=FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_tokens)
        self._save_timer = QTimer(self, interval=SAVE_MS)
        self._save_timer.timeout.connect(self._save_partial)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._system_scheme_changed)

    def _action(self, menu, text: str, slot, shortcut=None, checkable: bool = False) -> QAction:
        a = QAction(text, self)
        if shortcut:
            a.setShortcut(QKeySequence(shortcut))
        a.setCheckable(checkable)
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    def _build_menus(self) -> None:
        mb = self.menuBar()
        f = mb.addMenu("&File")
        self.act_new = self._action(f, "New chat", self.new_chat, "Ctrl+N")
        f.addSeparator()
        self._action(f, "Open model…", self.open_model_dialog, "Ctrl+O")
        self.recent_menu = f.addMenu("Recent models")
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self._action(f, "Model info…", self.show_model_info)
        self._action(f, "Restart engine", self.restart_engine)
        f.addSeparator()
        self._action(f, "Settings…", self.open_settings, "Ctrl+,")
        f.addSeparator()
        self._action(f, "Quit", self.close, QKeySequence.StandardKey.Quit)
        c = mb.addMenu("&Chat")
        self._action(c, "Search chats", self.sidebar.focus_search, "Ctrl+F")
        self._action(c, "Regenerate last reply", self.regenerate_last, "Ctrl+R")
        self._action(c, "Edit last message", self.edit_last, "Ctrl+E")
        self._action(c, "Stop reply", self.stop_reply)
        self._action(c, "Fork to new chat", self._fork_last)
        v = mb.addMenu("&View")
        self.act_tree = self._action(v, "Conversation tree", self.toggle_tree, "Ctrl+T", checkable=True)
        self.act_tree.setChecked(self.settings.show_tree)
        tm = v.addMenu("Theme")
        group = QActionGroup(self)
        for name in theme.THEMES:
            a = self._action(tm, name.capitalize(), lambda _c=False, n=name: self.set_theme(n), checkable=True)
            a.setChecked(name == self.settings.theme)
            group.addAction(a)

    def _connect_engine(self) -> None:
        c = self.client
        c.load_progress.connect(self._load_progress)
        c.loaded.connect(self._loaded)
        c.load_failed.connect(self._load_failed)
        c.progress.connect(self._gen_progress)
        c.token.connect(self._token)
        c.done.connect(self._done)
        c.error.connect(self._engine_error)
        c.event.connect(self._engine_event)
        c.died.connect(self._died)

    # -- engine and model ----------------------------------------------------------------

    def start_engine(self) -> None:
        """Start the engine process and load the model chosen at start-up."""
        if self._closed:
            return
        self.client.start()
        path = self._explicit_model or self.settings.last_model
        if path and not Path(path).exists():
            self.banner.show_message(f"The last model, {path}, is no longer there; loading the default model.",
                                     "info")
            path = None
        self.load_model(path)

    def restart_engine(self) -> None:
        """Start a fresh engine process and reload the last model that loaded (or the default)."""
        if self.stream is not None:
            self._abandon_stream("stopped")
        self.banner.hide()
        self.client.start()
        self.load_model(self.good_model_path or self.model_path)

    def load_model(self, path: str | None) -> None:
        """Load ``path`` (None: the embedded default model) in the background."""
        try:
            p = str(check_gguf(path if path else default_model_path()))
        except ModelLoadError as exc:
            self._load_failed(str(exc))
            return
        if not self.client.is_running():
            self.client.start()
        self.model_path = p
        self.model_state = "loading"
        self.model_label.setText(f"Loading {Path(p).name}…")
        self.progress.setRange(0, 0)
        self.progress.setFormat("Loading model…")
        self.progress.show()
        self.client.load(p, self.settings.engine_settings().to_dict(), self.settings.budget_bytes)

    def _load_progress(self, done: int, total: int) -> None:
        if total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
            self.progress.setFormat("Loading model… %p%")

    def _loaded(self, facts: dict) -> None:
        self.facts = facts
        self.model_state = "ready"
        self.good_model_path = facts.get("path") or self.model_path
        self.settings.remember_model(self.good_model_path)
        self._save_settings()
        self.progress.hide()
        params = facts.get("parameters") or 0
        size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
        self.model_label.setText(f"{model_display_name(self.good_model_path, facts)} · {size}")
        self.model_label.setToolTip(self._facts_text(facts))
        if facts.get("cache_policy", "full") != "full":
            self.banner.show_message(f"The prefix store is off for this model: {facts['cache_policy']}", "info")
        if self.conversation_id is None:
            self._update_context_label()
        self.request_context_count()
        if self.banner.isVisible() and self.banner.kind == "error":
            self.banner.hide()
        self.model_ready.emit(facts)
        after, self._after_load = self._after_load, None
        if after is not None:
            after()
        self.refresh_coverage()

    def _load_failed(self, message: str) -> None:
        self.model_state = "failed"
        self.facts = None
        self.progress.hide()
        self.model_label.setText("No model")
        self._after_load = None
        actions = [("Open model…", self.open_model_dialog)]
        if self.good_model_path and self.good_model_path != self.model_path:
            actions.append(("Load previous model", lambda: self.load_model(self.good_model_path)))
        else:
            actions.append(("Load default model", lambda: self.load_model(None)))
        self.banner.show_message(f"The model could not be loaded. {message}", "error", actions)
        self.model_failed.emit(message)

    def _died(self, message: str) -> None:
        log.warning("engine died: %s", message)
        if self.stream is not None:
            self._abandon_stream("stopped")
        self.model_state = "dead"
        self.facts = None
        self.progress.hide()
        self.model_label.setText("Engine stopped")
        self.banner.show_message(message, "error", [("Restart engine", self.restart_engine)])
        self.engine_died.emit(message)

    def open_model_dialog(self) -> None:
        start = str(Path(self.good_model_path).parent) if self.good_model_path else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open model", start, "GGUF models (*.gguf);;All files (*)")
        if path:
            self.load_model(path)

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for p in self.settings.recent_models:
            a = self.recent_menu.addAction(Path(p).name, lambda _c=False, q=p: self.load_model(q))
            a.setToolTip(p)
        if not self.settings.recent_models:
            self.recent_menu.addAction("(none yet)").setEnabled(False)
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Default model (SmolLM2-135M)", lambda: self.load_model(None))

    @staticmethod
    def _facts_text(f: dict) -> str:
        return "\n".join([
            f"Name: {f.get('name', '')}",
            f"File: {f.get('path', '')}",
            f"Architecture: {f.get('architecture', '')}",
            f"Parameters: {int(f.get('parameters') or 0):,}",
            f"Quantization: {f.get('quantization', '')}",
            f"File size: {human_bytes(int(f.get('size_bytes') or 0))}",
            f"Trained context: {int(f.get('context_length') or 0):,} tokens",
            f"Context in use: {int(f.get('n_ctx') or 0):,} tokens",
            f"KV cache per token: {human_bytes(int(f.get('kv_bytes_per_token') or 0))}",
            f"Prefix store: {'on' if f.get('cache_policy') == 'full' else f.get('cache_policy')}",
        ])

    def show_model_info(self) -> None:
        box = QMessageBox(self)
        box.setWindowTitle("Model info")
        box.setText(self._facts_text(self.facts) if self.facts else "No model is loaded.")
        box.open()

    # -- conversations -------------------------------------------------------------------

    def new_chat(self) -> None:
        """Show an empty chat; it is created when the first message is sent."""
        self.show_conversation(None)
        self.composer.input.setFocus()

    def show_conversation(self, conversation_id: int | None) -> None:
        """Show the active path of ``conversation_id`` (None: the empty new-chat page)."""
        self.conversation_id = conversation_id
        self.sidebar.set_current(conversation_id)
        self.render()
        self.refresh_coverage()

    def render(self) -> None:
        """Re-read the shown conversation and redraw the transcript, tree and status."""
        cid = self.conversation_id
        busy = self.stream is not None
        if cid is None:
            self.transcript.set_messages([], {}, self.colors, busy, EMPTY_TEXT)
            self.tree.set_tree([], set(), self.colors)
            self._refresh_title()
            self._update_context_label()
            self.stats_label.setText("")
            return
        streaming_here = self.stream is not None and self.stream.conversation_id == cid
        if streaming_here and self.stream.message_id is None:
            path = self.store.path_to(self.stream.parent_id)
        else:
            path = self.store.active_path(cid)
        if streaming_here and self.stream.message_id is not None:
            path = [m for m in path if m.id != self.stream.message_id]
        positions = {}
        for m in path:
            sibs = self.store.siblings(m.id)
            positions[m.id] = (next(i for i, s in enumerate(sibs) if s.id == m.id) + 1, len(sibs))
        self.transcript.set_messages(path, positions, self.colors, busy, EMPTY_TEXT)
        if streaming_here:
            w = self.transcript.start_pending()
            if self.stream.text:
                w.set_text(self.stream.text)
        self._draw_tree(path)
        self._refresh_title()
        if busy:
            return  # the stream owns the status line until it ends
        last = next((m for m in reversed(path) if m.role == "assistant"), None)
        self.stats_label.setText(reply_status_line(last.stats, saved=True) if last and last.stats else "")
        if self.model_state == "ready":
            self.request_context_count()  # the exact figure, asynchronously
        else:  # no engine to ask: the saved figures of the leaf reply, if it has them
            leaf_stats = path[-1].stats if path and path[-1].role == "assistant" else None
            self._update_context_label(leaf_stats)

    def _draw_tree(self, path: list[Message] | None = None) -> None:
        if self.conversation_id is None:
            return
        if path is None:
            path = self.store.active_path(self.conversation_id)
        self.tree.set_tree(self.store.tree(self.conversation_id), {m.id for m in path}, self.colors)

    def _refresh_title(self) -> None:
        title = "Branchwise"
        if self.conversation_id is not None:
            try:
                title = f"{self.store.get_conversation(self.conversation_id).title} — Branchwise"
            except NotFoundError:
                pass
        self.setWindowTitle(title)

    def _update_context_label(self, stats: dict | None = None) -> None:
        """Show "context N / n_ctx" from a reply's stats (prompt + generated tokens; 0 without)."""
        n_ctx = (self.facts or {}).get("n_ctx") or self.settings.n_ctx
        used = (stats.get("prompt_tokens", 0) + stats.get("generated_tokens", 0)) if stats else 0
        self.set_context_figure(used, n_ctx)

    def set_context_figure(self, used: int, n_ctx: int) -> None:
        """Show ``used`` of ``n_ctx`` tokens in the status bar (both in tokens)."""
        self.context_label.setText(f"context {used:,} / {n_ctx:,}")
        self.context_used = used

    def request_context_count(self) -> None:
        """Ask the engine (``count`` request) how many tokens the shown path takes, so the
        context figure is right as soon as a chat is opened or a branch is switched. The
        answer arrives as a ``count`` event (``_engine_event``); older answers are ignored.
        Does nothing while a reply streams or no model is ready."""
        cid = self.conversation_id
        if cid is None or self.stream is not None or self.model_state != "ready":
            self._count_rid = None
            if cid is None:
                self.set_context_figure(0, (self.facts or {}).get("n_ctx") or self.settings.n_ctx)
            return
        try:
            conv = self.store.get_conversation(cid)
            path = self.store.active_path(cid)
        except (NotFoundError, StorageError):
            return
        if not path:
            self._count_rid = None
            self.set_context_figure(0, (self.facts or {}).get("n_ctx") or self.settings.n_ctx)
            return
        self._count_cid = cid
        self._count_rid = self.client.request("count", messages=build_messages(conv.system_prompt, path))

    def _conversation_deleted(self, cid: int) -> None:
        """The sidebar hid ``cid`` (its delete is pending): move away from it, offer Undo."""
        try:
            title = self.store.get_conversation(cid).title
        except StorageError:
            title = "the chat"
        if cid == self.conversation_id:
            ids = self.sidebar.ids()
            self.show_conversation(ids[0] if ids else None)
        self._undo_text = f"Deleted “{title}”."
        self.banner.show_message(self._undo_text, "info", [("Undo", self.sidebar.undo_delete)])

    def _conversation_restored(self, cid: int) -> None:
        self.show_conversation(cid)

    def _delete_committed(self, _cid: int) -> None:
        if self.banner.isVisible() and self.banner.text == self._undo_text:
            self.banner.hide()

    # -- sending and streaming -----------------------------------------------------------

    def _can_generate(self) -> bool:
        if self.stream is not None:
            return False
        if self.model_state == "ready":
            return True
        if self.model_state == "loading":
            self.banner.show_message("The model is still loading; send again in a moment.", "info")
        elif self.model_state == "dead":
            self.banner.show_message("The engine is not running.", "error",
                                     [("Restart engine", self.restart_engine)])
        else:
            self.banner.show_message("No model is loaded. Open a GGUF model file to chat.", "error",
                                     [("Open model…", self.open_model_dialog),
                                      ("Load default model", lambda: self.load_model(None))])
        return False

    def send_message(self, text: str) -> None:
        """Add ``text`` as a user message under the active leaf and generate the reply."""
        if not self._can_generate():
            self.composer.set_text(text)
            return
        if self.conversation_id is None:
            conv = self.store.create_conversation()
            self.conversation_id = conv.id
        leaf = self.store.get_conversation(self.conversation_id).active_leaf_id
        user = self.store.add_message(self.conversation_id, leaf, "user", text)
        self.sidebar.set_current(self.conversation_id)
        self.start_reply(user.id)

    def start_reply(self, user_message_id: int) -> None:
        """Generate a new assistant reply (a new child) under the user message ``user_message_id``."""
        if self.stream is not None:
            return
        user = self.store.get_message(user_message_id)
        conv = self.store.get_conversation(user.conversation_id)
        messages = build_messages(conv.system_prompt, self.store.path_to(user.id))
        rid = self.client.generate(messages, dict(conv.sampling), use_cache=self.use_cache)
        if rid is None:
            return
        model = model_display_name(self.model_path, self.facts)
        self.stream = _Stream(rid, conv.id, user.id, model)
        if self.conversation_id != conv.id:
            self.conversation_id = conv.id
            self.sidebar.set_current(conv.id)
        self.sidebar.busy_id = conv.id
        self.composer.set_streaming(True)
        self.stats_label.setText("Thinking…")
        self.render()
        self._flush_timer.start()
        self._save_timer.start()

    def stop_reply(self) -> None:
        """Cancel the reply; the engine answers with ``done`` (finish_reason "cancelled")."""
        if self.stream is not None and not self.stream.stopping:
            self.stream.stopping = True
            self.stats_label.setText("Stopping…")
            self.client.cancel(self.stream.rid)

    def _gen_progress(self, rid: int, phase: str, done: int, total: int) -> None:
        if self.stream is None or rid != self.stream.rid:
            return
        if total >= PROGRESS_MIN_TOKENS and done < total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            self.progress.setFormat(f"{'Restoring' if phase == 'restore' else 'Prefilling'} %v/%m tokens")
            self.progress.show()
        elif done >= total:
            self.progress.hide()

    def _token(self, rid: int, text: str) -> None:
        s = self.stream
        if s is None or rid != s.rid:
            return
        s.text += text
        s.dirty = True
        if s.message_id is None:
            try:
                m = self.store.add_message(s.conversation_id, s.parent_id, "assistant", s.text,
                                           status="streaming", model=s.model)
            except StorageError as exc:
                self._storage_failed(exc)
                return
            s.message_id = m.id
            s.saved_text = s.text

    def _flush_tokens(self) -> None:
        s = self.stream
        if s is None or not s.dirty:
            return
        s.dirty = False
        w = self.transcript.pending
        if w is not None and s.conversation_id == self.conversation_id:
            if s.text:
                w.note.setText("· writing…")
            w.set_text(s.text)

    def _save_partial(self) -> None:
        s = self.stream
        if s is None or s.message_id is None or s.text == s.saved_text:
            return
        try:
            self.store.update_message(s.message_id, content=s.text)
            s.saved_text = s.text
        except StorageError as exc:
            self._storage_failed(exc)

    def _end_stream(self) -> _Stream | None:
        s, self.stream = self.stream, None
        self._flush_timer.stop()
        self._save_timer.stop()
        self.progress.hide()
        self.composer.set_streaming(False)
        self.sidebar.busy_id = None
        return s

    def _done(self, event: dict) -> None:
        s = self.stream
        if s is None or event.get("id") != s.rid:
            return
        self._end_stream()
        stats = event.get("stats") or {}
        text = event.get("text", s.text)
        ids = event.get("token_ids")
        status = "stopped" if stats.get("finish_reason") == "cancelled" else "complete"
        mid = s.message_id
        try:
            if mid is None and (text or status == "complete"):
                mid = self.store.add_message(s.conversation_id, s.parent_id, "assistant", text, token_ids=ids,
                                             stats=stats, status=status, model=s.model).id
            elif mid is not None:
                self.store.update_message(mid, content=text, token_ids=ids, stats=stats, status=status)
        except StorageError as exc:
            self._storage_failed(exc)
        if s.conversation_id == self.conversation_id:
            self.render()
        self.stats_label.setText(reply_status_line(stats))
        self._update_context_label(stats)
        self.sidebar.refresh()
        self.reply_finished.emit(mid or 0)

    def _abandon_stream(self, status: str) -> None:
        """Save what was streamed so far (marked ``status``) and forget the request."""
        s = self._end_stream()
        if s is None:
            return
        try:
            if s.message_id is not None:
                self.store.update_message(s.message_id, content=s.text, status=status)
            elif s.text:
                s.message_id = self.store.add_message(s.conversation_id, s.parent_id, "assistant", s.text,
                                                      status=status, model=s.model).id
        except StorageError as exc:
            log.error("could not save the partial reply: %s", exc)
        if not self._closed and s.conversation_id == self.conversation_id:
            self.render()
        if not self._closed:
            self.reply_finished.emit(s.message_id or 0)

    def _engine_error(self, event: dict) -> None:
        s = self.stream
        if s is not None and event.get("id") == s.rid:
            parent = s.parent_id
            self._abandon_stream("error")
            if event.get("kind") == "overflow":
                self._overflow(parent, int(event.get("prompt_tokens") or 0), int(event.get("n_ctx") or 0),
                               event.get("message", ""))
                return
        elif event.get("id") == self._coverage_rid:
            self._coverage_rid = None
            return
        elif self._count_rid is not None and event.get("id") == self._count_rid:
            self._count_rid = None  # the figure stays an estimate; nothing for a person to act on
            log.info("count failed: %s", event.get("message"))
            return
        self.banner.show_message(event.get("message") or "The engine could not do that.", "error")

    def _engine_event(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "coverage" and event.get("id") == self._coverage_rid:
            self._coverage_rid = None
            results = event.get("results") or []
            self.tree.set_coverage({mid: (int(r[0]), int(r[1])) for mid, r in zip(self._coverage_ids, results)})
            self.coverage_ready.emit()
        elif kind == "snapshot":
            self.refresh_coverage()
        elif kind == "count" and event.get("id") == self._count_rid:
            self._count_rid = None
            if self._count_cid == self.conversation_id and self.stream is None:
                self.set_context_figure(int(event.get("prompt_tokens") or 0),
                                        int(event.get("n_ctx") or (self.facts or {}).get("n_ctx") or 0))

    def _storage_failed(self, exc: Exception) -> None:
        log.error("storage error: %s", exc)
        self.banner.show_message(f"Branchwise could not save to its database: {exc}", "error")

    # -- context overflow ----------------------------------------------------------------

    def _overflow(self, user_message_id: int, prompt_tokens: int, n_ctx: int, message: str) -> None:
        trained = int((self.facts or {}).get("context_length") or 0)
        conv = self.store.get_conversation(self.store.get_message(user_message_id).conversation_id)
        need = prompt_tokens + int(conv.sampling.get("max_tokens") or 1024)
        new_ctx = max(need, n_ctx * 2)
        new_ctx = (new_ctx + 1023) // 1024 * 1024
        if trained:
            new_ctx = min(new_ctx, max(trained, n_ctx))
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("This chat is too long")
        box.setText(message or f"The prompt is {prompt_tokens:,} tokens; the context holds {n_ctx:,}.")
        box.setInformativeText("Continue on a new branch that keeps the system prompt and the latest turns, "
                               "or raise the context size (uses more memory; reloads the model).")
        branch = box.addButton("Continue on a new branch", QMessageBox.ButtonRole.AcceptRole)
        raise_b = box.addButton(f"Raise context to {new_ctx:,}", QMessageBox.ButtonRole.ActionRole)
        raise_b.setEnabled(new_ctx > n_ctx)
        box.addButton(QMessageBox.StandardButton.Cancel)

        def chosen(button) -> None:
            if button is branch:
                self.branch_dropping_oldest(user_message_id, n_ctx)
            elif button is raise_b:
                self.settings.n_ctx = new_ctx
                self._save_settings()
                self._after_load = lambda: self.start_reply(user_message_id)
                self.load_model(self.good_model_path or self.model_path)

        box.buttonClicked.connect(chosen)
        self.overflow_box = box
        box.open()

    def branch_dropping_oldest(self, user_message_id: int, n_ctx: int) -> None:
        """Copy the newest turns of the path to ``user_message_id`` into a new root branch that
        fits about half of ``n_ctx`` (token counts estimated), then generate its reply."""
        path = [m for m in self.store.path_to(user_message_id) if m.role != "system"]
        budget = max(64, n_ctx // 2)
        kept: list[Message] = []
        used = 0
        for m in reversed(path):
            cost = (len(m.token_ids) if m.token_ids is not None else len(m.content) // 3) + 8
            if kept and used + cost > budget:
                break
            kept.insert(0, m)
            used += cost
        while len(kept) > 1 and kept[0].role != "user":
            kept.pop(0)
        if len(kept) == len(path):
            self.banner.show_message("The newest message alone does not fit the context window; raise the "
                                     "context size in Settings or shorten the message.", "error",
                                     [("Settings…", self.open_settings)])
            return
        parent = None
        for m in kept:
            parent = self.store.add_message(m.conversation_id, parent, m.role, m.content,
                                            token_ids=m.token_ids, stats=m.stats,
                                            status=m.status if m.status != "streaming" else "stopped",
                                            model=m.model).id
        self.render()
        if parent is not None:
            self.start_reply(parent)

    # -- branches ------------------------------------------------------------------------

    def switch_sibling(self, message_id: int, delta: int) -> None:
        """Show the sibling ``delta`` steps from ``message_id`` (and that branch's newest leaf)."""
        if self.stream is not None:
            return
        sibs = self.store.siblings(message_id)
        i = next(i for i, s in enumerate(sibs) if s.id == message_id) + delta
        if 0 <= i < len(sibs):
            leaf = self.store.deepest_leaf(sibs[i].id)
            self.store.set_active_leaf(leaf.conversation_id, leaf.id)
            self.render()

    def select_node(self, message_id: int) -> None:
        """Make the branch through ``message_id`` (down to its newest leaf) the active one."""
        if self.stream is not None:
            return
        leaf = self.store.deepest_leaf(message_id)
        self.store.set_active_leaf(leaf.conversation_id, leaf.id)
        self.render()

    def edit_message(self, message_id: int, text: str) -> None:
        """Save ``text`` as a new sibling of the user message ``message_id`` and answer it."""
        if not self._can_generate():
            return
        m = self.store.get_message(message_id)
        new = self.store.add_message(m.conversation_id, m.parent_id, "user", text)
        self.start_reply(new.id)

    def regenerate(self, message_id: int) -> None:
        """Generate a new sibling of the assistant message ``message_id``."""
        if not self._can_generate():
            return
        m = self.store.get_message(message_id)
        if m.role == "assistant" and m.parent_id is not None:
            self.start_reply(m.parent_id)
        elif m.role == "user":
            self.start_reply(m.id)

    def regenerate_last(self) -> None:
        if self.conversation_id is None:
            return
        path = self.store.active_path(self.conversation_id)
        if path:
            self.regenerate(path[-1].id)

    def edit_last(self) -> None:
        if self.stream is not None:
            return
        w = next((w for w in reversed(self.transcript.widgets) if w.role == "user" and w.message), None)
        if w is not None:
            w.begin_edit()

    def fork(self, message_id: int) -> None:
        """Copy the path to ``message_id`` into a new conversation and show it."""
        if self.stream is not None:
            return
        conv = self.store.fork(message_id)
        self.show_conversation(conv.id)
        self.banner.show_message(f"Forked into a new chat, “{conv.title}”. Its KV cache is shared.", "info")

    def _fork_last(self) -> None:
        if self.conversation_id is not None:
            path = self.store.active_path(self.conversation_id)
            if path:
                self.fork(path[-1].id)

    # -- tree panel ----------------------------------------------------------------------

    def toggle_tree(self) -> None:
        self.tree.setVisible(not self.tree.isVisible())
        self.act_tree.setChecked(self.tree.isVisible())
        self.settings.show_tree = self.tree.isVisible()
        self._save_settings()
        self.refresh_coverage()

    def refresh_coverage(self) -> None:
        """Ask the engine how much of each node's prompt the prefix store holds (tree panel)."""
        if (not self.tree.isVisible() or self.conversation_id is None or self.model_state != "ready"
                or self._coverage_rid is not None):
            return
        conv = self.store.get_conversation(self.conversation_id)
        nodes = self.store.tree(conv.id)[:300]
        by_id = {m.id: m for m in nodes}
        paths = []
        for m in nodes:
            chain, cur = [], m
            while cur is not None:
                chain.append(cur)
                cur = by_id.get(cur.parent_id) if cur.parent_id is not None else None
            paths.append(build_messages(conv.system_prompt, list(reversed(chain))))
        self._coverage_ids = [m.id for m in nodes]
        if paths:
            self._coverage_rid = self.client.request("coverage", paths=paths)

    # -- settings and theme --------------------------------------------------------------

    def open_settings(self) -> None:
        conv = self.store.get_conversation(self.conversation_id) if self.conversation_id else None
        dlg = SettingsDialog(conv, self.settings, self.data_dir, self.client, self)
        self.settings_dialog = dlg
        dlg.finished.connect(lambda result: self._settings_done(dlg, conv, result))
        dlg.open()

    def _settings_done(self, dlg: SettingsDialog, conv, result: int) -> None:
        self.settings_dialog = None
        if result != SettingsDialog.DialogCode.Accepted:
            return
        if conv is not None:
            prompt, sampling = dlg.conversation_values()
            self.store.set_system_prompt(conv.id, prompt)
            self.store.set_sampling(conv.id, sampling)
        values = dlg.app_values()
        reload_needed = any(getattr(self.settings, k) != values[k] for k in ("n_ctx", "n_threads", "type_k", "type_v"))
        budget_changed = values["budget_bytes"] != self.settings.budget_bytes
        for k, v in values.items():
            setattr(self.settings, k, v)
        self._save_settings()
        if budget_changed and self.client.is_running():
            self.client.request("set_budget", bytes=values["budget_bytes"])
        if reload_needed and self.stream is None:
            self.load_model(self.good_model_path or self.model_path)

    def set_theme(self, name: str) -> None:
        self.settings.theme = name
        self._save_settings()
        self._apply_theme()

    def _apply_theme(self) -> None:
        self.colors = theme.apply(QApplication.instance(), self.settings.theme)
        self.banner.restyle(self.colors)
        self.render()
        self.refresh_coverage()

    def _system_scheme_changed(self, *_args) -> None:
        if self.settings.theme == "system":
            self._apply_theme()

    def _save_settings(self) -> None:
        try:
            self.settings.save(self.data_dir)
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

    # -- closing -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Save a reply in progress as "stopped", stop the engine and close the database.
        Safe to call twice."""
        if self._closed:
            return
        rid = self.stream.rid if self.stream is not None else None
        self._closed = True
        if self.stream is not None:
            self._abandon_stream("stopped")
        self.client.stop(cancel_id=rid)
        self._save_settings()
        self.sidebar.commit_delete()
        self.store.close()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.shutdown()
        super().closeEvent(event)
