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

A send, step by step: ``send`` checks that a reply can start (``can_generate``), that the
branch did not move since it was drawn (else ``changed_elsewhere`` is emitted and the
``Navigator`` redraws it, the text kept), and that the branch does not end on a question
with no answer (``ask_unanswered``); then ``self.overflow`` (an ``OverflowFlow``) counts the
prompt when it may not fit and calls ``store_and_reply``, which sends the request and stores
the message. What the controller does not own it says by signal: the sidebar follows
``current_changed`` and ``busy_changed``, the window's title ``title_changed``.
"""

from __future__ import annotations

import contextlib
import logging

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from app.session import ConversationSession, ReplyRecorder, ReplyState
from app.window.flows.model_controller import ModelController, ModelState
from app.window.flows.overflow_flow import OverflowFlow
from app.window.flows.stop_watchdog import StopWatchdog
from app.window.flows.tool_flow import ToolFlow
from app.window.flows.unanswered import ask_unanswered, refuse_while_written
from app.window.settings.settings_model import SettingsModel
from app.window.shell.banner import Banner
from app.window.shell.lifetime import Lifetime
from app.window.shell.look import Look
from app.window.shell.status_bar import StatusBar
from app.window.transcript.composer import Composer
from app.window.transcript.path_figures import PathFigures
from app.window.transcript.reply_view import ReplyView
from app.window.transcript.send_timeline import SendTimeline
from app.window.transcript.transcript_view import TranscriptView, is_first_turn
from app.window.tree.tree_panel import TreePanel
from app.window.workers.chat_reader import ChatReader
from app.window.workers.engine_client import PendingRequest
from app.window.workers.shown_prompt import ShownPrompt
from engine.events import DoneEvent, ErrorEvent, ErrorKind, SnapshotEvent
from storage.chats import ChatStore
from storage.errors import NotFoundError, StorageError

log = logging.getLogger(__name__)

EMPTY_TEXT = ("<h2>Branchwise</h2><p>Ask anything. Every reply is a branch you can edit, "
              "regenerate or fork,<br>and resuming a chat restores its KV cache instantly.</p>")


class ChatController(QObject):
    """The conversation shown in the transcript and its streaming reply.

    Collaborators: ``store``, ``settings`` (new chats' defaults), ``model`` (its state, label and ``client``),
    ``reader`` and ``look`` (the tree panel's layout and colors), ``lifetime`` (nothing is drawn once the
    window closes), the widgets it draws on (``transcript``, ``tree``, ``composer``, ``status``, ``banner``)
    and ``parent`` (its dialogs' parent). ``use_cache``: False generates without the prefix store.

    Signals: reply_finished(message id, 0 when nothing was stored), coverage_ready(), path_shown() (a path
    was drawn with no reply streaming: the next prompt may start there), current_changed(conversation id or
    None), busy_changed(the id of the chat a reply streams in, or None), chats_changed() (a reply was saved:
    the list's order may change), title_changed(window title), changed_elsewhere(conversation id, text) (a
    send found the branch moved since it was drawn), unshowable(conversation id, exception) (its tree could
    not be laid out). ``tools`` (a ``ToolFlow``) runs the MCP tool loop after each saved reply.
    """

    reply_finished = Signal(int)
    coverage_ready = Signal()
    path_shown = Signal()
    current_changed = Signal(object)
    busy_changed = Signal(object)
    chats_changed = Signal()
    title_changed = Signal(str)
    changed_elsewhere = Signal(int, str)
    unshowable = Signal(int, object)

    def __init__(self, *, store: ChatStore, settings: SettingsModel, model: ModelController, reader: ChatReader,
                 look: Look, lifetime: Lifetime, transcript: TranscriptView, tree: TreePanel, composer: Composer,
                 status: StatusBar, banner: Banner, parent: QWidget, use_cache: bool = True):
        super().__init__(parent)
        self.store, self.settings, self.model, self.look, self.lifetime = store, settings, model, look, lifetime
        self.transcript, self.tree, self.composer, self.status, self.banner = transcript, tree, composer, status, banner
        self.use_cache = use_cache
        self.client = model.client  # one EngineClient for the window's life (its process restarts inside)
        self.session = ConversationSession(store)
        self.conversation_id: int | None = None
        self.reply: ReplyRecorder | None = None
        self._request: PendingRequest | None = None
        self._stopping = False
        self.shown_leaf: tuple[int, int | None] | None = None  # (chat, last message) as last drawn
        self._new_chat: tuple[str, dict] | None = None  # set in Settings before a new chat's first message
        self.unanswered_box: QMessageBox | None = None  # "Your last message has no reply" while it is shown
        self.figures = PathFigures(self, reader)  # the context figure and the tree's coverage
        self.shown_prompt = ShownPrompt(self, reader, self)  # the branch's prompt, read off the UI thread
        self.view = ReplyView(self)
        self.timeline = SendTimeline(self)
        # the watchdog behind Stop: offer to end a slow engine, then end one that never answers
        self.watchdog = StopWatchdog(banner, self.client, self._stop_unanswered, self)
        self.overflow = OverflowFlow(self, parent)  # counts a send that may not fit, offers the choices
        self.tools = ToolFlow(self, settings, lambda: self.model.facts or {}, parent)  # the MCP tool loop

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
        self.current_changed.emit(conversation_id)
        self.render()
        self.figures.refresh_coverage()

    def render(self) -> None:
        """Re-read the shown conversation and redraw the transcript, tree and status."""
        cid, busy, colors = self.conversation_id, self.streaming, self.look.colors
        if cid is None:
            self.transcript.set_messages([], {}, colors, busy, EMPTY_TEXT)
            self.tree.set_tree([], set(), colors)
            self.refresh_title()
            self.figures.update_context_label()
            self.status.show_stats(None)
            if not busy:
                self.path_shown.emit()
            return
        path = self.session.shown_path(cid, self.reply)
        self.shown_leaf = (cid, path[-1].id if path else None)
        streaming_here = busy and self.reply.conversation_id == cid
        unanswered = None if busy else self.session.unanswered(cid, path)  # path: the active one when not busy
        self.transcript.set_messages(path, self.session.sibling_positions(path), colors, busy, EMPTY_TEXT,
                                     unanswered_id=unanswered)
        if streaming_here:
            pending = self.transcript.start_pending()
            if self.reply.text:
                pending.set_text(self.reply.text)
            self.view.pending_drawn()
        self.load_tree(cid, path[-1].id if path else None)
        self.refresh_title()
        if not busy:  # else the reply owns the status line until it ends
            self.shown_idle(path)

    def load_tree(self, cid: int, leaf_id: int | None) -> None:
        """Draw the tree of chat ``cid`` with the path up from ``leaf_id`` active: read and laid
        out off the UI thread (in proportion to the conversation), drawn when it arrives."""
        self.tree.load(cid, leaf_id, self.look.colors, lambda exc: self.unshowable.emit(cid, exc))

    def refresh_title(self) -> None:
        """Emit ``title_changed`` with the shown chat's title ("… — Branchwise")."""
        title = "Branchwise"
        if self.conversation_id is not None:
            try:
                title = f"{self.store.get_conversation(self.conversation_id).title} — Branchwise"
            except StorageError:
                pass
        self.title_changed.emit(title)

    def shown_idle(self, path) -> None:
        """``path`` (the active one) is drawn and no reply streams: the status line, the
        context figure, and ``path_shown`` (the next prompt may start there)."""
        self.shown_leaf = (self.conversation_id, path[-1].id if path else None)
        last = next((m for m in reversed(path) if m.role == "assistant"), None)
        self.status.show_stats(last.stats if last else None, saved=True, first_turn=bool(last) and is_first_turn(path, last))
        if self.model.state == ModelState.READY:  # the exact figure, asynchronously; sending a long
            QTimer.singleShot(0, self, self.figures.request_context_count)  # prompt to the engine waits a beat
        else:  # no engine to ask: the saved figures of the leaf reply, if it has them
            self.figures.update_context_label(path[-1].stats if path and path[-1].role == "assistant" else None)
        self.path_shown.emit()

    def new_chat_settings(self) -> tuple[str, dict]:
        """(system prompt, sampling) the next new chat starts with: what Settings set for it,
        else the app-wide defaults for new chats."""
        s = self.settings
        return self._new_chat or (s.default_system_prompt, dict(s.default_sampling))

    def set_new_chat_settings(self, system_prompt: str, sampling: dict) -> None:
        self._new_chat = (system_prompt, dict(sampling))

    def engine_gone(self) -> None:
        """The engine process ended: in-flight requests will not be answered."""
        self.figures.engine_gone()
        self.overflow.engine_gone()
        if self.reply is not None:
            self.abandon(ReplyState.STOPPED)

    # -- changing the conversation ---------------------------------------------------------

    def can_generate(self, held: str = "") -> bool:
        """Whether a reply can start now; when not, the banner says why
        (``ModelController.say_not_ready``; ``held``: what of the user's is kept meanwhile)."""
        if self.streaming:
            return False
        if self.model.state == ModelState.READY:
            return True
        self.model.say_not_ready(held)
        return False

    def send(self, text: str) -> None:
        """Send ``text`` under the active leaf: counted first (``OverflowFlow.check_send``), then
        stored and answered, or the overflow choices are offered. A branch moved since it was
        drawn emits ``changed_elsewhere``; a question with no answer asks (``ask_unanswered``)."""
        self.timeline.start()
        if not self.can_generate("your message was not sent and is still in the box") \
                or self.overflow.checking is not None:
            self.composer.set_text(text)
            return
        if self._branch_moved():  # the Navigator redraws it; the text goes back in the box
            self.changed_elsewhere.emit(self.conversation_id, text)
            return
        if refuse_while_written(self.store, self.conversation_id, self.composer, self.banner, text):
            return  # another process is streaming the branch's last reply
        pending = self.session.unanswered_leaf(self.conversation_id) if self.conversation_id else None
        if pending is not None:
            self.unanswered_box = ask_unanswered(self.parent(), self.store, self.composer, pending, text, self)
            return
        new_chat = self.new_chat_settings() if self.conversation_id is None else None
        self.overflow.check_send(self.conversation_id, text, new_chat)

    def _branch_moved(self) -> bool:
        """True when the shown chat's branch no longer ends where it did when it was drawn
        (another process added to it or moved it): a send would land under unseen messages."""
        cid, shown = self.conversation_id, self.shown_leaf
        if cid is None or shown is None or shown[0] != cid:
            return False
        try:
            return self.store.get_conversation(cid).active_leaf_id != shown[1]
        except StorageError:
            return False

    def store_message(self, cid: int | None, text: str, new_chat: tuple[str, dict] | None = None,
                      parent_id: int | None = None) -> int | None:
        """Store ``text`` as a user message under ``parent_id`` (default: the active leaf) of
        ``cid`` (None: a new chat with ``new_chat``'s settings); its id, or None (the text is
        put back in the composer) when it cannot be stored."""
        try:
            user = self.session.send(cid, text, parent_id, new_chat=new_chat)
        except (StorageError, ValueError) as exc:
            self.composer.set_text(text)
            self.banner.show_message(f"Your message could not be saved: {exc}", "error")
            return None
        if cid is None:
            self._new_chat = None
        self.conversation_id = user.conversation_id
        self.current_changed.emit(self.conversation_id)
        return user.id

    def store_and_reply(self, cid: int | None, text: str, new_chat: tuple[str, dict] | None = None) -> None:
        """Store ``text`` (``store_message``) and generate the reply, if the model is still ready.

        In a chat that exists, the request goes first (``ConversationSession.send_plan``, with
        the branch read off the UI thread, ``shown_prompt``) and the message is stored right
        after, in the same call: the engine starts while the database writes, and no event (no
        token, no crash report) is handled in between, so the message is as safe as when stored
        first. If it cannot be stored, the request is cancelled and the text goes back to the
        composer. With the engine gone, the message is stored and shown unanswered (Retry)."""
        if not self.can_generate():
            self.composer.set_text(text)
            return
        plan, handle = None, None
        if cid is not None:
            with contextlib.suppress(StorageError):  # ``store_message`` says why
                plan = self.session.send_plan(cid, text, self.shown_prompt.current())
        if plan is not None:
            self.timeline.mark("request")
            handle = self.client.generate(plan.messages, plan.sampling, use_cache=self.use_cache, path=plan.path,
                                          **self.tools.request_args(plan.messages))
        user_id = self.store_message(cid, text, new_chat, plan.parent_id if plan else None)
        if user_id is None:
            if handle is not None:
                self.client.cancel(handle)
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
        self.banner.show_message(f"Forked into a new chat, “{conv.title}”. Its KV cache is shared.", "info",
                                 chat_id=conv.id)

    # -- one reply -----------------------------------------------------------------------

    def _request_reply(self, user_message_id: int) -> PendingRequest | None:
        """Send the request for a reply under ``user_message_id`` (None: the engine is gone)."""
        cid = self.store.get_message(user_message_id).conversation_id
        sampling, messages = self.store.get_conversation(cid).sampling, self.session.prompt(user_message_id)
        self.timeline.mark("request")
        return self.client.generate(messages, dict(sampling), use_cache=self.use_cache, **self.tools.request_args(messages))

    def start_reply(self, user_message_id: int, handle: PendingRequest | None = None, reply=None) -> None:
        """Generate a new assistant reply (a new child) under the user message ``user_message_id``;
        ``handle``: its request, when already sent; ``reply``: a Continue's recorder (continue_flow.py)."""
        if self.streaming:
            return
        if handle is None:
            self.timeline.start()
            handle = self._request_reply(user_message_id)
            if handle is None:
                return
        user = self.store.get_message(user_message_id)
        self.reply = reply or self.session.start_reply(user.id, self.model.label)
        self._request, self._stopping = handle, False
        handle.token.connect(self._token)
        handle.reasoning.connect(self.view.reasoning_arrived)
        self.figures.follow_reply(handle)  # the progress bar, and the context figure while it prefills
        handle.done.connect(lambda e, r=self.reply: self._done(r, e))
        handle.snapshot.connect(lambda e, r=self.reply: self._snapshot(r, e))
        handle.failed.connect(lambda e, r=self.reply: self._failed(r, e))
        if self.conversation_id != user.conversation_id:
            self.conversation_id = user.conversation_id
            self.current_changed.emit(user.conversation_id)
        self.busy_changed.emit(user.conversation_id)
        self.composer.set_streaming(True)
        self.status.stats_label.setText("Reading your message…")  # restore and prefill: not a model's thinking
        if not self.view.show_sent(user):  # only the new bubbles, else the whole transcript
            self.render()
        self.timeline.mark("drawn")

    def stop(self) -> None:
        """Cancel the reply; the engine answers with ``done`` (finish_reason "cancelled")."""
        counting = self.overflow.checking is not None and not self.overflow.stopped
        self.overflow.stop()  # a message still being counted is not answered
        self.tools.stop()  # a tool call being asked or run ends the tool loop
        if counting:
            self.watchdog.start()
        if self._request is not None and not self._stopping:
            self._stopping = True
            self.status.stats_label.setText("Stopping…")
            self.client.cancel(self._request)
            self.watchdog.start()

    def _stop_unanswered(self) -> bool:
        """True while Stop waits for the engine: a reply being cancelled, or a count."""
        flow = self.overflow
        return (self._request is not None and self._stopping) or (flow.checking is not None and flow.stopped)

    def _token(self, text: str) -> None:
        if not self.reply.text and not self._stopping:
            self.status.stats_label.setText("Writing…")  # the first token: no longer "Reading your message…"
            self.timeline.mark("token_read", self._request.first_token_read_at)
            self.timeline.mark("token")
        try:
            self.reply.add_text(text)
        except NotFoundError:  # the chat was deleted meanwhile: its reply is being stopped
            self.stop()
        except StorageError as exc:
            self.banner.storage_failed(exc)
        self.view.text_arrived()

    def _end(self) -> ReplyRecorder | None:
        r, self.reply, self._request = self.reply, None, None
        self.view.stop()
        self.watchdog.settle()
        self.status.progress.hide()
        self.composer.set_streaming(False)
        self.busy_changed.emit(None)
        return r

    def _done(self, reply: ReplyRecorder, event: DoneEvent) -> None:
        if reply is not self.reply:
            return
        self._end()
        mid, self.last_done = None, event  # the tool loop reads the calls from its tool_text
        try:
            mid = reply.complete(event.text, event.token_ids, event.stats, event.reasoning)
        except NotFoundError:  # the chat was deleted meanwhile: nothing of it is kept
            log.info("the reply's chat %s was deleted while it was written; nothing kept", reply.conversation_id)
        except StorageError as exc:
            self.banner.storage_failed(exc)
        if reply.conversation_id == self.conversation_id and not (mid and self.view.show_saved(mid)):
            self.render()  # the saved reply replaces its streaming bubble, else all is drawn again
        self.status.show_stats(event.stats, first_turn=self.figures.first_turn(reply.parent_id))
        self.figures.update_context_label(event.stats)
        self.chats_changed.emit()
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
            self.overflow.stored(parent, event.n_ctx)
        else:
            self.banner.show_message(event.message or "The engine could not do that.", "error",
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
        if not self.lifetime.closed:
            if reply.conversation_id == self.conversation_id:
                self.render()
            self.reply_finished.emit(reply.message_id or 0)

    def shutdown(self) -> None:
        """Save a reply in progress as stopped and stop the engine (cancelling it first)."""
        request = self._request
        if self.reply is not None:
            self.abandon(ReplyState.STOPPED)
        self.client.stop(cancel=request)
