"""The sidebar: New chat, a search box, and the conversations (pinned first, newest first)
with rename, pin, duplicate and delete in a context menu.

Each row is one line: the title, elided, and a small relative date on the right ("2 h ago",
"Yesterday"); search results add a second line with the matching text. Deleting is
deferred so it can be undone: the chat disappears from the list at once, and
``ChatStore.delete_conversation`` runs when ``UNDO_MS`` pass, another chat is deleted, or
the window closes (``commit_delete``).
"""

from __future__ import annotations

import logging
import time

from PySide6.QtCore import QEvent, QPointF, QRect, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontMetrics, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QApplication,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.window.shell.plain import elide, isolate, tooltip
from app.window.workers.chat_reader import ChatReader
from app.window.workers.scrub import scrub_deleted
from app.window.workers.tasks import Workers
from storage.chats import ChatStore, SearchHit
from storage.errors import NotFoundError, StorageError

log = logging.getLogger(__name__)

ID_ROLE = Qt.ItemDataRole.UserRole
DATE_ROLE = Qt.ItemDataRole.UserRole + 1
SNIPPET_ROLE = Qt.ItemDataRole.UserRole + 2
SPANS_ROLE = Qt.ItemDataRole.UserRole + 4
"""A search result's (start, end) spans of the searched words in its snippet: drawn bold."""
HIT_ROLE = Qt.ItemDataRole.UserRole + 5
"""A search result's message id (None when only the title matched): a click opens its branch."""
PINNED_ROLE = Qt.ItemDataRole.UserRole + 3
"""True on a pinned chat's row: the delegate draws a push pin before its title (a drawn
shape, not an emoji, which shows as an empty box without an emoji font); its accessible
text and tooltip start with "Pinned"."""
PIN_DOT = 3  # the pin head's radius (pixels)
PIN_W = 10  # the pin's width (pixels)
FORGET_NOTE = ("KV blocks this chat shares with other chats stay; its own are removed from "
               "kvcache.sqlite3, so its text cannot be rebuilt from the cache.")
"""What "Delete and forget" does to the KV cache, in the words the menu and banner use."""
DELETE_TIP = ("Delete this chat: its messages go (Undo brings them back for 10 seconds). Its saved KV "
              "cache stays on disk until the cache needs the room, then it is evicted.")
FORGET_TIP = ("Delete this chat and forget it: its messages go (Undo for 10 seconds), and then so does its "
              "KV cache, the saved state that let replies start at once. " + FORGET_NOTE)
"""The tooltips that tell the two deletes apart, in the chat's menu."""
UNDO_MS = 10_000
"""How long a deleted chat can be brought back (milliseconds)."""


def relative_date(when: float, now: float | None = None) -> str:
    """A short age for the unix time ``when`` (seconds): "now", "5 min ago", "2 h ago",
    "Yesterday", a weekday within the last week ("Mon"), else "12 Mar" (or "12 Mar 2023"
    for another year). Calendar days are local time."""
    now = time.time() if now is None else now
    age = max(0.0, now - when)
    if age < 60:
        return "now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    then, today = time.localtime(when), time.localtime(now)
    days = (time.mktime(today[:3] + (0, 0, 0, 0, 0, -1)) - time.mktime(then[:3] + (0, 0, 0, 0, 0, -1)))
    days = round(days / 86400)
    if days <= 0:
        return f"{int(age // 3600)} h ago"
    if days == 1:
        return "Yesterday"
    if days < 7:
        return time.strftime("%a", then)
    if then.tm_year == today.tm_year:
        return f"{then.tm_mday} {time.strftime('%b', then)}"
    return f"{then.tm_mday} {time.strftime('%b %Y', then)}"


