"""One streaming reply, from its first token to its final status and stats.

A reply's life (``ReplyState``, the ``status`` column of ``chats.sqlite3``)::

    (nothing stored) --first text--> STREAMING --done--> COMPLETE | STOPPED (cancelled)
           |                              |
           |                              +--stop / quit / engine died--> STOPPED | ERROR
           +--done before any text--> COMPLETE | STOPPED (an empty reply: Esc before the first token)

The row is created at the first piece of text (status STREAMING) and its text rewritten
at most every ``save_every_s`` seconds, so a crash or a kill loses at most that much
text; ``ChatStore.mark_interrupted_streams`` turns a STREAMING row left by a crash into
STOPPED at the next start. The KV snapshot is taken after the reply is saved (storing
the KV is an optimisation; the reply is what the user cannot lose), so its figures
arrive later and ``add_snapshot`` merges them into the stored stats.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.events import FinishReason
from storage.chat_records import MessageStatus

ReplyState = MessageStatus
"""A reply's lifecycle is its message status: STREAMING, then COMPLETE, STOPPED or ERROR."""

SAVE_EVERY_S = 0.5
"""Most seconds of streamed text a crash can lose (the partial text is saved this often)."""


class ReplyRecorder:
    """Saves the reply to the user message ``parent_id`` in ``chats`` (a ``ChatStore``) as it streams.

    Args:
        chats: the ``storage.chats.ChatStore``.
        conversation_id, parent_id: where the reply goes (a new child of ``parent_id``).
        model: the label stored on the reply (``app.session.labels.model_label``).
        save_every_s: most seconds between two saves of the partial text.
        clock: seconds, monotonic (tests pass a fake one).

    Raises (from every method that writes): ``storage.errors.StorageError`` (e.g. a full
    disk); the recorder's state is unchanged then, so the next call tries again.
    """

    def __init__(self, chats, conversation_id: int, parent_id: int, model: str,
                 save_every_s: float = SAVE_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.chats = chats
        self.conversation_id = conversation_id
        self.parent_id = parent_id
        self.model = model
        self.save_every_s = save_every_s
        self.clock = clock
        self.state = ReplyState.STREAMING
        self.message_id: int | None = None
        self.text = ""
        self.reasoning: str | None = None  # a reasoning model's thinking, streamed before the answer
        self.stats: dict = {}
        self._saved_text = ""
        self._saved_reasoning: str | None = None
        self._saved_at = 0.0

    @property
    def finished(self) -> bool:
        return self.state != ReplyState.STREAMING

    @property
    def kept_text(self) -> str:
        """The reply text its row holds now ("" before the row exists): all of ``text`` once
        the reply is finished, else what the last successful save wrote (a full disk can
        leave it behind ``text``)."""
        if self.message_id is None:
            return ""
        return self.text if self.finished else self._saved_text

    def add_text(self, piece: str) -> None:
        """Append streamed text; store the row at the first text, then save every ``save_every_s``."""
        if self.finished:
            return
        self.text += piece
        if self.message_id is None:
            if self.text:
                self.message_id = self.chats.add_message(
                    self.conversation_id, self.parent_id, "assistant", self.text,
                    status=ReplyState.STREAMING, model=self.model).id
                self._saved_text, self._saved_at = self.text, self.clock()
        elif self.clock() - self._saved_at >= self.save_every_s:
            self.save_partial()

    def add_reasoning(self, piece: str) -> None:
        """Append streamed reasoning (saved like the text: the row is created at the first
        piece, then rewritten every ``save_every_s``)."""
        if self.finished or not piece:
            return
        self.reasoning = (self.reasoning or "") + piece
        if self.message_id is None:
            self.message_id = self.chats.add_message(
                self.conversation_id, self.parent_id, "assistant", self.text,
                status=ReplyState.STREAMING, model=self.model, reasoning=self.reasoning).id
            self._saved_text, self._saved_reasoning, self._saved_at = self.text, self.reasoning, self.clock()
        elif self.clock() - self._saved_at >= self.save_every_s:
            self.save_partial()

    def save_partial(self) -> None:
        """Write the text (and reasoning) streamed so far, if it changed since the last save."""
        if self.finished or self.message_id is None or (
                self.text == self._saved_text and self.reasoning == self._saved_reasoning):
            return
        if self.reasoning == self._saved_reasoning:
            self.chats.update_message(self.message_id, content=self.text)
        else:
            self.chats.update_message(self.message_id, content=self.text, reasoning=self.reasoning)
        self._saved_text, self._saved_reasoning, self._saved_at = self.text, self.reasoning, self.clock()

    def complete(self, text: str, token_ids: list[int] | None, stats: dict,
                 reasoning: str | None = None) -> int | None:
        """The engine finished: store the final text (the answer), its ``reasoning`` (None:
        none), token ids and stats. The status is
        STOPPED when ``stats["finish_reason"]`` is "cancelled", else COMPLETE. A reply
        cancelled before its first token is stored too, empty and STOPPED (with its stats),
        so the transcript shows that it was stopped and offers Retry. Returns the message id."""
        if self.finished:
            return self.message_id
        cancelled = stats.get("finish_reason") == FinishReason.CANCELLED
        state = ReplyState.STOPPED if cancelled else ReplyState.COMPLETE
        self.stats = dict(stats)
        if self.message_id is None:  # no text had streamed (or it was not saved yet)
            self.message_id = self.chats.add_message(
                self.conversation_id, self.parent_id, "assistant", text, token_ids=token_ids,
                stats=self.stats, status=state, model=self.model, reasoning=reasoning).id
        else:
            self.chats.update_message(self.message_id, content=text, token_ids=token_ids,
                                      stats=self.stats, status=state, reasoning=reasoning)
        self.text, self.reasoning = text, reasoning
        self.state = state
        return self.message_id

    def add_snapshot(self, snapshot_ms: float, bytes_written: int) -> None:
        """Merge what storing the reply's KV cost (ms, bytes) into the saved stats."""
        if self.message_id is None or not self.stats:
            return
        self.stats = {**self.stats, "snapshot_ms": snapshot_ms, "snapshot_bytes_written": int(bytes_written)}
        self.chats.update_message(self.message_id, stats=self.stats)

    def abandon(self, state: ReplyState = ReplyState.STOPPED) -> int | None:
        """End the reply early (a stop before the engine answered, a quit, a dead engine):
        keep the text streamed so far, marked ``state`` (STOPPED or ERROR). Returns the
        message id, or None when nothing had streamed yet."""
        if self.finished:
            return self.message_id
        if self.message_id is not None:
            self.chats.update_message(self.message_id, content=self.text, status=state, reasoning=self.reasoning)
        elif self.text or self.reasoning:
            self.message_id = self.chats.add_message(self.conversation_id, self.parent_id, "assistant",
                                                     self.text, status=state, model=self.model,
                                                     reasoning=self.reasoning).id
        self.state = state
        return self.message_id
