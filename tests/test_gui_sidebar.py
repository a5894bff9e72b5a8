"""The sidebar in the real window, without a model: rename, pin, duplicate, delete with undo,
search by message text, one-line rows with a relative date."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time  # noqa: E402

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QInputDialog  # noqa: E402

from app.window.tree.sidebar import DATE_ROLE, PINNED_ROLE, SNIPPET_ROLE, relative_date  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _seed(data_dir, titles_and_text: list[tuple[str, str]]) -> list[int]:
    """Conversations (oldest first) with one user message each; returns their ids."""
    ids = []
    with ChatStore(data_dir / CHATS_DB) as store:
        for title, text in titles_and_text:
            conv = store.create_conversation(title=title)
            store.add_message(conv.id, None, "user", text)
            ids.append(conv.id)
    return ids


def _window(open_window, data_dir):
    return open_window(data_dir, wait=False, start_engine=False)


def test_rename_through_the_dialog(qtbot, open_window, data_dir):
    a, b = _seed(data_dir, [("Old title", "hello"), ("Other", "hi")])
    w = _window(open_window, data_dir)

    def answer():
        dlg = QApplication.activeModalWidget()
        assert isinstance(dlg, QInputDialog)
        dlg.setTextValue("  Trip to Lisbon  ")
        dlg.accept()

    QTimer.singleShot(50, answer)
    w.sidebar.rename(a)
    assert w.store.get_conversation(a).title == "Trip to Lisbon"
    row = w.sidebar.list.item(w.sidebar.ids().index(a))
    assert row.text() == "Trip to Lisbon"
    assert row.toolTip().startswith("<qt>\u2068Trip to Lisbon\u2069<br>")  # escaped, shown as plain text


def test_pin_moves_to_top_and_unpin_moves_back(qtbot, open_window, data_dir):
    a, b, c = _seed(data_dir, [("First", "x"), ("Second", "y"), ("Third", "z")])
    w = _window(open_window, data_dir)
    assert w.sidebar.ids() == [c, b, a]  # newest first
    w.sidebar.toggle_pin(a)
    assert w.sidebar.ids() == [a, c, b]
    assert w.sidebar.list.item(0).data(PINNED_ROLE) is True
    assert w.store.get_conversation(a).pinned
    w.sidebar.toggle_pin(a)
    assert w.sidebar.ids() == [c, b, a]


def test_duplicate_copies_the_tree(qtbot, open_window, data_dir):
    (a,) = _seed(data_dir, [("Recipe", "How do I bake bread?")])
    w = _window(open_window, data_dir)
    copy = w.sidebar.duplicate(a)
    assert copy != a and copy in w.sidebar.ids()
    assert [m.content for m in w.store.active_path(copy)] == ["How do I bake bread?"]
    assert len(w.sidebar.ids()) == 2


def test_delete_hides_at_once_undo_brings_back(qtbot, open_window, data_dir):
    a, b = _seed(data_dir, [("Keep me", "one"), ("Delete me", "two")])
    w = _window(open_window, data_dir)
    w.show_conversation(b)
    w.sidebar.delete(b)
    assert w.sidebar.ids() == [a]
    assert w.conversation_id == a  # moved off the deleted chat
    assert w.banner.isVisible() and "Delete me" in w.banner.text
    assert w.store.get_conversation(b).title == "Delete me"  # not deleted yet
    w.banner.button("Undo").click()
    assert sorted(w.sidebar.ids()) == sorted([a, b])
    assert w.conversation_id == b
    assert not w.banner.isVisible()
    assert [m.content for m in w.store.active_path(b)] == ["two"]


def test_delete_is_carried_out_on_timeout_next_delete_and_close(qtbot, open_window, data_dir):
    a, b, c = _seed(data_dir, [("A", "1"), ("B", "2"), ("C", "3")])
    w = _window(open_window, data_dir)
    w.sidebar._delete_timer.setInterval(50)
    with qtbot.waitSignal(w.sidebar.delete_committed, timeout=5000) as blocker:
        w.sidebar.delete(a)
    assert blocker.args == [a]
    assert not w.banner.isVisible()
    assert a not in [x.id for x in w.store.list_conversations()]
    w.sidebar._delete_timer.setInterval(60_000)
    w.sidebar.delete(b)
    w.sidebar.delete(c)  # carries out b's delete; c is pending
    assert [x.id for x in w.store.list_conversations()] == [c]
    w.close()  # carries out c's delete
    with ChatStore(data_dir / CHATS_DB) as store:
        assert store.list_conversations() == []


def test_search_box_finds_a_chat_by_message_text(qtbot, open_window, data_dir):
    a, b = _seed(data_dir, [("Untitled one", "the capybara is the largest rodent"),
                            ("Untitled two", "weather in Oslo")])
    w = _window(open_window, data_dir)
    qtbot.keyClicks(w.sidebar.search, "capybara")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [a], timeout=3000)
    assert "capybara" in w.sidebar.list.item(0).data(SNIPPET_ROLE)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: sorted(w.sidebar.ids()) == sorted([a, b]), timeout=3000)
    qtbot.keyClicks(w.sidebar.search, "zebra")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [] and w.sidebar.list.count() == 1, timeout=3000)
    assert w.sidebar.list.item(0).text() == "No chats match."


def test_long_title_is_one_line_with_a_date(qtbot, open_window, data_dir):
    title = "A very long chat title that could never fit on one line of the sidebar " * 2
    (a,) = _seed(data_dir, [(title.strip(), "x")])
    w = _window(open_window, data_dir)
    lst = w.sidebar.list
    item = lst.item(0)
    assert not lst.wordWrap()
    assert item.data(DATE_ROLE) == "now"
    one_line = lst.fontMetrics().height()
    assert lst.visualItemRect(item).height() < 2 * one_line
    assert item.toolTip().startswith("<qt>\u2068" + title.strip() + "\u2069")  # the title isolated


def test_relative_date():
    now = time.mktime((2024, 3, 14, 15, 0, 0, 0, 0, -1))
    assert relative_date(now - 20, now) == "now"
    assert relative_date(now - 5 * 60, now) == "5 min ago"
    assert relative_date(now - 2 * 3600, now) == "2 h ago"
    assert relative_date(now - 24 * 3600, now) == "Yesterday"
    assert relative_date(now - 3 * 86400, now) == time.strftime("%a", time.localtime(now - 3 * 86400))
    assert relative_date(now - 40 * 86400, now) == "3 Feb"
    assert relative_date(now - 400 * 86400, now).endswith("2023")
