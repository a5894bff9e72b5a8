"""Settings: this conversation's system prompt and sampling, and the app-wide engine
settings (context size, threads, KV precision, prefix-store budget, data folder)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QAbstractSpinBox,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.window.settings.app_settings import ENGINE_FIELDS, AppSettings
from app.window.settings.chat_settings_form import ChatSettingsForm, spin
from app.window.settings.kv_switch import kv_switch_note
from app.window.settings.mcp_settings import McpSettingsTab
from app.window.settings.speculative_row import SpeculativeRow
from app.window.workers.engine_client import EngineClient
from engine.events import CacheAction, CacheEvent
from engine.limits import CTX_TRAIN_FACTOR, MAX_CTX, LimitError, check_ctx_size, max_threads
from engine.machine import default_threads, physical_cores
from storage.chats import Conversation

MB = 1024 * 1024
MIN_BUDGET_MB = 64
"""The smallest prefix-store budget Settings accepts, in MB."""


def human_bytes(n: int) -> str:
    """``n`` bytes as "12.3 MB" (powers of 1024)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


class SettingsDialog(QDialog):
    """Read ``conversation_values()`` and ``app_values()`` after ``exec()`` returns Accepted.

    ``conversation`` None: the first tab is the new chat's, shown with ``new_chat`` (system
    prompt, sampling) or, without it, the defaults for new chats. OK stays on the dialog,
    with the reason in red, while the App values cannot be used (``problem``); the red
    line goes as soon as the values can be used again.

    ``presets_saved(presets)`` is called with every preset after Save preset or Delete
    preset (the window writes them at once: Cancel keeps them). ``chat_tokens`` (the shown
    chat's prompt tokens, None: unknown) and ``prefill_rate`` (measured tokens/s, None)
    say, when the KV precision is changed, what the next turn recomputes (``kv_note``).
    """

    def __init__(self, conversation: Conversation | None, settings: AppSettings, data_dir: Path,
                 client: EngineClient | None, parent: QWidget | None = None,
                 new_chat: tuple[str, dict] | None = None, trained_context: int = 0, facts: dict | None = None,
                 presets_saved: Callable[[dict[str, str]], None] | None = None,
                 chat_tokens: int | None = None, prefill_rate: float | None = None):
        super().__init__(parent)
        self._kv_figures = (chat_tokens, prefill_rate)
        self._settings = settings
        self._trained_context = int(trained_context)  # the loaded model's n_ctx_train (0: unknown)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        self.client = client
        self._requests: list = []  # PendingRequest handles of cache requests
        self._closed = False
        tabs = QTabWidget()
        self.tabs = tabs

        # -- this conversation (or the new chat, before its first message) and new chats' defaults
        self.presets: dict[str, str] = dict(settings.prompt_presets)
        if conversation is not None:
            prompt, sampling = conversation.system_prompt, conversation.sampling
        else:
            prompt, sampling = new_chat or (settings.default_system_prompt, settings.default_sampling)
        self.chat_form = ChatSettingsForm(prompt, sampling, self.presets,
                                          "Optional instructions sent before every turn of this chat", facts=facts)
        self.defaults_form = ChatSettingsForm(settings.default_system_prompt, settings.default_sampling,
                                              self.presets, "Instructions every new chat starts with", facts=facts)
        defaults_note = QLabel("Every new chat starts with these; change one chat in “This chat”.")
        defaults_note.setWordWrap(True)
        self.defaults_form.form.insertRow(0, defaults_note)
        for a, b in ((self.chat_form, self.defaults_form), (self.defaults_form, self.chat_form)):
            a.presets_changed.connect(a.fill_presets)
            a.presets_changed.connect(b.fill_presets)
            if presets_saved is not None:
                a.presets_changed.connect(lambda: presets_saved(dict(self.presets)))
        for name in ("system_prompt", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed",
                     "max_tokens"):
            setattr(self, name, getattr(self.chat_form, name))
        if conversation is None:
            new_note = QLabel("A new chat: these apply from its first message.")
            new_note.setWordWrap(True)
            self.chat_form.form.insertRow(0, new_note)
        self._chat_shown = self.chat_form.values()
        tabs.addTab(self.chat_form, "This chat" if conversation is not None else "New chat")
        tabs.addTab(self.defaults_form, "New chats")

        # -- the app
        # any number can be typed: one out of range is refused with the range (``problem``),
        # never silently put back to the last value
        self.n_ctx = spin(1, MAX_CTX, settings.n_ctx)
        self.n_ctx.setSingleStep(1024)
        self.ctx_note = QLabel()  # past the trained context: allowed (as on the command line), with a word
        self.ctx_note.setObjectName("ctx_note")
        self.ctx_note.setWordWrap(True)
        self.ctx_note.setTextFormat(Qt.TextFormat.PlainText)
        self.n_ctx.valueChanged.connect(self._ctx_changed)
        self._ctx_changed()
        self.threads = spin(0, max_threads(), settings.n_threads)  # what the engine accepts (cores x 4)
        auto = default_threads()
        self.threads.setSpecialValueText(f"automatic ({auto} of {physical_cores()} cores)")
        self.threads.setToolTip("Automatic: one thread per physical core, less one, so llama.cpp's threads "
                                "do not wait on each other when the machine is busy.")
        self.kv = QComboBox()
        self.kv.addItem("f16 (exact)", ("f16", "f16"))
        self.kv.addItem("q8_0 (half the memory)", ("q8_0", "q8_0"))
        self.kv.setCurrentIndex(1 if settings.type_k == "q8_0" else 0)
        self.kv_note = QLabel()
        self.kv_note.setObjectName("kv_note")
        self.kv_note.setWordWrap(True)
        self.kv_note.setTextFormat(Qt.TextFormat.PlainText)
        self.kv_note.hide()
        self.kv.currentIndexChanged.connect(self._kv_changed)
        self.budget = spin(1, 1024 * 1024, settings.budget_bytes // MB)
        self.budget.setSuffix(" MB")
        self.budget.setSingleStep(256)
        self.cache_use = QLabel("…")
        self.cache_use.setObjectName("cache_use")
        self.cache_use.setWordWrap(True)  # "22.7 MB of 4.0 GB · 1,031 tokens in 18 blocks" wraps beside the button
        self.cache_use.setTextFormat(Qt.TextFormat.PlainText)
        self.clear_cache = QPushButton("Clear cache")
        self.clear_cache.clicked.connect(self._clear_cache)
        row = QHBoxLayout()
        row.addWidget(self.cache_use, 1)
        row.addWidget(self.clear_cache)
        folder = QLabel(f'<a href="{QUrl.fromLocalFile(str(data_dir)).toString()}">{data_dir}</a>')
        folder.setOpenExternalLinks(False)
        folder.linkActivated.connect(lambda url: QDesktopServices.openUrl(QUrl(url)))
        folder.setWordWrap(True)
        self.engine_kind = QComboBox()
        self.engine_kind.addItem("Local model file", "local")
        self.engine_kind.addItem("OpenAI-compatible server", "remote")
        self.engine_url = QLineEdit(settings.engine_url)
        self.engine_url.setPlaceholderText("http://gpu-box:8000/v1")
        self.engine_key = QLineEdit(settings.engine_key)
        self.engine_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.engine_key.setPlaceholderText("none")
        self.engine_model = QLineEdit(settings.engine_model)
        self.engine_model.setPlaceholderText("the first model the server lists")
        app_tab = QWidget()
        form2 = QFormLayout(app_tab)
        self.app_form = form2
        form2.addRow("Engine", self.engine_kind)
        form2.addRow("Server URL", self.engine_url)
        form2.addRow("Server API key", self.engine_key)
        form2.addRow("Server model", self.engine_model)
        self.remote_note = QLabel("With a server, replies are generated there; chats, edits, branches and search "
                                  "stay on this computer. Branchwise connects only to the URL typed here.")
        self.remote_note.setWordWrap(True)
        form2.addRow(self.remote_note)
        self.engine_kind.currentIndexChanged.connect(self._engine_kind_changed)
        self.engine_kind.setCurrentIndex(1 if settings.engine_url else 0)
        self._engine_kind_changed()
        form2.addRow("Context size (tokens)", self.n_ctx)
        form2.addRow(self.ctx_note)
        form2.addRow("CPU threads", self.threads)
        form2.addRow("KV cache precision", self.kv)
        form2.addRow(self.kv_note)
        form2.addRow("Prefix-store budget", self.budget)
        form2.addRow("Prefix store in use", row)
        form2.addRow("Data folder", folder)
        self.prewarm = QCheckBox("Prepare the next turn while you read and type")
        self.prewarm.setChecked(bool(settings.prewarm))
        self.prewarm.setToolTip("Restores an opened chat and prefills your message as you type, so a reply "
                                "starts at once. Uses the CPU between turns; never while the window is "
                                "hidden or minimized. Replies are the same either way.")
        form2.addRow("Zero-wait turns", self.prewarm)
        self.speculative = SpeculativeRow(settings.speculative)
        form2.addRow("Speculative decoding", self.speculative)
        note = QLabel("Changing the context size, threads, precision or speculative decoding reloads the model.")
        note.setWordWrap(True)
        form2.addRow(note)
        tabs.addTab(app_tab, "App")

        # -- the API server (Server → Start API server)
        self.api_host = QLineEdit(settings.api_host)
        self.api_host.setPlaceholderText("127.0.0.1")
        self.api_port = spin(1, 65535, settings.api_port if 0 < int(settings.api_port) < 65536 else 8080)
        self.api_key = QLineEdit(settings.api_key)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none (allowed on 127.0.0.1 only)")
        api_tab = QWidget()
        form3 = QFormLayout(api_tab)
        form3.addRow("Address", self.api_host)
        form3.addRow("Port", self.api_port)
        form3.addRow("API key", self.api_key)
        api_note = QLabel("Other apps connect to http://ADDRESS:PORT/v1 with any OpenAI client. Any address "
                          "but 127.0.0.1 lets other machines connect and needs a key (sent as "
                          "'Authorization: Bearer KEY'). Changes apply the next time the server starts.")
        api_note.setWordWrap(True)
        form3.addRow(api_note)
        tabs.addTab(api_tab, "API server")
        self.tools_tab = McpSettingsTab(settings.mcp_servers, settings.mcp_tools_on, settings.mcp_first_call_required,
                                        always_allow=settings.mcp_always_allow)
        tabs.addTab(self.tools_tab, "Tools")  # MCP servers for the tool loop

        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setTextFormat(Qt.TextFormat.PlainText)
        self.error.setStyleSheet("color: #c0392b;")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(tabs)
        lay.addWidget(self.error)
        lay.addWidget(buttons)
        for box in self.findChildren(QAbstractSpinBox):
            box.editingFinished.connect(self._check_now)  # leaving a field says what is wrong
            box.textChanged.connect(self._recheck)
        for edit in self.findChildren(QLineEdit):
            if not isinstance(edit.parentWidget(), QAbstractSpinBox):
                edit.textChanged.connect(self._recheck)
        for combo in self.findChildren(QComboBox):
            combo.currentIndexChanged.connect(self._recheck)
        if client is not None:
            self._request(CacheAction.STATS)

    def _check_now(self) -> None:
        """Show what is wrong with the values now (nothing when they can be used)."""
        problem = self.problem()
        self.error.setText(problem)
        self.error.setVisible(bool(problem))

    def _recheck(self, *_args) -> None:
        """While the red line shows: update it, or hide it once the values can be used."""
        if self.error.isVisible() or self.error.text():
            self._check_now()

    def _ctx_changed(self, *_args) -> None:
        trained = self._trained_context
        text = (f"This model was trained for {trained:,} tokens of context; past that llama.cpp stretches "
                "its positions (RoPE scaling) and its replies may degrade."
                if trained and trained < self.n_ctx.value() <= trained * CTX_TRAIN_FACTOR else "")
        self.ctx_note.setText(text)
        self.ctx_note.setVisible(bool(text))

    def _kv_changed(self, *_args) -> None:
        text = kv_switch_note(self._settings.type_k, self.kv.currentData()[0], *self._kv_figures)
        self.kv_note.setText(text)
        self.kv_note.setVisible(bool(text))
        if text and self.isVisible():  # room for its lines: grow the dialog, never clip them
            width = max(200, self.tabs.currentWidget().width() - 24)
            self.kv_note.setMinimumHeight(self.kv_note.heightForWidth(width) + 6)
            self.layout().activate()
            self.resize(self.width(), max(self.height(), self.sizeHint().height()))

    def _request(self, action: CacheAction) -> None:
        if self.client is not None and self.client.is_running():
            handle = self.client.cache(action)
            if handle is not None:
                self._requests.append(handle)
                handle.done.connect(self._cache_answer)
        else:
            self.cache_use.setText("unknown (the engine is not running)")

    def _clear_cache(self) -> None:
        self.cache_use.setText("clearing…")
        self._request(CacheAction.CLEAR)

    def _cache_answer(self, event: CacheEvent) -> None:
        if self._closed:
            return
        st = event.stats or {}
        self.cache_use.setText(
            f"{human_bytes(int(st.get('bytes', 0)))} of {human_bytes(int(st.get('budget_bytes', 0)))}"
            f" · {int(st.get('tokens', 0)):,} tokens in {int(st.get('blocks', 0)):,} blocks")
        self._fit_cache_use()

    def _fit_cache_use(self) -> None:
        """Room for every line of the prefix store's figures beside Clear cache (they wrap)."""
        label = self.cache_use
        label.setMinimumHeight(label.heightForWidth(max(80, label.width())))
        self.layout().activate()
        if self.isVisible():
            self.resize(self.width(), max(self.height(), self.sizeHint().height()))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override: the figures wrap anew
        super().resizeEvent(event)
        if self.cache_use.text():
            self.cache_use.setMinimumHeight(self.cache_use.heightForWidth(max(80, self.cache_use.width())))

    def done(self, result: int) -> None:  # noqa: D102 - disconnect before closing
        self._closed = True
        self.tools_tab.shutdown()
        for handle in self._requests:
            try:
                handle.done.disconnect(self._cache_answer)
            except (RuntimeError, TypeError):
                pass
        super().done(result)

    def _engine_kind_changed(self, *_args) -> None:
        remote = self.engine_kind.currentData() == "remote"
        for w in (self.engine_url, self.engine_key, self.engine_model):  # the server's rows: only for a server
            w.setEnabled(remote)
            self.app_form.setRowVisible(w, remote)
        self.app_form.setRowVisible(self.remote_note, remote)

    def conversation_values(self) -> tuple[str, dict]:
        """(system prompt, sampling dict) as entered for this chat (or the new chat)."""
        return self.chat_form.values()

    def chat_changed(self) -> bool:
        """Whether the first tab's values differ from what it showed when opened."""
        return self.chat_form.values() != self._chat_shown

    def accept(self) -> None:  # noqa: D102 - validate before anything changes
        problem = self.problem()
        self.error.setText(problem)
        self.error.setVisible(bool(problem))
        if problem:
            return
        super().accept()

    def problem(self) -> str:
        """Why the App values cannot be used ("" when they can): checked by the engine's own
        rule (``AppSettings.engine_settings``) before anything is saved or reloaded."""
        for form in (self.chat_form, self.defaults_form):
            if form.problem():
                return f"These settings cannot be used: {form.problem()}. Nothing was changed."
        try:
            check_ctx_size(self.n_ctx.value())
        except LimitError as exc:
            return f"These settings cannot be used: {str(exc).rstrip('.')}. Nothing was changed."
        if self.budget.value() < MIN_BUDGET_MB:
            return (f"These settings cannot be used: the prefix-store budget must be at least {MIN_BUDGET_MB} MB; "
                    f"got {self.budget.value():,} MB. Nothing was changed.")
        if self._trained_context and self.n_ctx.value() > self._trained_context * CTX_TRAIN_FACTOR:
            return (f"These settings cannot be used: the loaded model was trained for "
                    f"{self._trained_context:,} tokens of context, and Branchwise takes at most "
                    f"{CTX_TRAIN_FACTOR} times that ({self._trained_context * CTX_TRAIN_FACTOR:,}). "
                    "Nothing was changed.")
        if self.speculative.problem():
            return f"These settings cannot be used: {self.speculative.problem()}. Nothing was changed."
        try:
            replace(self._settings, **{k: v for k, v in self.app_values().items()
                                       if k in ENGINE_FIELDS}).engine_settings()
        except (ValueError, TypeError) as exc:
            return f"These settings cannot be used: {exc}. Nothing was changed."
        return ""

    def app_values(self) -> dict:
        """n_ctx, n_threads, type_k, type_v, budget_bytes, api_host, api_port, api_key,
        engine_url, engine_key, engine_model, default_system_prompt, default_sampling and
        prompt_presets as entered (an empty address is 127.0.0.1), prewarm and speculative."""
        type_k, type_v = self.kv.currentData()
        default_prompt, default_sampling = self.defaults_form.values()
        return {"n_ctx": self.n_ctx.value(), "n_threads": self.threads.value(),
                "default_system_prompt": default_prompt, "default_sampling": default_sampling,
                "prompt_presets": dict(self.presets),
                "type_k": type_k, "type_v": type_v, "budget_bytes": self.budget.value() * MB,
                "api_host": self.api_host.text().strip() or "127.0.0.1", "api_port": self.api_port.value(),
                "api_key": self.api_key.text().strip(), **self._engine_values(),
                "prewarm": self.prewarm.isChecked(), "speculative": self.speculative.value(),
                **self.tools_tab.values()}

    def _engine_values(self) -> dict:
        """engine_url, engine_key, engine_model: all "" for the local model file."""
        if self.engine_kind.currentData() != "remote" or not self.engine_url.text().strip():
            return {"engine_url": "", "engine_key": "", "engine_model": ""}
        return {"engine_url": self.engine_url.text().strip(), "engine_key": self.engine_key.text().strip(),
                "engine_model": self.engine_model.text().strip()}
