"""The shown conversation and the reply being generated: the window's side of ``app.session``.

``ChatController`` turns the transcript's, composer's and tree's requests (send, edit,
regenerate, retry, fork, switch sibling) into ``ConversationSession`` calls, starts
replies on the engine and feeds their events to a ``ReplyRecorder``. Nothing here waits
on the engine: a sent message's request goes first and the message is stored right after
(``store_and_reply``); ``ReplyView`` (reply_view.py) draws what changed and the streamed
text (the first at once, then at most every ``FLUSH_MS``); the recorder writes it to
``chats.sqlite3`` at most every half second, so a crash loses at most that much text;
a stop, a quit or a dead engine saves the partial reply as "stopped". ``timeline``
(send_timeline.py) marks where the time goes from Enter to the first text painted.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, QTimer, Signal

from app.session import ConversationSession, ReplyRecorder, ReplyState
from app.window.engine_client import PendingRequest
from app.window.model_controller import ModelState
from app.window.path_figures import PathFigures
from app.window.reply_view import ReplyView
from app.window.send_timeline import SendTimeline
from app.window.stop_watchdog import StopWatchdog
from app.window.unanswered import ask_unanswered
from engine.events import DoneEvent, ErrorEvent, ErrorKind, SnapshotEvent
from storage.errors import NotFoundError, StorageError

log = logging.getLogger(__name__)

EMPTY_TEXT = ("<h2>Branchwise</h2><p>Ask anything. Every reply is a branch you can edit, "
              "regenerate or fork,<br>and resuming a chat restores its KV cache instantly.</p>")


class ChatController(QObject):
    """The conversation shown in ``window`` (a MainWindow) and its streaming reply.

    Signals: reply_finished(message id, 0 when nothing was stored), coverage_ready(),
    path_shown() (a path was drawn with no reply streaming: the next prompt may start there).
    """

    reply_finished = Signal(int)
    coverage_ready = Signal()
    path_shown = Signal()

    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.session = ConversationSession(window.store)
        self.conversation_id: int | None = None
        self.reply: ReplyRecorder | None = None
        self._request: PendingRequest | None = None
        self._stopping = False
        self.shown_leaf: tuple[int, int | None] | None = None  # (chat, last message) as last drawn
        self._new_chat: tuple[str, dict] | None = None  # set in Settings before a new chat's first message
        self.figures = PathFigures(self)  # the context figure and the tree's coverage
        self.view = ReplyView(self)
        self.timeline = SendTimeline(self)
        # the watchdog behind Stop: offer to end a slow engine, then end one that never answers
        self.watchdog = StopWatchdog(window, self._stop_unanswered)

    @property
    def streaming(self) -> bool:
        return self.reply is not None

    @property
    def flush_timer(self) -> QTimer:
        """The streamed text's paint timer (``ReplyView.flush_timer``; tests)."""
        return self.view.flush_timer

    # -- showing -------------------------------------------------------------------------

    def show_conversation(self, conversation_id: int | None) -> None:
        self.conversation_id = conversation_id
        self.w.sidebar.set_current(conversation_id)
        self.render()
        self.figures.refresh_coverage()

    def render(self) -> None:
        """Re-read the shown conversation and redraw the transcript, tree and status."""
        w, cid, busy = self.w, self.conversation_id, self.streaming
        if cid is None:
            w.transcript.set_messages([], {}, w.colors, busy, EMPTY_TEXT)
            w.tree.set_tree([], set(), w.colors)
            w.refresh_title()
            self.figures.update_context_label()
            w.status.show_stats(None)
            if not busy:
                self.path_shown.emit()
            return
        path = self.session.shown_path(cid, self.reply)
        self.shown_leaf = (cid, path[-1].id if path else None)
        streaming_here = busy and self.reply.conversation_id == cid
        unanswered = None if busy else self.session.unanswered(cid, path)  # path: the active one when not busy
        w.transcript.set_messages(path, self.session.sibling_positions(path), w.colors, busy, EMPTY_TEXT,
                                  unanswered_id=unanswered)
        if streaming_here:
            pending = w.transcript.start_pending()
            if self.reply.text:
                pending.set_text(self.reply.text)
            self.view.pending_drawn()
        self.load_tree(cid, path[-1].id if path else None)
        w.refresh_title()
        if not busy:  # else the reply owns the status line until it ends
            self.shown_idle(path)

    def load_tree(self, cid: int, leaf_id: int | None) -> None:
        """Draw the tree of chat ``cid`` with the path up from ``leaf_id`` active: read and laid
        out off the UI thread (in proportion to the conversation), drawn when it arrives."""
        self.w.tree.load(cid, leaf_id, self.w.colors, lambda exc: self.w.chat_unshowable(cid, exc))

    def shown_idle(self, path) -> None:
        """``path`` (the active one) is drawn and no reply streams: the status line, the
        context figure, and ``path_shown`` (the next prompt may start there)."""
        w = self.w
        self.shown_leaf = (self.conversation_id, path[-1].id if path else None)
        last = next((m for m in reversed(path) if m.role == "assistant"), None)
        w.status.show_stats(last.stats if last else None, saved=True)
        if w.model.state == ModelState.READY:  # the exact figure, asynchronously; sending a long
            QTimer.singleShot(0, self, self.figures.request_context_count)  # prompt to the engine waits a beat
        else:  # no engine to ask: the saved figures of the leaf reply, if it has them
            self.figures.update_context_label(path[-1].stats if path and path[-1].role == "assistant" else None)
        self.path_shown.emit()

    def new_chat_settings(self) -> tuple[str, dict]:
        """(system prompt, sampling) the next new chat starts with: what Settings set for it,
        else the app-wide defaults for new chats."""
        s = self.w.settings
        return self._new_chat or (s.default_system_prompt, dict(s.default_sampling))

    def set_new_chat_settings(self, system_prompt: str, sampling: dict) -> None:
        self._new_chat = (system_prompt, dict(sampling))

    def engine_gone(self) -> None:
        """The engine process ended: in-flight requests will not be answered."""
        self.figures.engine_gone()
        self.w.overflow_flow.engine_gone()
        if self.reply is not None:
            self.abandon(ReplyState.STOPPED)

    # -- changing the conversation ---------------------------------------------------------

    def can_generate(self) -> bool:
        w = self.w
        if self.streaming:
            return False
        state = w.model.state
        if state == ModelState.READY:
            return True
        if state == ModelState.LOADING:
            w.banner.show_message("The model is still loading; send again in a moment.", "info")
        elif state == ModelState.DEAD:
            w.banner.show_message("The engine is not running.", "error", [("Restart engine", w.restart_engine)])
        else:
            w.banner.show_message("No model is loaded. Open a GGUF model file to chat.", "error",
                                  [("Open model…", w.open_model_dialog), ("Load default model", lambda: w.load_model(None))])
        return False

    def send(self, text: str) -> None:
        """Send ``text`` under the active leaf: counted first (``OverflowFlow.check_send``),
        then stored and answered, or the overflow choices are offered. When the branch ends on
        a question with no answer, ask first (``ask_unanswered``)."""
        self.timeline.start()
        if not self.can_generate() or self.w.overflow_flow.checking is not None:
            self.w.composer.set_text(text)
            return
        if self.w.changed_elsewhere(text):  # the branch moved since it was drawn: redrawn, text kept
            return
        pending = self.session.unanswered_leaf(self.conversation_id) if self.conversation_id else None
        if pending is not None:
            self.w.unanswered_box = ask_unanswered(self.w, pending, text, self)
            return
        new_chat = self.new_chat_settings() if self.conversation_id is None else None
        self.w.overflow_flow.check_send(self.conversation_id, text, new_chat)

    def store(self, cid: int | None, text: str, new_chat: tuple[str, dict] | None = None,
              parent_id: int | None = None) -> int | None:
        """Store ``text`` as a user message under ``parent_id`` (default: the active leaf) of
        ``cid`` (None: a new chat with ``new_chat``'s settings); its id, or None (the text is
        put back in the composer) when it cannot be stored."""
        try:
            user = self.session.send(cid, text, parent_id, new_chat=new_chat)
        except (StorageError, ValueError) as exc:
            self.w.composer.set_text(text)
            self.w.banner.show_message(f"Your message could not be saved: {exc}", "error")
            return None
        if cid is None:
            self._new_chat = None
        self.conversation_id = user.conversation_id
        self.w.sidebar.set_current(self.conversation_id)
        return user.id

    def store_and_reply(self, cid: int | None, text: str, new_chat: tuple[str, dict] | None = None) -> None:
        """Store ``text`` (``store``) and generate the reply, if the model is still ready.

        In a chat that exists, the request goes first (read with ``ConversationSession.send_plan``)
        and the message is stored right after, in the same call: the engine starts while the
        database writes, and no event (no token, no crash report) is handled in between, so
        the message is as safe as when stored first. If it cannot be stored, the request is
        cancelled and the text goes back to the composer. With the engine gone, the message
        is stored and shown unanswered (Retry answers it)."""
        if not self.can_generate():
            self.w.composer.set_text(text)
            return
        plan, handle = None, None
        if cid is not None:
            try:
                plan = self.session.send_plan(cid, text)
            except StorageError:
                plan = None  # ``store`` says why
        if plan is not None:
            self.timeline.mark("request")
            handle = self.w.client.generate(plan.messages, plan.sampling, use_cache=self.w.use_cache)
        user_id = self.store(cid, text, new_chat, plan.parent_id if plan else None)
        if user_id is None:
            if handle is not None:
                self.w.client.cancel(handle)
            return
        self.timeline.mark("stored")
        if plan is None:  # a new chat: its request once it exists
            handle = self._request_reply(user_id)
        if handle is None:
            self.render()
            return
        self.start_reply(user_id, handle)

    def edit(self, message_id: int, text: str) -> None:
        if self.can_generate():
            self.start_reply(self.session.edit(message_id, text).id)

    def regenerate(self, message_id: int) -> None:
        """A new sibling of an assistant reply; on a user message, a reply under it (retry);
        an empty reply stopped before its first token is replaced (``ConversationSession.retry``)."""
        if self.can_generate():
            self.start_reply(self.session.retry(message_id))

    def switch_sibling(self, message_id: int, delta: int) -> None:
        if not self.streaming and self.session.switch_sibling(message_id, delta):
            self.render()

    def select(self, message_id: int) -> None:
        if not self.streaming:
            self.session.select(message_id)
            self.render()

    def fork(self, message_id: int) -> None:
        if self.streaming:
            return
        conv = self.session.fork(message_id)
        self.show_conversation(conv.id)
        self.w.banner.show_message(f"Forked into a new chat, “{conv.title}”. Its KV cache is shared.", "info",
                                   chat_id=conv.id)

    def last_message_id(self) -> int | None:
        if self.conversation_id is None:
            return None
        path = self.w.store.active_path(self.conversation_id)
        return path[-1].id if path else None

    # -- one reply -----------------------------------------------------------------------

    def _request_reply(self, user_message_id: int) -> PendingRequest | None:
        """Send the request for a reply under ``user_message_id`` (None: the engine is gone)."""
        w = self.w
        cid = w.store.get_message(user_message_id).conversation_id
        sampling, messages = w.store.get_conversation(cid).sampling, self.session.prompt(user_message_id)
        self.timeline.mark("request")
        return w.client.generate(messages, dict(sampling), use_cache=w.use_cache)

    def start_reply(self, user_message_id: int, handle: PendingRequest | None = None) -> None:
        """Generate a new assistant reply (a new child) under the user message ``user_message_id``;
        ``handle``: its request, when already sent (``store_and_reply``)."""
        w = self.w
        if self.streaming:
            return
        if handle is None:
            self.timeline.start()
            handle = self._request_reply(user_message_id)
            if handle is None:
                return
        user = w.store.get_message(user_message_id)
        self.reply = self.session.start_reply(user.id, w.model.label)
        self._request, self._stopping = handle, False
        handle.token.connect(self._token)
        handle.progress.connect(lambda phase, done, total: w.status.reply_progress(phase, done, total))
        handle.done.connect(lambda e, r=self.reply: self._done(r, e))
        handle.snapshot.connect(lambda e, r=self.reply: self._snapshot(r, e))
        handle.failed.connect(lambda e, r=self.reply: self._failed(r, e))
        if self.conversation_id != user.conversation_id:
            self.conversation_id = user.conversation_id
            w.sidebar.set_current(user.conversation_id)
        w.sidebar.busy_id = user.conversation_id
        w.composer.set_streaming(True)
        w.status.stats_label.setText("Thinking…")
        if not self.view.show_sent(user):  # only the new bubbles, else the whole transcript
            self.render()
        self.timeline.mark("drawn")

    def stop(self) -> None:
        """Cancel the reply; the engine answers with ``done`` (finish_reason "cancelled")."""
        counting = self.w.overflow_flow.checking is not None and not self.w.overflow_flow.stopped
        self.w.overflow_flow.stop()  # a message still being counted is not answered
        if counting:
            self.watchdog.start()
        if self._request is not None and not self._stopping:
            self._stopping = True
            self.w.status.stats_label.setText("Stopping…")
            self.w.client.cancel(self._request)
            self.watchdog.start()

    def _stop_unanswered(self) -> bool:
        """True while Stop waits for the engine: a reply being cancelled, or a count."""
        flow = self.w.overflow_flow
        return (self._request is not None and self._stopping) or (flow.checking is not None and flow.stopped)

    def _token(self, text: str) -> None:
        if not self.reply.text and not self._stopping:
            self.w.status.stats_label.setText("Writing…")  # the first token: no longer "Thinking…"
            self.timeline.mark("token_read", self._request.first_token_read_at)
            self.timeline.mark("token")
        try:
            self.reply.add_text(text)
        except NotFoundError:  # the chat was deleted meanwhile: its reply is being stopped
            self.stop()
        except StorageError as exc:
            self.w.storage_failed(exc)
        self.view.text_arrived()

    def _end(self) -> ReplyRecorder | None:
        r, self.reply, self._request = self.reply, None, None
        self.view.stop()
        self.watchdog.settle()
        self.w.status.progress.hide()
        self.w.composer.set_streaming(False)
        self.w.sidebar.busy_id = None
        return r

    def _done(self, reply: ReplyRecorder, event: DoneEvent) -> None:
        if reply is not self.reply:
            return
        self._end()
        mid = None
        try:
            mid = reply.complete(event.text, event.token_ids, event.stats)
        except NotFoundError:  # the chat was deleted meanwhile: nothing of it is kept
            log.info("the reply's chat %s was deleted while it was written; nothing kept", reply.conversation_id)
        except StorageError as exc:
            self.w.storage_failed(exc)
        if reply.conversation_id == self.conversation_id and not (mid and self.view.show_saved(mid)):
            self.render()  # the saved reply replaces its streaming bubble, else all is drawn again
        self.w.status.show_stats(event.stats)
        self.figures.update_context_label(event.stats)
        self.w.sidebar.refresh()
        log.debug("send timeline: %s", self.timeline.describe(event.stats))
        self.reply_finished.emit(mid or 0)

    def _snapshot(self, reply: ReplyRecorder, event: SnapshotEvent) -> None:
        try:
            reply.add_snapshot(event.snapshot_ms, event.bytes_written)
        except StorageError as exc:
            log.warning("could not save the snapshot figures: %s", exc)
        self.figures.refresh_coverage()

    def _failed(self, reply: ReplyRecorder, event: ErrorEvent) -> None:
        if reply is not self.reply:  # e.g. the snapshot failed after the reply was saved
            log.warning("after the reply: %s", event.message)
            return
        parent = reply.parent_id
        self.abandon(ReplyState.ERROR)
        if event.kind == ErrorKind.OVERFLOW:
            self.w.overflow_flow.stored(parent, event.n_ctx)
        else:
            self.w.banner.show_message(event.message or "The engine could not do that.", "error",
                                       chat_id=reply.conversation_id)

    def abandon(self, state: ReplyState) -> None:
        """Save what was streamed so far (marked ``state``) and forget the request."""
        reply = self._end()
        if reply is None:
            return
        try:
            reply.abandon(state)
        except StorageError as exc:
            log.error("could not save the partial reply: %s", exc)
        if not self.w.closed:
            if reply.conversation_id == self.conversation_id:
                self.render()
            self.reply_finished.emit(reply.message_id or 0)

    def shutdown(self) -> None:
        """Save a reply in progress as stopped and stop the engine (cancelling it first)."""
        request = self._request
        if self.reply is not None:
            self.abandon(ReplyState.STOPPED)
        self.w.client.stop(cancel=request)

    # -- context overflow ----------------------------------------------------------------

    def branch_dropping_oldest(self, user_message_id: int, n_ctx: int, costs: dict[int, int] | None = None) -> None:
        """"Continue on a new branch" (``ConversationSession.branch_dropping_oldest``) and answer."""
        new_parent = self.session.branch_dropping_oldest(user_message_id, n_ctx, costs)
        if new_parent is None:
            self.w.banner.show_message("The newest message alone does not fit the context window; raise the "
                                       "context size in Settings or shorten the message.", "error",
                                       [("Settings…", self.w.open_settings)], chat_id=self.conversation_id)
            return
        self.render()
        self.start_reply(new_parent)
