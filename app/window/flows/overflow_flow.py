"""A message that does not fit the context: checked before it is stored, and the choices
that can work when it does not fit (``app.session.overflow``), from the engine's token counts.

Sending: a message that surely fits (``_surely_fits``: the shown path's last count plus
the message's bytes) is stored and answered at once. Any other prompt with the new message
is counted by the engine (its process, not the UI thread) before anything is written. When it fits, the message is stored and answered; when
not, each message is counted and a dialog offers only what can work, and says the largest
context this model and this machine's memory allow. The text goes back to the composer if
the user backs out. A stored message the engine finds too long (an edit, a regeneration, a
count that raced a settings change) gets the same dialog.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from app.session.overflow import OverflowChoices, largest_context, overflow_choices
from engine.events import CountEvent, FinishReason
from engine.machine import memory_bytes
from storage.chats import DEFAULT_SAMPLING
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)

SEND_MARGIN_TOKENS = 64
"""Tokens allowed for a new turn's template around the message (ChatML adds 5-8)."""


class OverflowFlow(QObject):
    """For ``chat`` (the ChatController that owns it; its ``store``, ``settings``, ``model``,
    ``composer``, ``status`` and ``banner`` are used): ``check_send`` before a message is
    stored, ``stored`` after the engine refused a stored one. ``box`` is the dialog while
    shown, over ``parent``. Signal ``settings_requested()``: the user asked for Settings."""

    settings_requested = Signal()

    def __init__(self, chat: ChatController, parent: QWidget):
        super().__init__(chat)
        self.chat, self.parent_widget = chat, parent
        self.store, self.settings, self.model = chat.store, chat.settings, chat.model
        self.composer, self.status, self.banner = chat.composer, chat.status, chat.banner
        self.box: QMessageBox | None = None
        self.checking = None  # the count request of a message being sent
        self.stopped = False  # Esc or Stop was pressed while counting
        self._sending: tuple = ()  # (conversation id, text, new chat settings) being counted
        self.attachments = None  # the composer's files (AttachFlow): rendered into the message
        self.document_search = None  # "Search the document" (DocumentSearch), offered when they do not fit

    # -- before storing ---------------------------------------------------------------------

    def check_send(self, cid: int | None, text: str, new_chat: tuple[str, dict] | None) -> None:
        """Count the prompt with ``text`` under the active leaf of ``cid`` (None: a new chat
        with ``new_chat``'s settings); store and answer it when it fits."""
        system = new_chat[0] if cid is None and new_chat else ""
        files = self.attachments
        if files is not None and not files.ready_to_send():  # a file still being read: the text stays
            self.composer.set_text(text)
            return
        if self._surely_fits(cid, files.rendered(text) if files is not None else text, system):  # no round trip to the engine before the reply
            self.chat.store_and_reply(cid, text, new_chat)
            return
        try:
            messages, ids = self.chat.session.prompt_for_send(cid, text, system, self.chat.shown_prompt.current())
        except StorageError as exc:
            self.composer.set_text(text)
            self.banner.storage_failed(exc)
            return
        handle = self.model.client.count(messages)
        if handle is None:  # the engine is gone: keep the text
            self.composer.set_text(text)
            return
        self.checking, self._sending = handle, (cid, text, new_chat)
        self._busy(True, len(text))
        handle.done.connect(lambda e: self._counted(handle, cid, text, new_chat, messages, ids, e))
        handle.failed.connect(lambda e: self._count_failed(handle, cid, text, new_chat, e))

    def _surely_fits(self, cid: int | None, text: str, system: str) -> bool:
        """True when the prompt with ``text`` fits without counting it: the shown path's last
        count (or the system prompt of a new chat, by its UTF-8 bytes) plus ``text``'s UTF-8
        bytes plus ``SEND_MARGIN_TOKENS`` is under the context. A token of text covers at
        least one byte (byte-level BPE, SentencePiece with byte fallback); the margin covers
        the template's role headers and a leading-space marker. Should a template add more,
        the engine still refuses the stored prompt and ``stored`` offers the same choices."""
        if cid is None:
            known = len(system.encode("utf-8"))
        else:
            counted = self.chat.figures.counted_path
            try:
                leaf = self.store.get_conversation(cid).active_leaf_id
            except StorageError:
                return False
            if counted is None or counted[:2] != (cid, leaf):
                return False
            known = counted[2]
        return known + len(text.encode("utf-8")) + SEND_MARGIN_TOKENS < self.chat.figures.n_ctx()

    def engine_gone(self) -> None:
        """The engine died while counting: the message is kept, unanswered (Retry answers it
        once the engine is restarted), as a message whose reply was cut short is."""
        if self.checking is None:
            return
        self.checking = None
        self._busy(False)
        cid, text, new_chat = self._sending
        if (user_id := self.chat.store_message(cid, text, new_chat)) is not None:
            if self.stopped:  # Stop had been pressed (the watchdog ended the engine)
                self._stopped_reply(user_id)
            self.chat.render()

    def stop(self) -> None:
        """Esc or Stop while counting: the message is stored unanswered (with Retry) when it
        fits, put back in the composer when it does not; no reply is generated."""
        if self.checking is not None:
            self.stopped = True

    def _busy(self, busy: bool, chars: int = 0) -> None:
        if not busy:
            self.chat.watchdog.settle()
        self.composer.set_streaming(busy)  # Stop (and Esc) stop the send
        if busy:
            self.stopped = False
            self.status.stats_label.setText(f"Counting tokens ({chars:,} characters)…" if chars > 20_000
                                            else "Counting tokens…")
        else:
            self.status.stats_label.setText("")
            focus = QApplication.focusWidget()  # back to the message box, unless the user moved on
            if focus is None or focus is self.composer or self.composer.isAncestorOf(focus):
                self.composer.input.setFocus()

    def _counted(self, handle, cid, text, new_chat, messages, ids, event: CountEvent) -> None:
        if handle is not self.checking:
            return
        n_ctx = event.n_ctx or self.chat.figures.n_ctx()
        fits = event.prompt_tokens + 1 <= n_ctx or not event.n_ctx  # a remote engine counts nothing
        if fits or self.stopped:
            self.checking = None
            self._busy(False)
            if not self.stopped:
                self.chat.store_and_reply(cid, text, new_chat)
                return
            reply_id = None
            if not fits:
                self.composer.set_text(text)
            elif (user_id := self.chat.store_message(cid, text, new_chat)) is not None:
                reply_id = self._stopped_reply(user_id)
                self.chat.render()  # "Stopped before the first token", with Retry
            self.chat.reply_finished.emit(reply_id or 0)
            return
        self.status.set_context(event.prompt_tokens, n_ctx)
        per = self.model.client.count(messages, per_message=True)
        if per is None:
            self.checking = None
            self._busy(False)
            self.composer.set_text(text)
            return
        self.checking = per
        per.done.connect(lambda e: self._counted_each(per, cid, text, new_chat, ids, e))
        per.failed.connect(lambda e: self._count_failed(per, cid, text, new_chat, e))

    def _stopped_reply(self, user_id: int) -> int | None:
        """Esc before the first token, here while counting: the same empty STOPPED reply the
        engine's "cancelled" answer leaves (``ReplyRecorder.complete``)."""
        try:
            reply = self.chat.session.start_reply(user_id, self.model.label)
            return reply.complete("", None, {"finish_reason": FinishReason.CANCELLED})
        except StorageError as exc:
            self.banner.storage_failed(exc)
            return None

    def _counted_each(self, handle, cid, text, new_chat, ids, event: CountEvent) -> None:
        if handle is not self.checking:
            return
        self.checking = None
        self._busy(False)
        sampling = new_chat[1] if cid is None and new_chat else self._sampling(cid)
        self._dialog(list(event.message_tokens), ids, event.n_ctx or self.chat.figures.n_ctx(), sampling,
                     unsent=(cid, text, new_chat))

    def _count_failed(self, handle, cid, text, new_chat, event) -> None:
        if handle is not self.checking:
            return
        self.checking = None
        self._busy(False)
        log.info("count before sending failed (%s); sending without it", event.message)
        self.chat.store_and_reply(cid, text, new_chat)  # the engine checks again while generating

    # -- after the engine refused a stored message --------------------------------------------

    def stored(self, user_message_id: int, n_ctx: int) -> None:
        """The engine found the prompt for the stored ``user_message_id`` too long."""
        try:
            messages, ids = self.chat.session.prompt_with_ids(user_message_id)
            sampling = self._sampling(self.store.get_message(user_message_id).conversation_id)
        except StorageError as exc:
            self.banner.storage_failed(exc)
            return
        handle = self.model.client.count(messages, per_message=True)
        if handle is None:
            return
        handle.done.connect(lambda e: self._dialog(list(e.message_tokens), ids, e.n_ctx or n_ctx, sampling,
                                                   stored=user_message_id))

    # -- the dialog ---------------------------------------------------------------------------

    def _sampling(self, cid: int | None) -> dict:
        try:
            return dict(self.store.get_conversation(cid).sampling) if cid is not None else {}
        except StorageError:
            return {}

    def limits(self, n_ctx: int) -> tuple[int, int, int]:
        """(largest context, trained context, the memory's limit) in tokens (0: unknown)."""
        facts = self.model.facts or {}
        trained, kvb = int(facts.get("context_length") or 0), int(facts.get("kv_bytes_per_token") or 0)
        available = memory_bytes()[1]
        return (largest_context(trained, kvb, n_ctx, available), trained,
                largest_context(0, kvb, n_ctx, available))

    def _dialog(self, tokens: list[int], ids: list, n_ctx: int, sampling: dict, unsent=None, stored=None) -> None:
        if not tokens:
            if unsent:
                self.composer.set_text(unsent[1])
            return
        max_tokens = int(sampling.get("max_tokens") or DEFAULT_SAMPLING["max_tokens"])
        largest, trained, by_memory = self.limits(n_ctx)
        has_system = len(ids) > 1 and ids[0] is None  # the new message (last) has no id either
        c = overflow_choices(tokens, has_system, n_ctx, max_tokens, largest)
        docs = self.attachments.document_tokens() if unsent and self.attachments and self.attachments.ready else None
        searchable = unsent is not None and bool(self.attachments and self.attachments.ready) and self.document_search
        if searchable:  # a new branch would leave the files behind: search them, or a larger context
            c = dataclasses.replace(c, can_branch=False)
        costs = {mid: t for mid, t in zip(ids, tokens) if mid is not None}
        self.status.set_context(c.prompt_tokens, n_ctx)
        box = QMessageBox(self.parent_widget)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setWindowTitle("This message is too long" if unsent else "This chat is too long")
        what = "With this message, the chat is" if len(tokens) > 1 else "This message is"
        box.setText(f"{what} {c.prompt_tokens:,} tokens; the context holds {n_ctx:,}."
                    + (f" The attached files take {docs:,} of them." if docs else ""))
        advice = self._advice(c, trained, by_memory, bool(unsent)).split("\n\n")
        if searchable:  # the search can make it fit: not "nothing can"
            advice = [line for line in advice if not line.startswith("Nothing can make it fit")] + [
                "Search the document sends only the passages that best match your question, each with its file "
                "and page, instead of the whole text."]
        box.setInformativeText("\n\n".join(advice))
        search_b = box.addButton("Search the document", QMessageBox.ButtonRole.ActionRole) if searchable else None
        branch = box.addButton("Continue on a new branch", QMessageBox.ButtonRole.AcceptRole) if c.can_branch else None
        raise_b = (box.addButton(f"Raise context to {c.raise_to:,}", QMessageBox.ButtonRole.ActionRole)
                   if c.raise_to else None)
        back = box.addButton("Edit the message" if unsent else "Close", QMessageBox.ButtonRole.RejectRole)
        box.setEscapeButton(back)

        def chosen(button) -> None:
            self.box = None
            if button is back or button is None:
                if unsent:
                    self.composer.set_text(unsent[1])
                return
            if button is search_b:
                self.document_search.start(unsent, n_ctx, c.prompt_tokens, max_tokens)
                return
            user_id = stored
            if unsent:
                user_id = self.chat.store_message(*unsent)
                if user_id is None:
                    return
            if button is branch:
                self.branch_dropping_oldest(user_id, n_ctx, costs)
            elif button is raise_b:
                self.settings.update(n_ctx=c.raise_to)
                self.model.after_load = lambda: self.chat.start_reply(user_id)
                self.model.reload()

        box.buttonClicked.connect(chosen)
        self.box = box
        box.open()

    def branch_dropping_oldest(self, user_message_id: int, n_ctx: int, costs: dict[int, int] | None = None) -> None:
        """"Continue on a new branch" (``ConversationSession.branch_dropping_oldest``) and answer."""
        chat = self.chat
        new_parent = chat.session.branch_dropping_oldest(user_message_id, n_ctx, costs)
        if new_parent is None:
            self.banner.show_message("The newest message alone does not fit the context window; raise the "
                                     "context size in Settings or shorten the message.", "error",
                                     [("Settings…", self.settings_requested.emit)], chat_id=chat.conversation_id)
            return
        chat.render()
        chat.start_reply(new_parent)

    @staticmethod
    def _advice(c: OverflowChoices, trained: int, by_memory: int, unsent: bool) -> str:
        lines = []
        if c.largest_n_ctx:
            why = [f"the model was trained for {trained:,}" if trained else "",
                   f"this computer's free memory holds about {by_memory:,}" if by_memory else ""]
            lines.append(f"The largest context this model and this computer's memory allow is "
                         f"{c.largest_n_ctx:,} tokens ({'; '.join(x for x in why if x)}).")
        if c.can_branch:
            lines.append("Continue on a new branch keeps the system prompt and the newest turns that fit.")
        if c.raise_to:
            lines.append(f"Raising the context to {c.raise_to:,} reloads the model and uses more memory.")
        if not c.can_branch and not c.raise_to:
            alone = f"the newest message with the system prompt is {c.newest_tokens:,} tokens" \
                if c.newest_tokens != c.prompt_tokens else "no context this machine allows can hold it"
            lines.append(f"Nothing can make it fit: {alone}. Shorten the message or split it into parts"
                         + (", then send it." if unsent else ", then edit it."))
        return "\n\n".join(lines)
