"""The status bar: the last reply's figures, a progress bar, the context figure, the model."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QFrame, QLabel, QProgressBar, QSizePolicy, QStatusBar

from app.session import reply_status_line
from app.window.shell.plain import plain_label, tooltip
from engine.events import Phase

OVER_COLOR = "#d0312d"  # the context figure when the chat does not fit (readable on light and dark)
PROGRESS_MIN_TOKENS = 64  # show the progress bar only for restores/prefills at least this long
SEPARATOR = " · "
PROGRESS_TEXTS = ("Prefilling 999,999/999,999 tokens", "Restoring 999,999/999,999 tokens", "Loading model… 100%")
"""The longest texts the progress bar shows: it is made wide enough for them."""
MODEL_LABEL_MAX = 300  # pixels: a longer model name is elided in the middle (the whole name in its tooltip)
MODEL_LABEL_SHARE = 4  # and at most a quarter of the bar, so a narrow window keeps the reply's figures


def fitted_text(text: str, width: int, fm: QFontMetrics, middle: bool = False) -> str:
    """``text`` as it fits in ``width`` pixels of ``fm``'s font: whole when it fits; else,
    for a line of figures joined by " · ", without whole figures: the last one (e.g. "46
    tok/s") always stays, then as many of the others as fit, the first ones first, each run
    of dropped figures shown as one "…" ("prefilled while you typed: 3,600 tokens · … · 46
    tok/s"); a word is never cut: when even the last figure does not fit, its first whole
    words and "…" are shown. ``middle`` True is for a name with figures after it (a model's:
    "SmolLM2-135M-Instruct.Q4_1 · 135M parameters"): the figures are left out, then the name
    is elided in the middle."""
    if fm.horizontalAdvance(text) <= width:
        return text
    if middle:  # a name and its figures: the figures go first, then the name is elided in the middle
        name = text.split(SEPARATOR)[0]
        return name if fm.horizontalAdvance(name) <= width else fm.elidedText(name, Qt.TextElideMode.ElideMiddle, width)
    parts = text.split(SEPARATOR)
    if len(parts) > 1:  # keep whole figures, the first ones first, and always the last
        kept: list[int] = []
        for i in range(len(parts) - 1):
            if fm.horizontalAdvance(_with_gaps(parts, [*kept, i])) <= width:
                kept.append(i)
        shorter = _with_gaps(parts, kept)
        if fm.horizontalAdvance(shorter) <= width:
            return shorter
        if fm.horizontalAdvance(parts[-1]) <= width:
            return parts[-1]
    words = parts[-1].split(" ")
    while len(words) > 1:
        words.pop()
        shorter = " ".join(words) + " …"
        if fm.horizontalAdvance(shorter) <= width:
            return shorter
    return "…" if fm.horizontalAdvance("…") <= width else ""


def _with_gaps(parts: list[str], kept: list[int]) -> str:
    """``parts`` joined by " · " with only the ``kept`` indices and the last part, each run
    of left-out parts shown as one "…"."""
    out: list[str] = []
    for i, part in enumerate(parts):
        if i in kept or i == len(parts) - 1:
            out.append(part)
        elif not out or out[-1] != "…":
            out.append("…")
    return SEPARATOR.join(out)


class FittedLabel(QLabel):
    """A one-line plain-text label that never widens the status bar: it draws ``fitted_text``
    of its text in the width it gets (``text()`` stays the whole text). ``middle``: elide in
    the middle (a file name); ``auto_tip``: the whole text is its tooltip while it is cut."""

    def __init__(self, text: str = "", middle: bool = False, auto_tip: bool = False):
        super().__init__(text)
        self.middle, self.auto_tip = middle, auto_tip
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt name
        super().setText(text)
        self._tip()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._tip()

    def _tip(self) -> None:
        if self.auto_tip:
            cut = self.shown_text() != self.text()
            self.setToolTip(tooltip(self.text().replace(SEPARATOR, "\n")) if cut else "")

    def shown_text(self) -> str:
        """What is drawn at the label's present width."""
        return fitted_text(self.text(), self.contentsRect().width(), self.fontMetrics(), self.middle)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().sizeHint()
        return QSize(min(hint.width(), self.maximumWidth()), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(0, super().minimumSizeHint().height())

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        shown = self.shown_text()
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.setFont(self.font())
        p.drawText(self.contentsRect(), int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), shown)


class StatusBar:
    """The widgets of ``QMainWindow.statusBar()`` and what they show.

    ``stats_label``: the reply figures ("restored N tokens in X ms · …");
    ``progress``: model load or restore/prefill progress; ``context_label``:
    "context used / n_ctx" (tokens); ``model_label``: the loaded model.
    """

    def __init__(self, bar: QStatusBar):
        self.bar = bar
        self.stats_label = FittedLabel(auto_tip=True)  # drawn to fit: never pushes the context figure away
        self.stats_label.setObjectName("reply_stats")
        self.progress = QProgressBar()
        fm = self.progress.fontMetrics()
        self.progress.setFixedWidth(max(fm.horizontalAdvance(t) for t in PROGRESS_TEXTS) + 3 * fm.height())
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.context_label = QLabel()
        self.model_label = FittedLabel("No model", middle=True)  # a file's or a server's model name
        self.model_label.setMaximumWidth(MODEL_LABEL_MAX)
        self.model_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
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
        self.model_rule = QFrame()  # a thin line between the context figure and the model's name
        self.model_rule.setFrameShape(QFrame.Shape.VLine)
        self.model_rule.setFrameShadow(QFrame.Shadow.Plain)
        self.model_rule.setForegroundRole(QPalette.ColorRole.Mid)  # grey in both themes
        bar.addPermanentWidget(self.model_rule)
        bar.addPermanentWidget(self.model_label)
        self._width_rule = _ModelLabelWidth(self.model_label, bar)

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

    def show_stats(self, stats: dict | None, saved: bool = False, first_turn: bool = False) -> None:
        """The figures of a reply (``app.session.reply_status_line``; "" without stats)."""
        self.stats_label.setText(reply_status_line(stats, saved, first_turn) if stats else "")

    def show_restored(self, tokens: int, ms: float) -> None:
        """What was restored from the prefix store just now for the chat shown: ``tokens``, and
        ``ms`` until the chat was ready to continue (the restore and any prefill after it)."""
        self.stats_label.setText(f"Restored {tokens:,} tokens of this chat from the store · ready in {ms:,.0f} ms")

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
            self.progress.setFormat(f"{verb} {done:,}/{total:,} tokens")
            self.progress.show()
        elif done >= total:
            self.progress.hide()


class _ModelLabelWidth(QObject):
    """Keeps the model label within MODEL_LABEL_MAX pixels and 1/MODEL_LABEL_SHARE of the bar."""

    def __init__(self, label: QLabel, bar: QStatusBar):
        super().__init__(bar)
        self.label = label
        bar.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Resize:
            self.label.setMaximumWidth(min(MODEL_LABEL_MAX, max(1, watched.width() // MODEL_LABEL_SHARE)))
        return False
