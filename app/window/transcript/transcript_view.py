"""The transcript: the active path of a conversation as message bubbles.

``TranscriptView`` stacks ``MessageWidget`` bubbles (message_widget.py) in a scroll area,
building the newest first and the older ones lazily, and holds the bubble of the reply
being streamed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.window.shell.theme import LIGHT, Colors
from app.window.transcript.message_widget import MessageWidget
from app.window.workers.lexer_warmup import warm_up
from storage.chats import Message, search_terms

SHOWN_MESSAGES = 200
"""Bubbles built when a chat opens: the newest ones. Older messages wait behind a
"Show earlier messages" button, so opening a 10,000-message branch costs the same as a
200-message one (a bubble takes milliseconds to build)."""
FIRST_BUBBLES = 2
"""Bubbles built when a chat opens (the newest: the last question and its answer). The older
ones are built ``BUBBLES_PER_TURN`` per event-loop turn while the view's top is near them
(``NEAR_TOP_PX``): a bubble with code takes 5-20 ms to build and as much to lay out, and
building 200 at once stalled the window for seconds (4 per turn: 90-170 ms, issue #10);
built lazily, opening a chat costs the same however long it is."""
BUBBLES_PER_TURN = 1
PENDING_NOTE = "· reading your message…"
"""The note on the reply's bubble until its first word: the prompt is being restored and
prefilled (not a reasoning model's thinking, which is shown as such)."""
NEAR_TOP_PX = 300


_SHOWN_OR_HIDDEN = (QEvent.Type.Show, QEvent.Type.Hide, QEvent.Type.ShowToParent, QEvent.Type.HideToParent)


class _Follower(QObject):
    """Shows ``follower`` exactly while ``leader`` is shown (an event filter on the leader)."""

    def __init__(self, leader: QWidget, follower: QWidget, view: QWidget):
        super().__init__(view)
        self.leader, self.follower, self.view = leader, follower, view
        follower.setVisible(leader.isVisibleTo(view))
        leader.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if event.type() in _SHOWN_OR_HIDDEN:
            self.follower.setVisible(self.leader.isVisibleTo(self.view))
        return False


def is_first_turn(path: Sequence[Message], reply: Message) -> bool:
    """Whether ``reply`` answers the first message of ``path`` (root first; a system message
    at the root does not count). Reads at most the first two messages of the path; of a
    ``PathView`` whose start is not known yet, none when ``reply`` is its third known message
    or a later one (at least the third from the root: too deep to answer the first)."""
    if not getattr(path, "complete", True) and reply.id in path.tail_ids[2:]:
        return False
    head = [path[i] for i in range(min(2, len(path)))]
    if head and head[0].role == "system":
        head = head[1:]
    return bool(head) and reply.parent_id == head[0].id


def same_start(old: Sequence[Message], new: Sequence[Message]) -> bool:
    """Whether two paths start at the same message; two paths of one conversation count as the
    same when one is a ``PathView`` whose start is not known yet (not read for this)."""
    if not old or not new:
        return not old and not new
    if getattr(old, "complete", True) and getattr(new, "complete", True):
        return old[0].id == new[0].id
    return old[-1].conversation_id == new[-1].conversation_id


def earlier_text(hidden: int | None) -> str:
    """The "Show earlier messages" button's text; ``hidden`` None: how many is not known yet."""
    return "Show earlier messages" if hidden is None else f"Show earlier messages ({hidden:,} not shown)"


class TranscriptView(QScrollArea):
    """The messages of the active path, plus the reply being streamed."""

    sibling_requested = Signal(int, int)
    edit_saved = Signal(int, str)
    regenerate_requested = Signal(int)
    fork_requested = Signal(int)
    link_requested = Signal(str)  # an http(s) link in any message was clicked
    delete_requested = Signal(int)
    copy_conversation_requested = Signal()
    edit_changed = Signal(int, str)  # MessageWidget's: for zero-wait turns (prewarm_controller.py)
    edit_ended = Signal(int)
    regenerate_hovered = Signal(int)
    continue_requested = Signal(int)  # MessageWidget's: Continue a stopped reply (flows/continue_flow.py)
    filling_changed = Signal(bool)  # ``filling``: the window holds the chat reader meanwhile

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
        self.decorate = None  # called with each saved message's bubble as it is built
        self.complete_path = None  # called with a shown PathView whose older ids are not read yet
        self._empty = QLabel()
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._layout.insertWidget(0, self._empty)
        self.earlier_button = QPushButton()
        self.earlier_button.setObjectName("show_earlier")
        self.earlier_button.setFlat(True)
        self.earlier_button.setAccessibleName("Show earlier messages")
        self.earlier_button.clicked.connect(self.show_earlier)
        self.earlier_button.hide()
        self._layout.insertWidget(1, self.earlier_button)
        self._shown_limit = SHOWN_MESSAGES
        self._args: tuple = ()
        self._older = range(0)  # the (negative) indexes in the shown path of the messages not built yet
        self._shown = 0  # how many of the path's newest messages are shown (built or not)
        self._settled = False  # the view was put at the bottom after set_messages
        self._anchor: int | None = None  # keep this distance from the bottom after building older bubbles
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        self._stick_to_bottom = True
        self._revealed: MessageWidget | None = None  # scrolled into view while the layout settles
        self._filling = False
        self.setAccessibleName("Messages")
        # a real zero-timer, not QTimer.singleShot(0) (a posted event): posted events run before
        # timers, so a chain of them kept every timer (and the heartbeat of tools/ui_latency) waiting
        self._build_timer = QTimer(self, singleShot=True, interval=0)
        self._build_timer.timeout.connect(self._build_next)
        warm_up()  # code highlighting's lexers, compiled off the UI thread before a bubble needs one

    def set_messages(self, path: list[Message], positions: Mapping[int, tuple[int, int]],
                     colors: Colors, busy: bool = False, empty_text: str = "",
                     unanswered_id: int | None = None) -> None:
        """Show ``path`` (root first). ``positions`` maps message id -> (index, count) among siblings;
        ``unanswered_id``, a user message with no reply, gets a Retry button, as does every user
        message followed by another user message. Only the newest
        ``SHOWN_MESSAGES`` are built; ``show_earlier`` adds more."""
        if not self._args or not same_start(self._args[0], path):
            self._shown_limit = SHOWN_MESSAGES
        self._args = (path, positions, colors, busy, empty_text, unanswered_id)
        self.colors = colors
        self.clear()
        if not getattr(path, "complete", True) and len(path.tail_ids) <= self._shown_limit:
            path.read_ids()  # more is drawn than the ids read up front: read them all
        # the newest ``shown`` messages, by negative index: a PathView is not read whole for them
        self._shown = min(len(path), self._shown_limit) if getattr(path, "complete", True) else self._shown_limit
        self.path_completed()
        if self.complete_path is not None and not getattr(path, "complete", True):
            self.complete_path(path)  # the count of the earlier messages comes with them
        self._empty.setText(empty_text)
        self._empty.setStyleSheet(f"color:{colors.muted}; font-size:15px;")
        self._empty.setVisible(not self._shown and bool(empty_text))
        # the newest bubbles now, the older ones a batch per event-loop turn (``_build_older``),
        # each message read when its bubble is built (a PathView reads no more)
        self._settled, self._anchor = False, None
        newest: list[MessageWidget] = []
        stop = 0
        while stop > -self._shown and len(newest) < FIRST_BUBBLES:
            stop -= 1
            if path[stop].role != "system":
                newest.append(self._bubble(path[stop], self._unanswered(stop)))
        self._older = range(-self._shown, stop)
        for w in reversed(newest):
            self._add(w)
        self._stick_to_bottom = True
        self._revealed = None
        self._set_filling(bool(self._older))
        QTimer.singleShot(0, self._settle)

    def path_completed(self) -> None:
        """Say how many earlier messages are not shown, once the shown path's length is known
        (a ``PathView`` read from its leaf up knows it when its ids are all read)."""
        path = self._args[0] if self._args else []
        hidden = len(path) - self._shown if getattr(path, "complete", True) else None
        self.earlier_button.setText(earlier_text(hidden))
        self.earlier_button.setVisible(hidden is None or hidden > 0)

    def _unanswered(self, index: int) -> bool:
        """Whether the message at ``index`` of the shown path gets Retry: the user message the
        controller named (``unanswered_id``), or one followed by another user message (a reply
        that failed or was cancelled). Reads the message after it, built before it."""
        path, *_rest, unanswered_id = self._args
        m = path[index]  # a negative index: from the newest
        if m.role != "user":
            return False
        return m.id == unanswered_id or (index + 1 < 0 and path[index + 1].role == "user")

    def reveal(self, message_id: int) -> MessageWidget | None:
        """Scroll to the bubble of ``message_id`` (building older bubbles when it is among
        the messages not shown yet) and highlight it. Returns it (None: not on the shown path)."""
        if not self._args:
            return None
        path = self._args[0]
        ids = path.tail_ids if hasattr(path, "tail_ids") else [m.id for m in path]  # a PathView: not read whole
        if message_id not in ids and hasattr(path, "tail_ids"):
            ids = path.ids  # further up than the ids read: all of them
        if message_id not in ids:
            return None
        needed = len(ids) - ids.index(message_id)
        if needed > self._shown_limit:
            self._shown_limit = (needed + SHOWN_MESSAGES - 1) // SHOWN_MESSAGES * SHOWN_MESSAGES
            self.set_messages(*self._args)
        w = self.widget_for(message_id)
        if w is None:
            return None
        for other in self.widgets:
            if other.highlighted:
                other.set_highlighted(False)
        w.set_highlighted(True)
        self._stick_to_bottom = False
        self._revealed = w
        QTimer.singleShot(0, lambda: self._scroll_to_revealed())
        return w

    def mark_terms(self, message_id: int, query: str) -> None:
        """Mark the words of the search ``query`` in ``message_id``'s bubble (built if it is
        among the older ones; nothing when it is not shown); the other bubbles lose theirs."""
        terms = search_terms(query)
        for w in self.widgets:
            if w.message is not None and w.message.id != message_id and w.marked:
                w.mark_terms([])
        w = self.widget_for(message_id)
        if w is not None:
            w.mark_terms(terms)

    def _scroll_to_revealed(self) -> None:
        if self._revealed is not None and self._revealed in self.widgets:
            self.ensureWidgetVisible(self._revealed, 0, 40)

    def _bubble(self, m: Message, unanswered: bool) -> MessageWidget:
        path, positions, colors, busy, *_rest = self._args
        position = positions.get(m.id, (1, 1))  # read now: a lazy mapping (SiblingPositions)
        w = MessageWidget(m, m.role, position[0], position[1], colors, busy, unanswered=unanswered,
                          first_turn=m.role == "assistant" and is_first_turn(path, m))
        w.sibling_requested.connect(self.sibling_requested)
        w.edit_saved.connect(self.edit_saved)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.fork_requested.connect(self.fork_requested)
        w.link_requested.connect(self.link_requested)
        w.delete_requested.connect(self.delete_requested)
        w.copy_conversation_requested.connect(self.copy_conversation_requested)
        w.edit_changed.connect(self.edit_changed)
        w.edit_ended.connect(self.edit_ended)
        w.regenerate_hovered.connect(self.regenerate_hovered)
        w.continue_requested.connect(self.continue_requested)
        if "continue" in w.buttons and path and path[-1].id != m.id:  # only a branch's last reply goes on
            w.buttons["continue"].hide()
        if self.decorate is not None:  # e.g. attachment chips (attachment_marks.py)
            self.decorate(w)
        return w

    @property
    def building(self) -> bool:
        """True while older bubbles of the shown path are still being built."""
        return bool(self._older)

    def _build_older(self, count: int = BUBBLES_PER_TURN) -> None:
        """Build up to ``count`` of the not yet built older bubbles above the others, keeping
        what is on screen where it is."""
        if not self._older:
            return
        bar = self.verticalScrollBar()
        self._anchor = bar.maximum() - bar.value()  # distance from the bottom, kept by _range_changed
        path = self._args[0]
        lo, hi = max(self._older.start, self._older.stop - count), self._older.stop
        self._older = range(self._older.start, lo)
        messages = path[lo:hi]  # one read for the batch
        for i in range(hi - 1, lo - 1, -1):
            m = messages[i - lo]
            if m.role == "system":
                continue
            w = self._bubble(m, self._unanswered(i))
            self._layout.insertWidget(self._layout.indexOf(self.earlier_button) + 1, w)  # after "Show earlier"
            self.widgets.insert(0, w)
        self._fill()  # the scroll range may not change (short bubbles): check again next turn

    def _scrolled(self, value: int) -> None:
        """Near the top: build the next older bubbles (the transcript is laid out lazily)."""
        if not self._settled:  # still opening: the view has not been put at the bottom yet
            return
        self._stick_to_bottom = value >= self.verticalScrollBar().maximum() - 40
        if self._older and value < NEAR_TOP_PX:
            self._build_older()

    def stop_building(self) -> None:
        """Build no more older bubbles (the window is shutting down: the store closes)."""
        self._older = range(0)
        self._build_timer.stop()
        self._set_filling(False)

    @property
    def filling(self) -> bool:
        """True from ``set_messages`` until the bubbles built fill the view (its top is
        ``NEAR_TOP_PX`` above them, or none is left to build, or the view is hidden): the
        first screen of a chat, built a bubble per event-loop turn. ``filling_changed`` says
        when it changes."""
        return self._filling

    def _set_filling(self, on: bool) -> None:
        if on != self._filling:
            self._filling = on
            self.filling_changed.emit(on)

    def finish_building(self) -> None:
        """Build every remaining bubble now (tests, tools, and finding a message)."""
        if self._older:
            self._build_older(len(self._older))

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

    def set_empty_extra(self, widget: QWidget) -> None:
        """Show ``widget`` under the empty page's text, and only while that text is shown
        (the first screen's "Get a better model")."""
        self._layout.insertWidget(self._layout.indexOf(self._empty) + 1, widget)
        self._empty_follower = _Follower(self._empty, widget, self)

    def clear(self) -> None:
        for w in self.widgets:  # deleteLater: a button of ``w`` may be emitting right now
            self._layout.removeWidget(w)
            w.hide()
            w.deleteLater()
        self.widgets = []
        self.pending = None
        self._older = range(0)
        self._anchor = None

    def start_pending(self) -> MessageWidget:
        """Add an empty assistant bubble for the reply about to stream."""
        self._empty.hide()
        self.pending = MessageWidget(None, "assistant", colors=self.colors)
        self.pending.note.setText(PENDING_NOTE)
        self.pending.link_requested.connect(self.link_requested)
        self._add(self.pending)
        self._stick_to_bottom = True
        return self.pending

    @property
    def path(self) -> Sequence[Message]:
        """The messages shown (root first; built or not), without the reply being streamed:
        as given to ``set_messages`` (a PathView reads a message only when it is asked for)."""
        return self._args[0] if self._args else []

    def _extended(self, message: Message, position: tuple[int, int]) -> None:
        """Put ``message`` (at ``position`` among its siblings) below the shown path, reading
        nothing of the path again (a PathView and SiblingPositions are extended, not listed)."""
        path, positions, *rest = self._args
        path = path.plus(message) if hasattr(path, "plus") else [*path, message]
        positions = (positions.plus(message.id, position) if hasattr(positions, "plus")
                     else {**positions, message.id: position})
        self._args = (path, positions, *rest)

    def append(self, message: Message, position: tuple[int, int] = (1, 1)) -> MessageWidget | None:
        """Add the bubble of ``message`` (at ``position`` among its siblings), a new child of
        the last message shown, below the others without rebuilding them (a message just
        sent). Returns it; None when nothing was shown with ``set_messages`` yet."""
        if not self._args or self.pending is not None:
            return None
        self._extended(message, position)
        self._empty.hide()
        w = self._bubble(message, False)
        self._add(w)
        self._stick_to_bottom = True
        return w

    def replace_pending(self, message: Message, position: tuple[int, int] = (1, 1)) -> MessageWidget | None:
        """The streamed reply was saved as ``message``: its bubble (with its actions and
        figures) takes the place of the pending one; the others are not rebuilt. Returns it;
        None when no reply is pending."""
        if self.pending is None or not self._args:
            return None
        self._extended(message, position)
        old, self.pending = self.pending, None
        w = self._bubble(message, False)
        self._layout.insertWidget(self._layout.indexOf(old), w)
        self.widgets[self.widgets.index(old)] = w
        self._layout.removeWidget(old)
        old.hide()
        old.deleteLater()
        return w

    def set_busy(self, busy: bool) -> None:
        """A reply started (True) or ended: the bubbles' tree-changing actions follow
        (``MessageWidget.set_busy``), those built later too."""
        if self._args:
            path, positions, colors, _busy, *rest = self._args
            self._args = (path, positions, colors, busy, *rest)
        for w in self.widgets:
            if w is not self.pending:
                w.set_busy(busy)

    def widget_for(self, message_id: int) -> MessageWidget | None:
        if self._older:
            path = self._args[0]
            ids = path.tail_ids[self._older.start:self._older.stop] if hasattr(path, "tail_ids") else \
                [path[i].id for i in self._older]  # a PathView: its ids, no message read
            if message_id in ids:
                self.finish_building()
        return next((w for w in self.widgets if w.message and w.message.id == message_id), None)

    def _settle(self) -> None:
        """After a redraw: the revealed bubble in view, else the newest message."""
        if self._revealed is not None:
            self._scroll_to_revealed()
        else:
            self.scroll_to_bottom()

    def scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._settled = True
        self._fill()

    def _fill(self) -> None:
        """While the view's top is near the built bubbles' top, build older ones (next turn)."""
        if self._settled and self._older and self.verticalScrollBar().value() < NEAR_TOP_PX:
            self._build_timer.start()
        elif self._settled:
            self._set_filling(False)

    def _build_next(self) -> None:
        if self.isVisible():  # not after the window closed (its database is closed too)
            self._build_older()
        else:
            self._set_filling(False)

    def _range_changed(self, _lo: int, hi: int) -> None:
        bar = self.verticalScrollBar()
        if self._revealed is not None:
            self._scroll_to_revealed()
        elif self._stick_to_bottom:
            bar.setValue(hi)
        elif self._anchor is not None:
            bar.setValue(max(0, hi - self._anchor))
        self._fill()

    def note_user_scroll(self) -> None:
        self._revealed = None
        bar = self.verticalScrollBar()
        self._stick_to_bottom = bar.value() >= bar.maximum() - 40

    def wheelEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().wheelEvent(event)
        self.note_user_scroll()
