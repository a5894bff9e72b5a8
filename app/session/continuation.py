"""Continue a reply that was stopped or hit max tokens: more text appended to the same message.

Which replies can be continued is read from what a reply stores already: its status and
its stats' ``finish_reason`` (``GenerationStats``: "cancelled" for Stop/Esc, "length" for
max tokens; "stop" and "context" cannot go on), and its token ids (the prompt of the
continuation is the history's prompt plus exactly those ids, so the prefix store restores
it whole: ``engine.core.Engine.generate(reply_prefix=...)``).

While it streams, the message is marked STREAMING and its token ids are cleared, so that
a crash leaves text and ids that agree (the text alone, marked STOPPED at the next start,
and not continuable); the end writes the whole text, the ids so far plus the new ones, the
new finish reason and the summed token counts.
"""

from __future__ import annotations

from app.session.recorder import ReplyRecorder, ReplyState
from engine.events import FinishReason

CONTINUABLE = (FinishReason.CANCELLED, FinishReason.LENGTH)


def can_continue(message) -> bool:
    """True for an assistant reply (a ``storage.chats.Message``) that ended by Stop or at max
    tokens, has text and its token ids, and has no reasoning (a thinking model's split
    between thinking and answer does not resume)."""
    stats = message.stats or {}
    return (message.role == "assistant" and message.status in (ReplyState.STOPPED, ReplyState.COMPLETE)
            and stats.get("finish_reason") in CONTINUABLE and bool(message.token_ids)
            and bool(message.content) and message.reasoning is None)


def why_not_continued(message) -> str:
    """One sentence on why ``message`` (a ``storage.chats.Message`` that ``can_continue``
    refuses) cannot go on, with what to do instead."""
    regenerate = f"use 'branchwise regenerate {message.id}' for a new reply"
    if message.role != "assistant":
        return f"Message {message.id} is your own message, not a reply; {regenerate}."
    if message.reasoning is not None:
        return f"Message {message.id} has the model's thinking apart from its answer, which does not resume; {regenerate}."
    reason = (message.stats or {}).get("finish_reason")
    if message.content and not message.token_ids and reason not in ("stop", "context"):
        return (f"Message {message.id} was cut off when Branchwise ended unexpectedly (a crash or a kill), "
                f"before its token ids were saved, so it cannot go on exactly; {regenerate}.")
    return (f"Message {message.id} cannot be continued: only a reply that was stopped or hit max "
            f"tokens, with its token ids, goes on; {regenerate}.")


class ContinuationRecorder(ReplyRecorder):
    """Records the continuation of ``message`` (a continuable ``Message`` of ``chats``) into
    that same row: ``text`` starts as its content, the engine's text is appended.

    Raises (from every method that writes): ``storage.errors.StorageError``; see ReplyRecorder.
    """

    def __init__(self, chats, message, model: str, **kw):
        super().__init__(chats, message.conversation_id, message.parent_id, model, **kw)
        self.message_id = message.id
        self.base_text = message.content
        self.base_ids = list(message.token_ids or [])
        self.base_stats = dict(message.stats or {})
        self.text = self._saved_text = message.content
        self._saved_at = self.clock()
        chats.update_message(message.id, status=ReplyState.STREAMING, token_ids=None)

    def complete(self, text: str, token_ids: list[int] | None, stats: dict,
                 reasoning: str | None = None) -> int | None:
        """The continuation ended: the row gets the text so far plus ``text``, the ids so far
        plus ``token_ids``, and ``stats`` of this request with ``generated_tokens`` summed
        (``continued_from``: the tokens the reply had before). Returns the message id."""
        if self.finished:
            return self.message_id
        merged = dict(stats)
        merged["generated_tokens"] = len(self.base_ids) + int(stats.get("generated_tokens", 0))
        merged["continued_from"] = len(self.base_ids)
        ids = self.base_ids + list(token_ids or [])
        cancelled = stats.get("finish_reason") == FinishReason.CANCELLED
        state = ReplyState.STOPPED if cancelled else ReplyState.COMPLETE
        full = self.base_text + text
        self.chats.update_message(self.message_id, content=full, token_ids=ids, stats=merged, status=state)
        self.text, self.stats, self.state = full, merged, state
        return self.message_id

    def abandon(self, state: ReplyState = ReplyState.STOPPED) -> int | None:
        """End early (the engine died, a quit): keep the text; with no new text the row gets
        its ids and stats back, so it can still be continued."""
        if self.finished:
            return self.message_id
        if self.text == self.base_text:
            self.chats.update_message(self.message_id, status=ReplyState.STOPPED, token_ids=self.base_ids,
                                      stats=self.base_stats)
            self.state = ReplyState.STOPPED
            return self.message_id
        return super().abandon(state)
