"""The transcript: the active path of a conversation as message bubbles.

Each ``MessageWidget`` shows one message rendered from Markdown, a ``‹ 2/3 ›``
navigator when it has siblings, and its actions (copy, edit in place,
regenerate, fork). ``TranscriptView`` stacks them in a scroll area and holds
the bubble of the reply being streamed.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.window.markdown_view import LinkKind, classify_link, code_blocks, to_html
from app.window.theme import LIGHT, Colors
from storage.chats import Message

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
SHOWN_MESSAGES = 200
"""Bubbles built when a chat opens: the newest ones. Older messages wait behind a
"Show earlier messages" button, so opening a 10,000-message branch costs the same as a
200-message one (a bubble takes milliseconds to build)."""
UNANSWERED_NOTE = "no reply (stopped or failed)"
"""The note beside a user message that has no reply: Esc before the first token, an engine
crash or error. Its Retry button answers it."""
STATUS_NOTES = {"stopped": "stopped", "error": "interrupted", "streaming": "writing…"}


def stats_line(stats: dict | None) -> str:
    """A one-line summary of a reply's GenerationStats dict, e.g. "24 tokens · 130 tok/s"."""
    if not stats:
        return ""
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("decode_tokens_per_s"):
        parts.append(f"{stats['decode_tokens_per_s']:.0f} tok/s")
    if stats.get("restored_tokens"):
        parts.append(f"restored {stats['restored_tokens']:,}")
    if stats.get("prefilled_tokens"):
        parts.append(f"prefilled {stats['prefilled_tokens']:,}")
    if stats.get("finish_reason") == "length":
        parts.append("hit max tokens")
    elif stats.get("finish_reason") == "context":
        parts.append("context full")
    return " · ".join(parts)


