"""One message bubble: ``MessageWidget`` shows a message rendered from Markdown, a
``‹ 2/3 ›`` navigator when it has siblings, and its actions (copy, edit in place,
regenerate, fork, delete); ``TranscriptView`` (transcript_view.py) stacks them.
"""

from __future__ import annotations

import html
import re
import time

from PySide6.QtCore import QEvent, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QKeySequence, QPainter, QPalette, QPen, QShortcut
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.session import is_empty_reply, restored_words
from app.session.continuation import can_continue
from app.window.transcript.inline_editor import EDIT_HINT, InlineEditor
from app.window.transcript.long_text import LongTextExpander, collapsed
from app.window.transcript.message_body import MessageBody
from app.window.transcript.markdown_view import LinkKind, classify_link, code_blocks, to_html
from app.window.transcript.streaming_body import StreamingBody
from app.window.transcript.tool_call_block import ToolCallBlock
from app.window.transcript.thought_block import ThoughtBlock
from app.window.shell.theme import LIGHT, Colors
from storage.chats import Message

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
UNANSWERED_NOTE = "no reply (stopped or failed)"
"""The note beside a user message that has no reply: Esc before the first token, an engine
crash or error. Its Retry button answers it."""
STATUS_NOTES = {"stopped": "stopped", "error": "interrupted", "streaming": "writing…"}
COPIED_MS = 1500
"""How long "Copied" shows on a Copy button or a code block's "Copy code" link (milliseconds)."""
COPY_CODE_LINK = "Copy code</a>"
RADIUS_PX = 10
"""The radius of a bubble's corners (pixels)."""
_TAG_OR_TEXT = re.compile(r"(<style.*?</style>|<[^>]*>)", re.DOTALL)
_ENTITY = r"&(?:#\d+|#x[0-9a-fA-F]+|\w+);"


def mark_terms(rich: str, terms: list[str], color: str) -> str:
    """The rich text ``rich`` (as ``to_html`` makes it) with every occurrence of ``terms``
    (any case) in its text, never in its tags or entities, on a ``color`` background. The
    terms are escaped as the text is, so nothing a message holds becomes markup."""
    terms = [html.escape(t, quote=False) for t in terms if t]
    if not terms:
        return rich
    words = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    pattern = re.compile(f"({_ENTITY})|({words})", re.IGNORECASE)

    def mark(m: re.Match) -> str:
        return m.group(1) or f'<span style="background-color:{color};">{m.group(2)}</span>'

    pieces = _TAG_OR_TEXT.split(rich)
    return "".join(p if i % 2 else pattern.sub(mark, p) for i, p in enumerate(pieces))


def muted(label: QLabel, colors: Colors) -> None:
    """Draw ``label``'s text in ``colors.muted``: its palette, not a style sheet (parsing one per
    label cost a bubble a millisecond, and styled the label through the style-sheet engine)."""
    palette = label.palette()
    palette.setColor(QPalette.ColorRole.WindowText, QColor(colors.muted))
    label.setPalette(palette)


def message_time(when: float, now: float | None = None) -> str:
    """The local time of a message (unix seconds): "14:02" today, else "12 Mar 14:02"
    (with the year when it is not this year)."""
    t, today = time.localtime(when), time.localtime(time.time() if now is None else now)
    if t[:3] == today[:3]:
        return time.strftime("%H:%M", t)
    return time.strftime("%d %b %H:%M" if t.tm_year == today.tm_year else "%d %b %Y %H:%M", t).lstrip("0")


