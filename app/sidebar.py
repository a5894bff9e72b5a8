"""The sidebar: New chat, a search box, and the conversations (pinned first, newest first)
with rename, pin, duplicate and delete in a context menu."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from storage.chats import ChatStore

ID_ROLE = Qt.ItemDataRole.UserRole


class Sidebar(QWidget):
    """Signals: ``selected(conversation_id)``, ``new_chat()``, ``deleted(conversation_id)``,
    ``changed()`` (a rename, pin or duplicate happened)."""

    selected = Signal(int)
    new_chat = Signal()
    deleted = Signal(int)
    changed = Signal()

    def __init__(self, store: ChatStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.current_id: int | None = None
        self.busy_id: int | None = None
        self.new_button = QPushButton("+  New chat")
        self.new_button.setMinimumHeight(34)
        self.new_button.clicked.connect(self.new_chat)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        self.list = QListWidget()
        self.list.setObjectName("conversation_list")
        self.list.setWordWrap(True)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(self._clicked)
        self.list.itemActivated.connect(self._clicked)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.new_button)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        self.setMinimumWidth(200)

    def refresh(self) -> None:
        """Reload the list (search results when the search box has text)."""
        self._search_timer.stop()
        query = self.search.text().strip()
        self.list.blockSignals(True)
        self.list.clear()
        if query:
            rows = [(c, snippet) for c, snippet in self.store.search(query)]
        else:
            rows = [(c, "") for c in self.store.list_conversations()]
        for conv, snippet in rows:
            label = ("📌 " if conv.pinned else "") + conv.title
            if snippet and snippet != conv.title:
                label += "\n" + snippet.replace("\n", " ")[:90]
            item = QListWidgetItem(label)
            item.setData(ID_ROLE, conv.id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if conv.id == self.current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        if query and not rows:
            item = QListWidgetItem("No chats match.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(item)
        self.list.blockSignals(False)

    def set_current(self, conversation_id: int | None) -> None:
        self.current_id = conversation_id
        self.refresh()

    def ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())
                if self.list.item(i).data(ID_ROLE) is not None]

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _clicked(self, item: QListWidgetItem) -> None:
        cid = item.data(ID_ROLE)
        if cid is not None and cid != self.current_id:
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
        delete = menu.addAction("Delete…", lambda: self.delete(cid))
        delete.setEnabled(cid != self.busy_id)
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def rename(self, cid: int) -> None:
        conv = self.store.get_conversation(cid)
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", QLineEdit.EchoMode.Normal, conv.title)
        if ok and title.strip():
            self.store.rename(cid, title.strip())
            self.refresh()
            self.changed.emit()

    def toggle_pin(self, cid: int) -> None:
        conv = self.store.get_conversation(cid)
        self.store.set_pinned(cid, not conv.pinned)
        self.refresh()
        self.changed.emit()

    def duplicate(self, cid: int) -> None:
        self.store.duplicate_conversation(cid)
        self.refresh()
        self.changed.emit()

    def delete(self, cid: int, confirm: bool = True) -> None:
        conv = self.store.get_conversation(cid)
        if confirm:
            answer = QMessageBox.question(
                self, "Delete chat",
                f"Delete “{conv.title}” and all its branches? This cannot be undone.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel)
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.store.delete_conversation(cid)
        self.deleted.emit(cid)
        self.refresh()