class MessageWidget(QFrame):
    """One message. ``message`` is None for the reply being streamed (not saved yet)."""

    sibling_requested = Signal(int, int)  # message id, +1 / -1
    edit_saved = Signal(int, str)  # message id, new text
    regenerate_requested = Signal(int)
    fork_requested = Signal(int)
    link_requested = Signal(str)  # an http(s) link in the text was clicked (not opened yet)
    edit_changed = Signal(int, str)  # message id, the editor's text (when it opens and on each change)
    edit_ended = Signal(int)  # message id: its editor closed (saved or cancelled)
    regenerate_hovered = Signal(int)  # message id: the pointer entered its Regenerate button

    def __init__(self, message: Message | None, role: str, index: int = 1, count: int = 1,
                 colors: Colors = LIGHT, busy: bool = False, parent: QWidget | None = None,
                 unanswered: bool = False):
        super().__init__(parent)
        self.message = message
        self.role = role
        self.colors = colors
        self._text = message.content if message else ""
        self.unanswered_note = ""  # set on a user message left without a reply
        self.setObjectName("bubble_" + role)
        bg = colors.user_bubble if role == "user" else colors.assistant_bubble
        self.setStyleSheet(
            f"QFrame#bubble_{role} {{ background:{bg}; border:1px solid {colors.border}; border-radius:10px; }}"
        )
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 8, 12, 8)
        outer.setSpacing(4)

        header = QHBoxLayout()
        header.setSpacing(4)
        name = QLabel(f"<b>{ROLE_NAMES.get(role, role)}</b>")
        header.addWidget(name)
        self.note = QLabel()
        self.note.setStyleSheet(f"color:{colors.muted};")
        header.addWidget(self.note)
        header.addStretch(1)
        self.buttons: dict[str, QToolButton] = {}
        if message is not None and count > 1:
            prev_b = self._tool("‹", "Previous version", lambda: self.sibling_requested.emit(message.id, -1))
            prev_b.setEnabled(index > 1 and not busy)
            self.position = QLabel(f"{index}/{count}")
            self.position.setObjectName("sibling_position")
            nxt = self._tool("›", "Next version", lambda: self.sibling_requested.emit(message.id, +1))
            nxt.setEnabled(index < count and not busy)
            header.addWidget(prev_b)
            header.addWidget(self.position)
            header.addWidget(nxt)
            self.buttons["prev"], self.buttons["next"] = prev_b, nxt
        if message is not None:
            self.buttons["copy"] = self._tool("Copy", "Copy this message", self._copy_all)
            header.addWidget(self.buttons["copy"])
            if role == "user":
                self.buttons["edit"] = self._tool("Edit", "Edit this message (a new branch)", self.begin_edit)
                header.addWidget(self.buttons["edit"])
            if role == "user" and unanswered:  # a turn that failed or was stopped: answer it in place
                self.unanswered_note = UNANSWERED_NOTE
                self.buttons["retry"] = self._tool("Retry", "Generate the reply to this message",
                                                   lambda: self.regenerate_requested.emit(message.id))
                header.addWidget(self.buttons["retry"])
            if role == "assistant":
                self.buttons["regenerate"] = self._tool(
                    "Regenerate", "Write another reply (a new branch)",
                    lambda: self.regenerate_requested.emit(message.id))
                self.buttons["regenerate"].installEventFilter(self)
                header.addWidget(self.buttons["regenerate"])
            self.buttons["fork"] = self._tool("Fork", "Fork to a new chat from here",
                                              lambda: self.fork_requested.emit(message.id))
            header.addWidget(self.buttons["fork"])
            for key in ("edit", "regenerate", "retry", "fork"):
                if key in self.buttons:
                    self.buttons[key].setEnabled(not busy)
        outer.addLayout(header)

        self.body = QLabel()
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.body.setOpenExternalLinks(False)
        self.body.linkActivated.connect(self._link)
        self.body.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        outer.addWidget(self.body)

        self.editor: QPlainTextEdit | None = None
        self.footer = QLabel()
        self.footer.setStyleSheet(f"color:{colors.muted}; font-size:small;")
        outer.addWidget(self.footer)
        self.set_text(self._text)
        if message is not None:
            self.set_stats(message.stats, message.status)

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.setCursor(Qt.CursorShape.PointingHandCursor)
        b.clicked.connect(slot)
        return b

    # -- content -------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return self._text

    def set_text(self, text: str) -> None:
        self._text = text
        if not text and self.message is None:
            self.body.setText(f'<span style="color:{self.colors.muted};">…</span>')
        else:
            self.body.setText(to_html(text, self.colors, streaming=self.message is None))

    def set_stats(self, stats: dict | None, status: str = "complete") -> None:
        self.footer.setText(stats_line(stats) if self.role == "assistant" else "")
        self.footer.setVisible(bool(self.footer.text()))
        note = STATUS_NOTES.get(status, "") or self.unanswered_note
        self.note.setText(f"· {note}" if note else "")

    def _copy_all(self) -> None:
        QGuiApplication.clipboard().setText(self._text)

    def _link(self, href: str) -> None:
        kind = classify_link(href)
        if kind == LinkKind.EXTERNAL:
            self.link_requested.emit(href.strip())
        elif kind == LinkKind.COPY_CODE:
            blocks = code_blocks(self._text)
            n = int(href.split(":", 1)[1])
            if n < len(blocks):
                QGuiApplication.clipboard().setText(blocks[n])

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if (event.type() == QEvent.Type.Enter and watched is self.buttons.get("regenerate")
                and self.message is not None and watched.isEnabled()):
            self.regenerate_hovered.emit(self.message.id)
        return super().eventFilter(watched, event)

    # -- edit in place -------------------------------------------------------------------

    def begin_edit(self) -> None:
        """Swap the text for an editor with Save and Cancel (Ctrl+Enter saves, Esc cancels)."""
        if self.editor is not None or self.message is None:
            return
        self.editor = QPlainTextEdit(self._text)
        self.editor.setObjectName("inline_editor")
        self.editor.setMinimumHeight(80)
        row = QHBoxLayout()
        row.addStretch(1)
        cancel = QPushButton("Cancel")
        save = QPushButton("Save && send")
        save.setDefault(True)
        save.setObjectName("save_edit")
        cancel.clicked.connect(self.end_edit)
        save.clicked.connect(self._save_edit)
        row.addWidget(cancel)
        row.addWidget(save)
        self._edit_row = QWidget()
        self._edit_row.setLayout(row)
        lay = self.layout()
        lay.insertWidget(2, self.editor)
        lay.insertWidget(3, self._edit_row)
        self.body.hide()
        QShortcut(QKeySequence("Ctrl+Return"), self.editor, self._save_edit)
        QShortcut(QKeySequence("Escape"), self.editor, self.end_edit)
        self.editor.setFocus()
        self.editor.selectAll()
        editor, mid = self.editor, self.message.id
        editor.textChanged.connect(lambda: self.edit_changed.emit(mid, editor.toPlainText()))
        self.edit_changed.emit(mid, self._text)

    def end_edit(self) -> None:
        if self.editor is None:
            return
        self.editor.deleteLater()
        self._edit_row.deleteLater()
        self.editor = None
        self.body.show()
        if self.message is not None:
            self.edit_ended.emit(self.message.id)

    def _save_edit(self) -> None:
        if self.editor is None or self.message is None:
            return
        text = self.editor.toPlainText().strip()
        self.end_edit()
        if text and text != self._text.strip():
            self.edit_saved.emit(self.message.id, text)