class ConversationDelegate(QStyledItemDelegate):
    """Paints a row as one elided title line with the date right-aligned in a smaller, muted
    font, plus an elided muted snippet line for search results."""

    PAD_X, PAD_Y, GAP = 8, 6, 8

    def _date_font(self, option: QStyleOptionViewItem) -> QFont:
        f = QFont(option.font)
        f.setPointSizeF(max(6.5, f.pointSizeF() * 0.85))
        return f

    def sizeHint(self, option, index) -> QSize:  # noqa: N802 - Qt override
        lines = 2 if index.data(SNIPPET_ROLE) else 1
        h = QFontMetrics(option.font).height()
        return QSize(100, lines * h + (lines - 1) * 2 + 2 * self.PAD_Y)

    def paint(self, painter, option, index) -> None:  # noqa: D102 - Qt override
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title = opt.text
        opt.text = ""
        style = opt.widget.style() if opt.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        group = QPalette.ColorGroup.Normal if opt.state & QStyle.StateFlag.State_Enabled else \
            QPalette.ColorGroup.Disabled
        text_color = opt.palette.color(group, QPalette.ColorRole.HighlightedText if selected
                                       else QPalette.ColorRole.Text)
        muted = opt.palette.color(group, QPalette.ColorRole.HighlightedText if selected
                                  else QPalette.ColorRole.PlaceholderText)
        r = opt.rect.adjusted(self.PAD_X, self.PAD_Y, -self.PAD_X, -self.PAD_Y)
        fm = QFontMetrics(opt.font)
        line = QRect(r.left(), r.top(), r.width(), fm.height())
        painter.save()
        date = index.data(DATE_ROLE) or ""
        date_w = 0
        if date:
            df = self._date_font(opt)
            dfm = QFontMetrics(df)
            date_w = dfm.horizontalAdvance(date)
            if date_w + self.GAP + fm.averageCharWidth() * 8 <= r.width():  # only when it fits nicely
                painter.setFont(df)
                painter.setPen(muted)
                painter.drawText(line, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, date)
            else:
                date_w = 0
        painter.setFont(opt.font)
        left = line.left()
        if index.data(PINNED_ROLE):  # the pin marker: a drawn push pin in the text colour
            left += draw_pin(painter, left, line.center().y() + 0.5, text_color)
        painter.setPen(text_color)
        title_w = line.right() + 1 - left - (date_w + self.GAP if date_w else 0)
        painter.drawText(QRect(left, line.top(), title_w, line.height()),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(isolate(title), Qt.TextElideMode.ElideRight, title_w))
        snippet = index.data(SNIPPET_ROLE)
        if snippet:
            painter.setPen(muted)
            draw_marked(painter, line.translated(0, fm.height() + 2), opt.font, snippet,
                        index.data(SPANS_ROLE) or [])
        painter.restore()


