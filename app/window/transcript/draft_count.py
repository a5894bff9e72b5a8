"""The draft's token count under the composer: "message 340 tokens · after sending: context 1,200 / 8,192"
(the status bar's "context N / 8,192" is the chat as it is now, before the draft is sent).

Counted by the engine with the loaded model's tokenizer and chat template
(``EngineClient.count_draft``): the draft alone, and the prompt the shown path plus the
draft would make (what sending it now puts in the context). Nothing is tokenized on the
UI thread: ``DEBOUNCE_MS`` after the last keystroke the draft's text and the path's
pickled messages (``ChatController.shown_prompt``, read once per shown branch off it) go
to the engine; one count is in flight at a time, and a draft changed meanwhile is counted
when it answers. The figure turns red when the draft does not fit. The composer has no
attachments API yet, so attached files are not counted.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel

from app.window.flows.model_controller import ModelState
from engine.events import CountEvent, pack_messages

log = logging.getLogger(__name__)

DEBOUNCE_MS = 250
_EMPTY = pack_messages([])  # the path of a chat not created yet


def draft_figure(message_tokens: int, context_tokens: int, n_ctx: int) -> str:
    """The label's text, e.g. "message 340 tokens · after sending: context 1,200 / 8,192": the
    draft's tokens and the context it would make, so it never reads as a second figure for the
    status bar's context (the chat without the draft)."""
    unit = "token" if message_tokens == 1 else "tokens"
    return f"message {message_tokens:,} {unit} · after sending: context {context_tokens:,} / {n_ctx:,}"


class DraftCount(QObject):
    """The label (``label``) under ``composer`` for ``chat``'s shown path, counted on
    ``model``'s engine (the path is ``chat.shown_prompt``). ``counted``: the last figures,
    (message tokens, context tokens, n_ctx), or None."""

    def __init__(self, *, chat, model, composer, parent: QObject):
        super().__init__(parent)
        self.chat, self.model, self.composer = chat, model, composer
        self.label = QLabel()
        self.label.setObjectName("draft_count")
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setAccessibleName("Draft token count")
        self.label.setContentsMargins(26, 0, 26, 2)
        # the theme's muted text (over 4.5:1 on the window in light and dark), not palette(mid)
        self.label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.label.hide()
        self.counted: tuple[int, int, int] | None = None
        self.requests = 0  # counts sent (tests)
        self._in_flight = False
        self._dirty = False
        self.timer = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self.timer.timeout.connect(self._count)
        composer.input.textChanged.connect(self.draft_changed)
        chat.path_shown.connect(self.path_changed)
        chat.current_changed.connect(lambda _cid: self.path_changed())

    def draft_changed(self) -> None:
        self.timer.start()

    def path_changed(self) -> None:
        if self.composer.text().strip():
            self.timer.start()

    def _count(self) -> None:
        text = self.composer.text()
        if not text.strip():
            self.label.hide()
            self.counted = None
            return
        if self.model.state != ModelState.READY or (self.model.facts or {}).get("remote"):
            return
        if self._in_flight:
            self._dirty = True
            return
        if self.chat.conversation_id is None:
            path = _EMPTY
        else:  # read on the reader thread once per shown branch (ShownPrompt)
            packed = self.chat.shown_prompt.want(self._path_read)
            if packed is None:
                return
            path = packed.data
        handle = self.model.client.count_draft(path, text)
        if handle is None:
            return
        self._in_flight, self._dirty = True, False
        self.requests += 1
        handle.done.connect(self._answered)
        handle.failed.connect(lambda e: (log.info("draft count failed: %s", e.message), self._settled()))

    def _path_read(self, _packed) -> None:
        self._count()

    def _settled(self) -> None:
        self._in_flight = False
        if self._dirty:
            self._count()

    def _answered(self, event: CountEvent) -> None:
        self._in_flight = False
        if self._dirty:  # the draft changed meanwhile: this answer is old
            self._count()
            return
        own = event.message_tokens[0] if event.message_tokens else 0
        n_ctx = event.n_ctx or self.chat.figures.n_ctx()
        self.counted = (own, event.prompt_tokens, n_ctx)
        if not self.composer.text().strip():
            self.label.hide()
            return
        self.label.setText(draft_figure(own, event.prompt_tokens, n_ctx))
        too_long = event.prompt_tokens + 1 > n_ctx
        self.label.setStyleSheet("color:#c0392b;" if too_long else "")
        self.label.show()