def stats_line(stats: dict | None, created_at: float | None = None, first_turn: bool = False,
               stopped: bool = False) -> str:
    """A one-line summary of a reply's GenerationStats dict and its time, e.g.
    "24 tokens · 130 tok/s · TTFT 85 ms · 14:02" (TTFT: time to first token). ``first_turn``:
    the reply is its conversation's first (its restored tokens are "reused N cached",
    ``app.session.restored_words``). ``stopped`` (or a "cancelled" finish reason): the reply
    was stopped (Esc, Stop) before it ended, said as "stopped" where a reply cut by its limit
    says "hit max tokens"."""
    when = [message_time(created_at)] if created_at else []
    if not stats:
        return " · ".join((["stopped"] if stopped else []) + when)
    parts = [f"{stats.get('generated_tokens', 0)} tokens"]
    if stats.get("decode_tokens_per_s"):
        parts.append(f"{stats['decode_tokens_per_s']:.0f} tok/s")
    if stats.get("drafted_tokens"):  # speculative decoding (engine/speculative.py)
        parts.append(f"{stats.get('accepted_tokens', 0):,}/{stats['drafted_tokens']:,} drafts")
    if stats.get("ttft_ms"):
        ttft = stats["ttft_ms"]
        parts.append(f"TTFT {ttft:.0f} ms" if ttft < 1000 else f"TTFT {ttft / 1000:.1f} s")
    if stats.get("restored_tokens"):
        parts.append(restored_words(stats["restored_tokens"], first_turn))
    if stats.get("prefilled_tokens"):
        parts.append(f"prefilled {stats['prefilled_tokens']:,}")
    if stopped or stats.get("finish_reason") == "cancelled":
        parts.append("stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("hit max tokens")
    elif stats.get("finish_reason") == "context":
        parts.append("context full")
    return " · ".join(parts + when)


class MessageWidget(QFrame):
    """One message. ``message`` is None for the reply being streamed (not saved yet)."""

    sibling_requested = Signal(int, int)  # message id, +1 / -1
    edit_saved = Signal(int, str)  # message id, new text
    regenerate_requested = Signal(int)
    fork_requested = Signal(int)
    link_requested = Signal(str)  # an http(s) link in the text was clicked (not opened yet)
    delete_requested = Signal(int)  # message id: delete it with the replies under it
    copy_conversation_requested = Signal()  # the shown branch as Markdown to the clipboard
    edit_changed = Signal(int, str)  # message id, the editor's text (when it opens and on each change)
    edit_ended = Signal(int)  # message id: its editor closed (saved or cancelled)
    regenerate_hovered = Signal(int)  # message id: the pointer entered its Regenerate button
    continue_requested = Signal(int)  # message id: write more of this reply (app/session/continuation.py)

    def __init__(self, message: Message | None, role: str, index: int = 1, count: int = 1,
                 colors: Colors = LIGHT, busy: bool = False, parent: QWidget | None = None,
                 unanswered: bool = False, first_turn: bool = False):
        super().__init__(parent)
        self.message = message
        self.first_turn = first_turn  # a reply to the conversation's first message
        self.role = role
        self.colors = colors
        self._text = message.content if message else ""
        self.busy = busy
        self.unanswered_note = ""  # set on a user message left without a reply
        self.highlighted = False
        self.marked = False  # the searched words are marked in the text (``mark_terms``)
        self.copied_code: int | None = None  # the code block whose "Copy code" was clicked last
        self.setObjectName("bubble_" + role)
        self.setAccessibleName(f"{ROLE_NAMES.get(role, role)} message")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(13, 9, 13, 9)  # 12 and 8 inside the 1-pixel border
        outer.setSpacing(4)

        header = QHBoxLayout()
        header.setSpacing(4)
        name = QLabel(f"<b>{ROLE_NAMES.get(role, role)}</b>")
        header.addWidget(name)
        self.note = QLabel()
        muted(self.note, colors)
        # a long note ("no reply (stopped or failed)") gives way in a narrow window, never the bubble
        self.note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.note.setMinimumWidth(0)
        header.addWidget(self.note)
        header.addStretch(1)
        self.buttons: dict[str, QToolButton] = {}
        self.index, self.count = index, count
        if message is not None and count > 1:
            prev_b = self._tool("‹", "Previous version", lambda: self.sibling_requested.emit(message.id, -1))
            self.position = QLabel(f"{index}/{count}")
            self.position.setObjectName("sibling_position")
            nxt = self._tool("›", "Next version", lambda: self.sibling_requested.emit(message.id, +1))
            header.addWidget(prev_b)
            header.addWidget(self.position)
            header.addWidget(nxt)
            self.buttons["prev"], self.buttons["next"] = prev_b, nxt
        self.empty_reply = message is not None and is_empty_reply(message)
        if self.empty_reply:  # stopped before its first token: Retry takes its place
            self.buttons["retry"] = self._tool("Retry", "Generate this reply again",
                                               lambda: self.regenerate_requested.emit(message.id))
            header.addWidget(self.buttons["retry"])
        elif message is not None:
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
                if can_continue(message):  # stopped, or cut at max tokens: it can go on
                    self.buttons["continue"] = self._tool("Continue", "Continue this reply where it stopped",
                                                          lambda: self.continue_requested.emit(message.id))
                    header.insertWidget(header.indexOf(self.buttons["regenerate"]), self.buttons["continue"])
            self.buttons["fork"] = self._tool("Fork", "Fork to a new chat from here",
                                              lambda: self.fork_requested.emit(message.id))
            header.addWidget(self.buttons["fork"])
        self.set_busy(busy)
        outer.addLayout(header)

        self._thought: ThoughtBlock | None = None  # built when there is thinking (``thought``)
        self.tool_block = ToolCallBlock(message) if message is not None and getattr(message, "tool", None) else None
        if self.tool_block is not None:  # a tool step: the calls, or the result with its arguments
            outer.addWidget(self.tool_block)
            self._text = "" if role == "tool" else self._text  # the result is in the block, as plain text
        self.body = MessageBody()
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.body.setOpenExternalLinks(False)
        self.body.linkActivated.connect(self._link)
        self.body.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)  # the bubble's menu
        # Preferred, not Minimum: a word-wrapped label's size hint is its height at about 80
        # characters a line; taken as its minimum, a long message made the transcript taller
        # than its bubbles, and the view at the bottom showed blank space, not the new reply
        self.body.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        outer.addWidget(self.body)
        self.stream: StreamingBody | None = None  # the reply being streamed: its blocks, drawn as they end
        if message is None:
            self.stream = StreamingBody(colors)
            self.stream.link_activated.connect(self._link)
            self.stream.hide()
            outer.addWidget(self.stream)
        self._expander: LongTextExpander | None = None  # built for a long message (``expander``)

        self.editor: InlineEditor | None = None
        self.footer = QLabel()
        muted(self.footer, colors)
        self.footer.setWordWrap(True)  # the figures wrap in a narrow window instead of widening the bubble
        outer.addWidget(self.footer)
        if message is not None and getattr(message, "reasoning", None):  # above the answer
            self.thought.set_saved(message.reasoning, message.stats)
        self.set_text(self._text)
        if message is not None:
            self.set_stats(message.stats, message.status)

    def set_busy(self, busy: bool) -> None:
        """Disable (True) or enable the actions that change the tree while a reply streams:
        ‹ ›, Edit, Regenerate, Retry, Fork, and Delete in the menu. Copy stays."""
        self.busy = busy
        enabled = {"prev": self.index > 1, "next": self.index < self.count}
        for key in ("prev", "next", "edit", "regenerate", "retry", "fork", "continue"):
            if key in self.buttons:
                self.buttons[key].setEnabled(enabled.get(key, True) and not busy)

    def set_highlighted(self, on: bool) -> None:
        """Draw the bubble with an accent border (a search hit that was opened) or without."""
        if on != self.highlighted:
            self.highlighted = on
            self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        """The bubble: its role's background, a 1-pixel border (2 pixels in the accent colour
        when highlighted), corners of radius ``RADIUS_PX``. Painted, not a style sheet: a style
        sheet on the bubble made Qt style every widget in it through the style-sheet engine
        (a bubble took twice as long to build and lay out)."""
        c = self.colors
        width = 2 if self.highlighted else 1
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(QPen(QColor(c.accent if self.highlighted else c.border), width))
        p.setBrush(QColor(c.user_bubble if self.role == "user" else c.assistant_bubble))
        half = width / 2
        p.drawRoundedRect(QRectF(self.rect()).adjusted(half, half, -half, -half), RADIUS_PX, RADIUS_PX)
        p.end()

    @property
    def thought(self) -> ThoughtBlock:
        """The block of a reasoning model's thinking above the answer (thought_block.py),
        built when first asked for: most messages have none."""
        if self._thought is None:
            self._thought = ThoughtBlock(self.colors)
            lay = self.layout()
            lay.insertWidget(lay.indexOf(self.tool_block if self.tool_block is not None else self.body), self._thought)
        return self._thought

    @property
    def reasoning(self) -> str:
        """The thinking shown above the answer ("" when there is none); builds nothing."""
        return self._thought.reasoning if self._thought is not None else ""

    @property
    def expander(self) -> LongTextExpander:
        """The "Show all N lines" of a long message (long_text.py), built when first asked for."""
        if self._expander is None:
            self._expander = LongTextExpander()
            lay = self.layout()
            lay.insertWidget(lay.indexOf(self.footer), self._expander)
        return self._expander

    def context_menu(self) -> QMenu:
        """The bubble's menu: copy (the selection, the message, the branch as Markdown), delete."""
        menu = QMenu(self)
        if self.body.hasSelectedText():
            menu.addAction("Copy selection", lambda: QGuiApplication.clipboard().setText(
                self.body.selectedText().replace("\u200b", "")))  # markdown_view.break_long_runs
        menu.addAction("Copy message", self._copy_all)
        if self.reasoning:
            menu.addAction("Copy with reasoning", self.copy_with_reasoning)
        menu.addAction("Copy conversation as Markdown", self.copy_conversation_requested.emit)
        if self.message is not None:
            menu.addSeparator()
            delete = menu.addAction("Delete message and its replies",
                                    lambda: self.delete_requested.emit(self.message.id))
            delete.setEnabled(not self.busy)
        return menu

    def contextMenuEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.menu = self.context_menu()  # for tests: the menu while it is open
        self.menu.exec(event.globalPos())

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAccessibleName(tip)
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
        if self.stream is not None:  # streaming: only the block being written is redrawn
            if text and self._thought is not None:
                self._thought.fold_live()  # the answer started: the thinking folds
            self.body.setVisible(not text and not self.reasoning)
            self.body.setText(f'<span style="color:{self.colors.muted};">…</span>' if not text else "")
            self.stream.setVisible(bool(text))
            self.stream.set_text(text)
        elif not text and self.empty_reply:
            what = "Stopped" if self.message.status == "stopped" else "Failed"
            self.body.setText(f'<i style="color:{self.colors.muted};">{what} before the first token.</i>')
            if self._expander is not None:
                self._expander.set_text(text, None)
        else:  # a long saved message is drawn collapsed (its first lines), never whole
            cut = collapsed(text)
            self.body.setText(to_html(cut.preview if cut else text, self.colors))
            if cut is not None or self._expander is not None:
                self.expander.set_text(text, cut)

    def set_stats(self, stats: dict | None, status: str = "complete") -> None:
        when = self.message.created_at if self.message is not None else None
        self.footer.setText(stats_line(stats, when, self.first_turn, stopped=status == "stopped")
                            if self.role == "assistant" else "")
        self.footer.setVisible(bool(self.footer.text()))
        note = STATUS_NOTES.get(status, "") or self.unanswered_note
        self.note.setText(f"· {note}" if note else "")

    def _copy_all(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
        button = self.buttons.get("copy")
        if button is not None:  # "Copied" for a moment, then "Copy" again
            button.setText("Copied")
            QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))

    def copy_with_reasoning(self) -> None:
        """The thinking, a blank line, then the answer, to the clipboard (plain text)."""
        QGuiApplication.clipboard().setText(f"{self.reasoning}\n\n{self._text}" if self.reasoning else self._text)

    def set_reasoning(self, text: str) -> None:
        """The thinking streamed so far of the reply being written (shown open above it)."""
        self.thought.set_live(text)

    def mark_terms(self, terms: list[str]) -> None:
        """Show the searched ``terms`` (any case) in this message on the accent's background
        (a search hit that was opened); an empty list takes the marks away."""
        if self.stream is not None or self.editor is not None:
            return
        self.set_text(self._text)
        self.marked = bool(terms)
        if terms:
            self.body.setText(mark_terms(self.body.text(), terms, self.colors.search_mark))

    def _copied_code(self, n: int) -> None:
        """Code block ``n``'s "Copy code" link reads "Copied" for ``COPIED_MS``."""
        before = self.body.text()
        at = before.find(f'href="copy:{n}"')
        end = before.find(COPY_CODE_LINK, at) if at >= 0 else -1
        if end < 0:
            return
        after = before[:end] + "Copied</a>" + before[end + len(COPY_CODE_LINK):]
        self.body.setText(after)
        self.copied_code = n
        QTimer.singleShot(COPIED_MS, self, lambda: self.body.text() == after and self.body.setText(before))

    def _link(self, href: str) -> None:
        kind = classify_link(href)
        if kind == LinkKind.EXTERNAL:
            self.link_requested.emit(href.strip())
        elif kind == LinkKind.COPY_CODE:
            blocks = code_blocks(self._text)
            n = int(href.split(":", 1)[1])
            if n < len(blocks):
                QGuiApplication.clipboard().setText(blocks[n])
                if self.stream is None:
                    self._copied_code(n)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if (event.type() == QEvent.Type.Enter and watched is self.buttons.get("regenerate")
                and self.message is not None and watched.isEnabled()):
            self.regenerate_hovered.emit(self.message.id)
        return super().eventFilter(watched, event)

    # -- edit in place -------------------------------------------------------------------

    def begin_edit(self) -> None:
        """Swap the text for an editor with Save and Cancel and a line naming its keys
        (``inline_editor.EDIT_HINT``: Enter saves and sends, Shift+Enter adds a line, Esc cancels)."""
        if self.editor is not None or self.message is None:
            return
        self.editor = InlineEditor(self._text)
        self.editor.setObjectName("inline_editor")
        self.editor.setAccessibleName("Edit your message")
        self.editor.setMinimumHeight(80)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.edit_hint = QLabel(EDIT_HINT)
        self.edit_hint.setObjectName("edit_hint")
        self.edit_hint.setTextFormat(Qt.TextFormat.PlainText)
        self.edit_hint.setWordWrap(True)
        muted(self.edit_hint, self.colors)
        row.addWidget(self.edit_hint, 1)
        cancel = QPushButton("Cancel")
        cancel.setToolTip("Cancel the edit (Esc)")
        save = QPushButton("Save && send")
        save.setToolTip("Save and send as a new branch (Enter)")
        save.setDefault(True)
        save.setObjectName("save_edit")
        cancel.clicked.connect(self.end_edit)
        save.clicked.connect(self._save_edit)
        row.addWidget(cancel)
        row.addWidget(save)
        self._edit_row = QWidget()
        self._edit_row.setLayout(row)
        lay = self.layout()
        at = lay.indexOf(self.body)  # where the text was, under the thinking or the tool block
        lay.insertWidget(at, self.editor)
        lay.insertWidget(at + 1, self._edit_row)
        self.body.hide()
        if self._expander is not None:
            self._expander.hide()
        self.editor.save_requested.connect(self._save_edit)
        self.editor.cancel_requested.connect(self.end_edit)
        self.editor.setFocus(Qt.FocusReason.OtherFocusReason)
        self.editor.selectAll()
        editor, mid = self.editor, self.message.id
        editor.textChanged.connect(lambda: self.edit_changed.emit(mid, editor.toPlainText()))
        self.edit_changed.emit(mid, self._text)

    def end_edit(self) -> None:
        if self.editor is None:
            return
        if self.editor.hasFocus() and "edit" in self.buttons:  # the keyboard stays in the bubble
            self.buttons["edit"].setFocus(Qt.FocusReason.OtherFocusReason)
        self.editor.deleteLater()
        self._edit_row.deleteLater()
        self.editor = None
        self.body.show()
        if self.message is not None:
            self.edit_ended.emit(self.message.id)
        if self._expander is not None:
            self._expander.setVisible(collapsed(self._text) is not None)

    def _save_edit(self) -> None:
        if self.editor is None or self.message is None:
            return
        text = self.editor.toPlainText().strip()
        self.end_edit()
        if text and text != self._text.strip():
            self.edit_saved.emit(self.message.id, text)