class TranscriptView(QScrollArea):
    """The messages of the active path, plus the reply being streamed."""

    sibling_requested = Signal(int, int)
    edit_saved = Signal(int, str)
    regenerate_requested = Signal(int)
    fork_requested = Signal(int)
    link_requested = Signal(str)  # an http(s) link in any message was clicked
    edit_changed = Signal(int, str)  # MessageWidget's: for zero-wait turns (prewarm_controller.py)
    edit_ended = Signal(int)
    regenerate_hovered = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.colors = LIGHT
        self._inner = QWidget()
        self._layout = QVBoxLayout(self._inner)
        self._layout.setContentsMargins(24, 16, 24, 16)
        self._layout.setSpacing(10)
        self._layout.addStretch(1)
        self.setWidget(self._inner)
        self.widgets: list[MessageWidget] = []
        self.pending: MessageWidget | None = None
        self._empty = QLabel()
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._layout.insertWidget(0, self._empty)
        self.earlier_button = QPushButton()
        self.earlier_button.setObjectName("show_earlier")
        self.earlier_button.setFlat(True)
        self.earlier_button.clicked.connect(self.show_earlier)
        self.earlier_button.hide()
        self._layout.insertWidget(1, self.earlier_button)
        self._shown_limit = SHOWN_MESSAGES
        self._args: tuple = ()
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self._stick_to_bottom = True

    def set_messages(self, path: list[Message], positions: dict[int, tuple[int, int]],
                     colors: Colors, busy: bool = False, empty_text: str = "",
                     unanswered_id: int | None = None) -> None:
        """Show ``path`` (root first). ``positions`` maps message id -> (index, count) among siblings;
        ``unanswered_id``, a user message with no reply, gets a Retry button, as does every user
        message followed by another user message. Only the newest
        ``SHOWN_MESSAGES`` are built; ``show_earlier`` adds more."""
        new_path = not self._args or [m.id for m in self._args[0][:1]] != [m.id for m in path[:1]]
        if new_path:
            self._shown_limit = SHOWN_MESSAGES
        self._args = (path, positions, colors, busy, empty_text, unanswered_id)
        self.colors = colors
        self.clear()
        # every user message with no reply gets Retry: the leaf the controller names, and
        # one followed by another user message (a reply that failed or was cancelled)
        unanswered = {m.id for m, nxt in zip(path, path[1:]) if m.role == "user" and nxt.role == "user"}
        if unanswered_id is not None:
            unanswered.add(unanswered_id)
        hidden = max(0, len(path) - self._shown_limit)
        self.earlier_button.setText(f"Show earlier messages ({hidden:,} not shown)")
        self.earlier_button.setVisible(hidden > 0)
        path = path[hidden:]
        self._empty.setText(empty_text)
        self._empty.setStyleSheet(f"color:{colors.muted}; font-size:15px;")
        self._empty.setVisible(not path and bool(empty_text))
        for m in path:
            if m.role == "system":
                continue
            index, count = positions.get(m.id, (1, 1))
            w = MessageWidget(m, m.role, index, count, colors, busy, unanswered=m.id in unanswered)
            w.sibling_requested.connect(self.sibling_requested)
            w.edit_saved.connect(self.edit_saved)
            w.regenerate_requested.connect(self.regenerate_requested)
            w.fork_requested.connect(self.fork_requested)
            w.link_requested.connect(self.link_requested)
            w.edit_changed.connect(self.edit_changed)
            w.edit_ended.connect(self.edit_ended)
            w.regenerate_hovered.connect(self.regenerate_hovered)
            self._add(w)
        self._stick_to_bottom = True
        QTimer.singleShot(0, self.scroll_to_bottom)

    def show_earlier(self) -> None:
        """Build ``SHOWN_MESSAGES`` more of the older messages of the shown path."""
        if self._args:
            self._shown_limit += SHOWN_MESSAGES
            self.set_messages(*self._args)
            self._stick_to_bottom = False
            QTimer.singleShot(0, lambda: self.verticalScrollBar().setValue(0))

    def _add(self, w: MessageWidget) -> None:
        self._layout.insertWidget(self._layout.count() - 1, w)
        self.widgets.append(w)

    def clear(self) -> None:
        for w in self.widgets:  # deleteLater: a button of ``w`` may be emitting right now
            self._layout.removeWidget(w)
            w.hide()
            w.deleteLater()
        self.widgets = []
        self.pending = None

    def start_pending(self) -> MessageWidget:
        """Add an empty assistant bubble for the reply about to stream."""
        self._empty.hide()
        self.pending = MessageWidget(None, "assistant", colors=self.colors)
        self.pending.note.setText("· thinking…")
        self.pending.link_requested.connect(self.link_requested)
        self._add(self.pending)
        self._stick_to_bottom = True
        return self.pending

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.message and w.message.id == message_id), None)

    def scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(hi)

    def note_user_scroll(self) -> None:
        bar = self.verticalScrollBar()
        self._stick_to_bottom = bar.value() >= bar.maximum() - 40

    def wheelEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().wheelEvent(event)
        self.note_user_scroll()
