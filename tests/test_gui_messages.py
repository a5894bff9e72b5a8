"""Issue #10.5 and #10.11 in the real window (no model needed): a search hit opens the
branch that holds it, scrolled to the message and highlighted, its snippet drawn with the
match in bold; a reply's footer shows TTFT and its time; a message is deleted with its
replies from its context menu and Undo brings them back; the shown branch is copied as
Markdown from the Chat menu and the message's menu."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import time  # noqa: E402

from PySide6.QtCore import QPoint, Qt, QTimer  # noqa: E402
from PySide6.QtGui import QContextMenuEvent, QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.window.tree.sidebar import HIT_ROLE, SNIPPET_ROLE, SPANS_ROLE, draw_marked  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _window(open_window, data_dir):
    return open_window(data_dir, wait=False, start_engine=False)


def _capitals(data_dir) -> dict:
    """A chat whose first question was edited: the France branch is active; the Spain branch
    holds "Madrid" early, then 20 more turns (so the hit is far above the newest message)."""
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Capitals")
        spain = s.add_message(conv.id, None, "user", "What is the capital of Spain?")
        madrid = s.add_message(conv.id, spain.id, "assistant", "The capital of Spain is Madrid.")
        parent = madrid.id
        for i in range(20):
            parent = s.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant",
                                   f"Another turn about trains, number {i}.\n\nWith a second paragraph.").id
        france = s.add_message(conv.id, None, "user", "What is the capital of France?")
        paris = s.add_message(conv.id, france.id, "assistant", "Paris.")
        return {"cid": conv.id, "madrid": madrid.id, "spain_leaf": parent, "paris": paris.id}


def _menu_choose(qtbot, bubble, text: str) -> None:
    """Right-click ``bubble`` and choose ``text`` from its menu."""
    chosen = []

    def choose():
        action = next(a for a in bubble.menu.actions() if a.text() == text)
        action.trigger()
        bubble.menu.close()
        chosen.append(text)

    QTimer.singleShot(50, choose)
    center = bubble.rect().center()
    QApplication.sendEvent(bubble, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, center,
                                                     bubble.mapToGlobal(center)))
    qtbot.waitUntil(lambda: bool(chosen))


def test_a_search_hit_opens_its_branch_scrolled_to_the_message_highlighted(qtbot, open_window, data_dir):
    ids = _capitals(data_dir)
    w = _window(open_window, data_dir)
    w.resize(1100, 600)
    assert w.conversation_id == ids["cid"]
    assert [m.id for m in w.store.active_path(ids["cid"])][-1] == ids["paris"]  # the other branch
    qtbot.keyClicks(w.sidebar.search, "Madrid")
    qtbot.waitUntil(lambda: w.sidebar.list.item(0).data(SNIPPET_ROLE) is not None, timeout=3000)
    assert w.sidebar.ids() == [ids["cid"]]
    item = w.sidebar.list.item(0)
    assert item.data(HIT_ROLE) == ids["madrid"]
    snippet, spans = item.data(SNIPPET_ROLE), item.data(SPANS_ROLE)
    assert "«" not in snippet and [snippet[a:b] for a, b in spans] == ["Madrid"]
    rect = w.sidebar.list.visualItemRect(item)
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert w.store.get_conversation(ids["cid"]).active_leaf_id == ids["spain_leaf"]
    bubble = w.transcript.widget_for(ids["madrid"])
    assert bubble is not None and bubble.highlighted
    assert [b for b in w.transcript.widgets if b.highlighted] == [bubble]

    def in_view() -> bool:
        top = bubble.mapTo(w.transcript.viewport(), QPoint(0, 0)).y()
        return 0 <= top and top + 20 <= w.transcript.viewport().height()

    qtbot.waitUntil(in_view, timeout=3000)
    qtbot.wait(300)  # layout settling must not scroll it away again
    assert in_view()
    assert w.transcript.verticalScrollBar().maximum() > 0  # the branch is taller than the view
    assert w.transcript.verticalScrollBar().value() < w.transcript.verticalScrollBar().maximum()
    w.grab().save(str(data_dir / "search_hit.png"))


def test_snippet_match_is_drawn_bold(qtbot):
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QColor, QFont, QImage, QPainter

    def render(spans) -> QImage:
        img = QImage(400, 24, QImage.Format.Format_RGB32)
        img.fill(QColor("white"))
        p = QPainter(img)
        p.setPen(QColor("black"))
        draw_marked(p, QRect(0, 0, 400, 24), QFont(), "<b>x</b> is the capital Madrid", spans)
        p.end()
        return img

    plain, bold = render([]), render([(24, 30)])
    assert plain != bold  # "Madrid" is drawn differently (bold)
    # the tag is drawn as text: the same pixels left of the match in both
    assert plain.copy(0, 0, 60, 24) == bold.copy(0, 0, 60, 24)


def test_reply_footer_shows_tokens_per_second_ttft_and_time(qtbot, open_window, data_dir):
    stats = {"generated_tokens": 24, "decode_tokens_per_s": 130.4, "ttft_ms": 85.2,
             "prompt_tokens": 30, "restored_tokens": 0, "prefilled_tokens": 30}
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Facts")
        u = s.add_message(conv.id, None, "user", "Hi")
        a = s.add_message(conv.id, u.id, "assistant", "Hello!", stats=stats)
    w = _window(open_window, data_dir)
    footer = w.transcript.widget_for(a.id).footer.text()
    when = time.strftime("%H:%M", time.localtime(w.store.get_message(a.id).created_at))
    assert footer == f"24 tokens · 130 tok/s · TTFT 85 ms · prefilled 30 · {when}"


def test_delete_a_message_with_its_replies_from_its_menu_then_undo(qtbot, open_window, data_dir):
    ids = _capitals(data_dir)
    w = _window(open_window, data_dir)
    w.navigator.open_search_hit(ids["cid"], ids["madrid"])
    before = [(m.role, m.content) for m in w.store.active_path(ids["cid"])]
    _menu_choose(qtbot, w.transcript.widget_for(ids["madrid"]), "Delete message and its replies")
    path = w.store.active_path(ids["cid"])
    assert [m.content for m in path] == ["What is the capital of Spain?"]
    assert len(w.store.tree(ids["cid"])) == 3  # Spain's question, France's question and reply
    assert [b.message.id for b in w.transcript.widgets] == [path[0].id]
    assert w.banner.isVisible() and w.banner.text == "Deleted 21 messages."
    w.banner.button("Undo").click()
    assert [(m.role, m.content) for m in w.store.active_path(ids["cid"])] == before
    w.transcript.finish_building()  # older bubbles are built lazily, as they scroll into view
    assert [(b.message.role, b.message.content) for b in w.transcript.widgets] == before


def test_copy_the_branch_as_markdown_from_the_menu_and_the_message(qtbot, open_window, data_dir):
    ids = _capitals(data_dir)
    w = _window(open_window, data_dir)
    clip = QGuiApplication.clipboard()
    clip.setText("")
    w.menu_actions["copy_conversation_markdown"].trigger()
    text = clip.text()
    assert text.startswith("# Capitals\n")
    assert "## User (branch 2/2) · message" in text and "```text\nWhat is the capital of France?\n```" in text
    assert "```markdown\nParis.\n```" in text and "Spain" not in text
    clip.setText("")
    _menu_choose(qtbot, w.transcript.widget_for(ids["paris"]), "Copy conversation as Markdown")
    assert clip.text() == text


def _vertical_run(image, color, tolerance: int = 12) -> int:
    """The longest vertical run of pixels within ``tolerance`` of ``color`` in ``image``."""
    best = 0
    for x in range(image.width()):
        run = 0
        for y in range(image.height()):
            p = image.pixelColor(x, y)
            if max(abs(p.red() - color.red()), abs(p.green() - color.green()), abs(p.blue() - color.blue())) <= tolerance:
                run += 1
                best = max(best, run)
            else:
                run = 0
    return best


def test_a_table_in_a_message_has_a_visible_grid_and_images_stay_links(qtbot, open_window, data_dir):
    """#10.9: a Markdown table is drawn with grid lines that show on the bubble (the lines
    run the table's height); a local and a remote image are links, never loaded."""
    from PySide6.QtGui import QColor

    text = ("| city | km |\n|---|---|\n| Toledo | 70 |\n| Segovia | 90 |\n\n"
            "![map](/home/me/map.png) ![logo](https://example.com/logo.png)")
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Tables")
        u = s.add_message(conv.id, None, "user", text)
        a = s.add_message(conv.id, u.id, "assistant", text)
    w = _window(open_window, data_dir)
    qtbot.waitExposed(w)
    for mid in (u.id, a.id):
        body = w.transcript.widget_for(mid).body
        assert "<img" not in body.text()
        assert 'href="/home/me/map.png">Image: map</a>' in body.text()
        assert 'href="https://example.com/logo.png">Image: logo</a>' in body.text()
        image = body.grab().toImage()
        rows = _line_height(body) * 3  # three table rows, each taller than a line of text
        assert _vertical_run(image, QColor(w.look.colors.muted)) >= rows, mid


