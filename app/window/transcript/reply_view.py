"""How the window draws a turn: the message sent, the reply streaming into its bubble, the
reply saved. ``ChatController`` decides what happens; this draws it, changing only what
changed.

* Sent: the message's bubble and the reply's empty one are added below the others (the
  transcript is not rebuilt: the request is already on its way, and the first token should
  find the UI thread free). Anything else (an edit, a regeneration, another chat shown) is
  drawn whole by ``ChatController.render``.
* Streaming: text is put in the bubble at most every ``FLUSH_MS``, and at once when none
  was put there for ``FLUSH_MS`` (so the first token is shown as soon as it arrives, not
  on the next tick of a timer).
* Saved: the reply's bubble, now with its actions and figures, takes the place of the
  streaming one; the other bubbles only get their actions back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer

from storage.errors import NotFoundError, StorageError

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

FLUSH_MS = 40


class ReplyView(QObject):
    """The drawing side of ``chat``: on its ``transcript``, from its ``store``. ``flush_timer``
    runs while text waits to be shown (``FLUSH_MS`` after the last flush)."""

    def __init__(self, chat: ChatController):
        super().__init__(chat)
        self.chat = chat
        self.transcript, self.store = chat.transcript, chat.store
        self._dirty = False
        self.flush_timer = QTimer(self, singleShot=True, interval=FLUSH_MS)
        self.flush_timer.timeout.connect(self._tick)

    # -- sent ----------------------------------------------------------------------------

    def show_sent(self, user) -> bool:
        """Draw the sent message ``user`` (a Message) and the reply's empty bubble below the
        bubbles shown, when they show its parent last; False (nothing drawn) otherwise."""
        chat, transcript = self.chat, self.transcript
        shown = transcript.path
        parent = shown[-1] if shown else None
        if (chat.conversation_id != user.conversation_id or chat.shown_leaf != (user.conversation_id, user.parent_id)
                or (parent.id if parent else None) != user.parent_id or (parent is not None and parent.role == "user")
                or transcript.pending is not None):
            return False
        try:
            position = chat.session.sibling_positions([user])[user.id]
        except StorageError:
            return False
        transcript.set_busy(True)
        if transcript.append(user, position) is None:
            return False
        self._pending()
        chat.shown_leaf = (user.conversation_id, user.id)
        chat.load_tree(user.conversation_id, user.id)  # read and laid out off the UI thread
        chat.refresh_title()
        return True

    def _pending(self):
        pending = self.transcript.start_pending()
        self.chat.timeline.watch_paint(pending.stream)  # the streamed text is drawn there, not in .body
        return pending

    def pending_drawn(self) -> None:
        """``ChatController.render`` drew the transcript whole with the reply's bubble."""
        pending = self.transcript.pending
        if pending is not None:
            self.chat.timeline.watch_paint(pending.stream)

    # -- streaming -----------------------------------------------------------------------

    def text_arrived(self) -> None:
        """The reply has new text: show it now when nothing was shown for ``FLUSH_MS``,
        else at the end of that interval."""
        self._dirty = True
        if not self.flush_timer.isActive():
            self._flush()
            self.flush_timer.start()

    def reasoning_arrived(self, text: str) -> None:
        """A piece of a reasoning model's thinking: stored with the reply, shown above it."""
        chat = self.chat
        if chat.reply is None:
            return
        try:
            chat.reply.add_reasoning(text)
        except NotFoundError:  # the chat was deleted meanwhile: its reply is being stopped
            chat.stop()
        except StorageError as exc:
            chat.banner.storage_failed(exc)
        self.text_arrived()

    def _tick(self) -> None:
        if self._dirty:
            self._flush()
            self.flush_timer.start()

    def _flush(self) -> None:
        chat, pending = self.chat, self.transcript.pending
        r = chat.reply
        self._dirty = False
        if r is None or pending is None or r.conversation_id != chat.conversation_id:
            return
        if r.text:
            pending.note.setText("· writing…")
        if r.reasoning and r.reasoning != pending.thought.reasoning:  # a reasoning model's thinking (thought_block.py)
            pending.set_reasoning(r.reasoning)
        pending.set_text(r.text)
        if r.text:
            chat.timeline.mark("shown")

    def stop(self) -> None:
        self.flush_timer.stop()
        self._dirty = False

    # -- saved ---------------------------------------------------------------------------

    def show_saved(self, message_id: int) -> bool:
        """Put the saved reply ``message_id`` in the place of the streaming bubble, when that
        bubble is shown under the reply's parent; False (nothing drawn) otherwise."""
        chat, transcript = self.chat, self.transcript
        shown = transcript.path
        try:
            message = self.store.get_message(message_id)
            if (transcript.pending is None or not shown or shown[-1].id != message.parent_id
                    or chat.conversation_id != message.conversation_id):
                return False
            position = chat.session.sibling_positions([message])[message.id]
        except StorageError:
            return False
        transcript.set_busy(False)
        transcript.replace_pending(message, position)
        chat.load_tree(message.conversation_id, message.id)
        chat.refresh_title()
        chat.shown_idle(transcript.path)  # the path with the reply (not read again)
        return True
