"""The status bar: the last reply's figures, a progress bar, the context figure, the model."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from app.session import reply_status_line
from app.window.shell.plain import plain_label
from engine.events import Phase

OVER_COLOR = "#d0312d"  # the context figure when the chat does not fit (readable on light and dark)
PROGRESS_MIN_TOKENS = 64  # show the progress bar only for restores/prefills at least this long


class StatusBar:
    """The widgets of ``QMainWindow.statusBar()`` and what they show.

    ``stats_label``: the reply figures ("restored N tokens in X ms · …");
    ``progress``: model load or restore/prefill progress; ``context_label``:
    "context used / n_ctx" (tokens); ``model_label``: the loaded model.
    """

    def __init__(self, bar: QStatusBar):
        self.bar = bar
        self.stats_label = QLabel()
        self.stats_label.setObjectName("reply_stats")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.context_label = QLabel()
        self.model_label = QLabel("No model")
        self.model_label.setTextFormat(Qt.TextFormat.PlainText)  # a file's or a server's model name
        self.api_label = QLabel()  # "API: http://127.0.0.1:8080/v1" while the API server runs
        self.api_label.setObjectName("api_status")
        self.api_label.setTextFormat(Qt.TextFormat.PlainText)
        self.api_label.hide()
        self.context_used = 0  # tokens of the shown path, as last shown
        self.context_over = False  # whether that is more than the context holds
        for label in (self.stats_label, self.context_label, self.model_label):
            plain_label(label)  # the model label shows general.name from the model file
        bar.addWidget(self.stats_label, 1)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.api_label)
        bar.addPermanentWidget(self.context_label)
        bar.addPermanentWidget(self.model_label)

    def flash(self, text: str, ms: int) -> None:
        """Show ``text`` on the left of the bar for ``ms`` milliseconds (a confirmation)."""
        self.bar.showMessage(text, ms)

    def set_api(self, state: str, url: str) -> None:
        """The API server's indicator: "API: <url>" while running, "API: starting…" /
        "API: stopping…" meanwhile, hidden when stopped or failed (``state``: an ApiState)."""
        text = {"running": f"API: {url.removesuffix('/v1')}", "starting": "API: starting…",
                "stopping": "API: stopping…"}.get(str(state), "")
        self.api_label.setText(text)
        self.api_label.setToolTip(f"OpenAI-compatible API at {url}" if url else "")
        self.api_label.setVisible(bool(text))

    def show_stats(self, stats: dict | None, saved: bool = False) -> None:
        self.stats_label.setText(reply_status_line(stats, saved) if stats else "")

    def set_context(self, used: int, n_ctx: int) -> None:
        """Show ``used`` of ``n_ctx`` tokens; in red, with a tooltip, when it does not fit
        (a prompt must leave one token for the reply, as the engine checks)."""
        self.context_label.setText(f"context {used:,} / {n_ctx:,}")
        self.context_used = used
        self.context_over = bool(n_ctx) and used + 1 > n_ctx
        self.context_label.setStyleSheet(f"color:{OVER_COLOR}; font-weight:bold;" if self.context_over else "")
        self.context_label.setToolTip(
            f"This chat needs {used:,} tokens but the context holds {n_ctx:,}: the next reply cannot be "
            "generated until it is shortened, continued on a new branch or the context is raised."
            if self.context_over else "Tokens the shown branch takes / the context size")

    def set_context_from_stats(self, stats: dict | None, n_ctx: int) -> None:
        """The context figure from a reply's stats: prompt + generated tokens (0 without stats)."""
        used = (stats.get("prompt_tokens", 0) + stats.get("generated_tokens", 0)) if stats else 0
        self.set_context(used, n_ctx)

    def loading(self, done: int = 0, total: int = 0) -> None:
        """Model load progress: bytes hashed of ``total`` (0: not known yet, a busy bar)."""
        if total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
            self.progress.setFormat("Loading model… %p%")
        else:
            self.progress.setRange(0, 0)
            self.progress.setFormat("Loading model…")
        self.progress.show()

    def reply_progress(self, phase: str, done: int, total: int) -> None:
        """Restore/prefill progress of a reply (tokens); shown for long prompts only."""
        if total >= PROGRESS_MIN_TOKENS and done < total:
            self.progress.setRange(0, total)
            self.progress.setValue(done)
            verb = "Restoring" if phase == Phase.RESTORE else "Prefilling"
            self.progress.setFormat(f"{verb} %v/%m tokens")
            self.progress.show()
        elif done >= total:
            self.progress.hide()