def _line_height(widget) -> int:
    from PySide6.QtGui import QFontMetrics

    return QFontMetrics(widget.font()).height()


def test_words_in_different_messages_find_the_chat(qtbot, open_window, data_dir):
    ids = _capitals(data_dir)
    with ChatStore(data_dir / CHATS_DB) as s:
        other = s.create_conversation(title="Other")
        s.add_message(other.id, None, "user", "Madrid only.")
    w = _window(open_window, data_dir)
    qtbot.keyClicks(w.sidebar.search, "madrid paris")  # two messages on two branches
    qtbot.waitUntil(lambda: w.sidebar.list.item(0).data(SNIPPET_ROLE) is not None, timeout=3000)
    assert w.sidebar.ids() == [ids["cid"]]


def test_changes_from_another_process_are_shown_before_the_window_sends(qtbot, open_window, data_dir):
    """A CLI turn on the chat the window shows (another connection, as another process):
    sending from the window first redraws the branch and gives the text back, so the new
    message never lands under messages the user has not seen; activating the window redraws."""
    ids = _capitals(data_dir)
    w = open_window(data_dir)  # with the engine: a send that could go ahead
    w.show_conversation(ids["cid"])
    leaf = w.store.active_path(ids["cid"])[-1]
    with ChatStore(data_dir / CHATS_DB) as other:  # another connection: what the CLI would write
        q = other.add_message(ids["cid"], leaf.id, "user", "Written from the command line")
        other.add_message(ids["cid"], q.id, "assistant", "Answered there")
        other.set_active_leaf(ids["cid"], q.id + 1)
    w.composer.input.setPlainText("From the window")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.composer.input.toPlainText() == "From the window" and not w.chat.streaming
    assert "changed elsewhere" in w.banner.text
    w.transcript.finish_building()
    assert [b.message.content for b in w.transcript.widgets][-2:] == ["Written from the command line",
                                                                      "Answered there"]
    with ChatStore(data_dir / CHATS_DB) as other:
        other.rename(ids["cid"], "Renamed elsewhere")
    assert w.navigator.show_external_changes()  # what activating the window runs
    assert not w.navigator.show_external_changes()  # nothing new since
    titles = [w.sidebar.list.item(i).data(Qt.ItemDataRole.DisplayRole) for i in range(w.sidebar.list.count())]
    assert "Renamed elsewhere" in titles