def draw_pin(painter: QPainter, left: float, cy: float, color) -> int:
    """Draw an upright push pin in ``color``, seen from the side: a wide cap, a body
    ``2 * PIN_DOT + 1`` pixels wide from ``left`` across the middle row ``cy``, a wide plate
    and the needle below. Returns the width it took, gap included."""
    painter.save()
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(color)
    body = 2 * PIN_DOT + 1
    painter.drawRoundedRect(QRectF(left - 1.5, cy - 6, body + 3, 3.5), 1.5, 1.5)  # the cap
    painter.drawRect(QRectF(left, cy - 2.5, body, 4))  # the body
    painter.drawRoundedRect(QRectF(left - 2, cy + 1.5, body + 4, 2), 1, 1)  # the plate
    painter.setPen(QPen(color, 1.5, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
    painter.drawLine(QPointF(left + body / 2, cy + 3.5), QPointF(left + body / 2, cy + 8))  # the needle
    painter.restore()
    return PIN_W + 6


def snippet_runs(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, bool]]:
    """``text`` cut into (piece, is a match) runs at the ``spans`` (start, end)."""
    runs, at = [], 0
    for a, b in spans:
        if a > at:
            runs.append((text[at:a], False))
        runs.append((text[a:b], True))
        at = b
    if at < len(text):
        runs.append((text[at:], False))
    return runs


def draw_marked(painter: QPainter, rect: QRect, font: QFont, text: str, spans: list[tuple[int, int]]) -> None:
    """Draw ``text`` on one line in ``rect``, the ``spans`` in bold, elided with "…" at the
    right edge. The text is drawn as text (it is a message: hostile), never as markup."""
    bold = QFont(font)
    bold.setBold(True)
    x, right = rect.left(), rect.right() + 1
    for piece, is_match in snippet_runs(text, spans):
        f = bold if is_match else font
        fm = QFontMetrics(f)
        width = fm.horizontalAdvance(piece)
        if x + width > right:
            piece = fm.elidedText(piece, Qt.TextElideMode.ElideRight, right - x)
            width = right - x
        painter.setFont(f)
        painter.drawText(QRect(x, rect.top(), max(0, width), rect.height()),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, piece)
        x += width
        if x >= right:
            break
    painter.setFont(font)


class Sidebar(QWidget):
    """Signals: ``selected(conversation_id)``, ``hit_opened(conversation_id, message_id)``
    (a search result whose match is in that message), ``new_chat()``, ``deleted(conversation_id)``
    (hidden, the delete can still be undone), ``restored(conversation_id)`` (undone),
    ``delete_committed(conversation_id)`` (gone from the database), ``changed()`` (a rename,
    pin or duplicate happened), ``forget_requested(conversation_id)`` (a "Delete and forget"
    whose undo time is up: the window has the engine process delete the rows and the KV
    blocks; this class does not touch the database for it), ``stop_requested(conversation_id)``
    (the chat being deleted has a reply running: the window stops it first).

    Delete and forget, and Undo: both deletes are deferred the same way, so Undo works the
    same for both within ``UNDO_MS``; nothing is removed (rows or KV blocks) before the undo
    time is up, so Undo never needs anything back from the cache."""

    selected = Signal(int)
    hit_opened = Signal(int, int)  # conversation id, message id: a search result was clicked
    new_chat = Signal()
    deleted = Signal(int)
    restored = Signal(int)
    delete_committed = Signal(int)
    changed = Signal()
    forget_requested = Signal(int)
    stop_requested = Signal(int)

    def __init__(self, store: ChatStore, workers: Workers, reader: ChatReader | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.workers = workers  # scrubs deleted text (``workers/scrub.py``)
        self.reader = reader  # searches off the UI thread (without one: on it)
        self.current_id: int | None = None
        self.busy_id: int | None = None
        self.pending_delete: int | None = None  # hidden, deleted when the undo time is up
        self.pending_forget = False  # the pending delete also forgets its KV blocks
        self._delete_timer = QTimer(self, singleShot=True, interval=UNDO_MS)
        self._delete_timer.timeout.connect(self.commit_delete)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setMinimumHeight(34)
        self.new_button.clicked.connect(self.new_chat)
        self.new_button.setAccessibleName("New chat")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search chats")
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        self.search.installEventFilter(self)  # Down: into the results; Enter: open the first
        self.list = QListWidget()
        self.list.setObjectName("conversation_list")
        self.list.setAccessibleName("Chats")
        self.list.setWordWrap(False)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setItemDelegate(ConversationDelegate(self.list))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(self._clicked)
        self.list.itemActivated.connect(self._clicked)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        self.setMinimumWidth(160)

    def refresh(self) -> None:
        """Reload the list: the conversations, or the search results when the search box has
        text (searched on the reader's worker thread: a search reads every matching message,
        a megabyte for a pasted file; the list shows them when they arrive)."""
        self._search_timer.stop()
        query = self.search.text().strip()
        if not query:
            if self.reader is not None:
                self.reader.cancel("search")
            self._fill([SearchHit(c, None, "", []) for c in self.store.list_conversations()], query)
        elif self.reader is None:
            self._fill(self.store.search_hits(query), query)
        else:
            self.reader.submit("search", lambda store: store.search_hits(query),
                               lambda hits: self._fill(hits, query))

    @property
    def searching(self) -> bool:
        """True while a search runs off the UI thread."""
        return self.reader is not None and self.reader.pending("search")

    def _fill(self, rows: list[SearchHit], query: str) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        rows = [h for h in rows if h.conversation.id != self.pending_delete]
        now = time.time()
        for hit in rows:
            conv, snippet = hit.conversation, hit.snippet
            item = QListWidgetItem(conv.title)
            item.setData(PINNED_ROLE, bool(conv.pinned))
            item.setData(Qt.ItemDataRole.AccessibleTextRole, ("Pinned: " if conv.pinned else "") + isolate(conv.title))
            item.setData(ID_ROLE, conv.id)
            item.setData(DATE_ROLE, relative_date(conv.updated_at, now))
            if snippet and snippet != conv.title:
                item.setData(SNIPPET_ROLE, snippet)
                item.setData(SPANS_ROLE, hit.spans)
                item.setData(Qt.ItemDataRole.AccessibleTextRole,
                             ("Pinned: " if conv.pinned else "") + f"{isolate(conv.title)}: {isolate(snippet)}")
            item.setData(HIT_ROLE, hit.message_id)
            when = time.strftime('%d %b %Y, %H:%M', time.localtime(conv.updated_at))
            item.setToolTip(tooltip(("Pinned\n" if conv.pinned else "") + f"{isolate(elide(conv.title))}\nLast message {when}"))
            self.list.addItem(item)
            if conv.id == self.current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        if not rows:  # an empty list says why: no chat yet, or none matches the search
            item = QListWidgetItem("No chats match." if query else "No chats yet.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        self.list.blockSignals(False)

    def set_current(self, conversation_id: int | None) -> None:
        """Highlight ``conversation_id`` (None: nothing) and reload the list."""
        self.current_id = conversation_id
        self.refresh()

    def ids(self) -> list[int]:
        """The conversation ids listed, top to bottom."""
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())
                if self.list.item(i).data(ID_ROLE) is not None]

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if (watched is self.search and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Down, Qt.Key.Key_Return, Qt.Key.Key_Enter)):
            return self._key_in_search(event.key())
        return super().eventFilter(watched, event)

    def _key_in_search(self, key) -> bool:
        """Down in the search box moves to the first result (the list takes the focus, so
        Enter then opens it); Enter opens the first result at once. False: nothing to open."""
        if self._search_timer.isActive():
            self.refresh()  # the list still shows the previous query's rows
        row = next((i for i in range(self.list.count()) if self.list.item(i).data(ID_ROLE) is not None), None)
        if row is None:
            return False
        self.list.setCurrentRow(row)
        if key == Qt.Key.Key_Down:
            self.list.setFocus(Qt.FocusReason.TabFocusReason)
        else:
            self._clicked(self.list.item(row))
        return True

    def _clicked(self, item: QListWidgetItem) -> None:
        cid = item.data(ID_ROLE)
        if cid is not None and item.data(HIT_ROLE) is not None:
            self.hit_opened.emit(cid, item.data(HIT_ROLE))
        elif cid is not None and cid != self.current_id:
            self.selected.emit(cid)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None or item.data(ID_ROLE) is None:
            return
        cid = item.data(ID_ROLE)
        conv = self.store.get_conversation(cid)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(cid))
        menu.addAction("Unpin" if conv.pinned else "Pin to top", lambda: self.toggle_pin(cid))
        menu.addAction("Duplicate", lambda: self.duplicate(cid))
        menu.addSeparator()
        delete = menu.addAction("Delete", lambda: self.delete(cid))  # a running reply is stopped first
        delete.setToolTip(DELETE_TIP)
        forget = menu.addAction("Delete and forget", lambda: self.delete(cid, forget=True))
        forget.setToolTip(FORGET_TIP)
        for action in (delete, forget):
            action.setStatusTip(action.toolTip())
        menu.setToolTipsVisible(True)
        self.menu = menu  # for tests: the menu while it is open
        self.show_current()  # the highlight stays on the chat shown, not on the row clicked
        menu.exec(self.list.viewport().mapToGlobal(pos))
        self.show_current()

    def show_current(self) -> None:
        """Select the row of the chat shown (``current_id``), and only it."""
        self.list.blockSignals(True)
        self.list.clearSelection()
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(ID_ROLE) is not None and item.data(ID_ROLE) == self.current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def rename(self, cid: int, title: str | None = None) -> None:
        """Rename ``cid`` to ``title`` (None: ask with a dialog; blank titles are ignored)."""
        if title is None:
            conv = self.store.get_conversation(cid)
            title, ok = QInputDialog.getText(self, "Rename chat", "Title:", QLineEdit.EchoMode.Normal,
                                             conv.title)
            if not ok:
                return
        if title.strip():
            self.store.rename(cid, title.strip())
            self.refresh()
            self.changed.emit()

    def toggle_pin(self, cid: int) -> None:
        """Pin ``cid`` to the top of the list, or unpin it."""
        conv = self.store.get_conversation(cid)
        self.store.set_pinned(cid, not conv.pinned)
        self.refresh()
        self.changed.emit()

    def duplicate(self, cid: int) -> int:
        """Copy ``cid`` with its whole tree; returns the copy's id."""
        copy = self.store.copies.duplicate_conversation(cid)
        self.refresh()
        self.changed.emit()
        return copy.id

    def delete(self, cid: int, forget: bool = False) -> None:
        """Hide ``cid`` at once and delete it from the database after ``UNDO_MS`` unless
        ``undo_delete`` is called first. A delete already pending is carried out now.
        ``forget``: then emit ``forget_requested`` instead (Delete and forget). A reply
        running in ``cid`` is stopped first (``stop_requested``)."""
        if cid == self.busy_id:  # its reply is cancelled before anything else happens
            self.stop_requested.emit(cid)
        self.commit_delete()
        self.pending_delete = cid
        self.pending_forget = forget
        self._delete_timer.start()
        self.refresh()
        self.deleted.emit(cid)

    def undo_delete(self) -> int | None:
        """Bring back the chat whose delete is pending; returns its id (None if there is none)."""
        cid, self.pending_delete = self.pending_delete, None
        self.pending_forget = False
        self._delete_timer.stop()
        if cid is not None:
            self.refresh()
            self.restored.emit(cid)
        return cid

    def commit_delete(self) -> None:
        """Delete the pending chat from the database now (on time-out, the next delete, or close).

        A storage error is logged and the chat stays; it is never raised to the caller."""
        cid, self.pending_delete = self.pending_delete, None
        forget, self.pending_forget = self.pending_forget, False
        self._delete_timer.stop()
        if cid is None:
            return
        if forget:
            self.forget_requested.emit(cid)
            return
        self.delete_rows(cid)

    def delete_rows(self, cid: int) -> None:
        """Delete ``cid``'s rows now (milliseconds) and scrub the search index and WAL off the
        UI thread (``scrub_deleted``); emits ``delete_committed``. A storage error is logged, never raised."""
        try:
            self.store.delete_conversation(cid, forget=False)  # the rows: milliseconds
        except NotFoundError:
            pass
        except StorageError as exc:
            log.error("could not delete chat %s: %s", cid, exc)
            self.refresh()
            return
        scrub_deleted(self.workers, self.store.path)
        self.delete_committed.emit(cid)
