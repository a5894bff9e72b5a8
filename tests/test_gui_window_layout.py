"""The window's layout at 800, 1180 and 1600 px, its status bar, its tree panel and its
small touches (issue #29, items 2, 4, 8, 10 and 13), in the real window without a model."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

from PySide6.QtCore import QPoint, QRect, Qt, QTimer  # noqa: E402
from PySide6.QtGui import QFontMetrics, QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication, QHeaderView, QMenu, QTreeView, QWidget  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

STATS = {"prompt_tokens": 3800, "restored_tokens": 3774, "restore_ms": 35.0, "prefilled_tokens": 26,
         "prefill_ms": 310.0, "generated_tokens": 440, "decode_tokens_per_s": 46.2, "ttft_ms": 4.0,
         "prepared_tokens": 0}
CODE_REPLY = ("```python\ndef reverse_string(s):\n    return s[::-1]  # a comment long enough to need "
              "wrapping in a narrow window, and then some more words\n```\nThis function uses slicing to "
              "create a reversed copy of the input string, with a long explanation after it.")


def _seed(data_dir, show_tree: bool = True) -> dict:
    """A chat whose first message has an edited sibling; the shown branch has a code reply."""
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 1, "show_tree": show_tree}))
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Once upon a time")
        dragon = s.add_message(conv.id, None, "user", "Once upon a time there was a dragon. Write a Python "
                               "function that reverses a string, and explain how it works in detail.")
        princess = s.add_message(conv.id, None, "user", "Once upon a time there was a princess. What is "
                                 "the capital of France?")
        s.add_message(conv.id, princess.id, "assistant", "Paris.")
        reply = s.add_message(conv.id, dragon.id, "assistant", CODE_REPLY, stats=STATS)
        follow = s.add_message(conv.id, reply.id, "user", "Now explain it in one sentence, please.")
        last = s.add_message(conv.id, follow.id, "assistant", "It reads the string backwards. " * 6, stats=STATS)
        s.set_active_leaf(conv.id, last.id)
    return {"cid": conv.id, "dragon": dragon.id, "princess": princess.id, "reply": reply.id}


def _window(open_window, data_dir, width: int | None = None):
    w = open_window(data_dir, wait=False, start_engine=False)
    if width is not None:
        _resize(w, width)
    return w


def _resize(w, width: int, height: int = 760) -> None:
    w.resize(width, height)
    for _ in range(6):
        QApplication.processEvents()
    w.transcript.finish_building()
    for _ in range(6):
        QApplication.processEvents()


def _rect_in_window(widget: QWidget, window: QWidget) -> QRect:
    return QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())


def test_at_800_and_1600_px_no_message_or_composer_runs_under_the_tree(qtbot, open_window, data_dir):
    _seed(data_dir)
    w = _window(open_window, data_dir)
    wait_for_tree(qtbot, w)
    for width in (800, 1600):
        _resize(w, width, 760 if width == 800 else 1000)
        assert w.width() == width and w.tree.isVisible()
        tree = _rect_in_window(w.tree, w)
        assert len(w.transcript.widgets) == 4
        for bubble in w.transcript.widgets:
            assert bubble.isVisible()
            rect = _rect_in_window(bubble, w)
            assert not rect.intersects(tree), (width, rect, tree)
            assert rect.right() < _rect_in_window(w.transcript.viewport(), w).right() + 1, (width, rect)
            for name, button in bubble.buttons.items():
                assert not _rect_in_window(button, w).intersects(tree), (width, name)
        for part in (w.composer, w.composer.input, w.composer.button):
            assert not _rect_in_window(part, w).intersects(tree), (width, part)
        box = w.composer.input  # the placeholder is one line, not four
        room = box.viewport().width() - 2 * box.document().documentMargin()
        assert box.fontMetrics().horizontalAdvance(box.placeholderText()) <= room, width
        assert "Enter sends" in box.placeholderText()


def test_the_tree_panel_grows_with_the_window_and_siblings_read_apart(qtbot, open_window, data_dir):
    ids = _seed(data_dir)
    w = _window(open_window, data_dir, 800)
    wait_for_tree(qtbot, w)
    narrow = w.tree.width()
    _resize(w, 1600, 1000)
    wide = w.tree.width()
    assert wide >= narrow + 150  # a share of the window, not a fixed width
    assert wide >= 0.2 * 1600
    scroll = w.tree.scroll
    qtbot.waitUntil(lambda: w.tree.canvas.width() >= scroll.viewport().width() > 0, timeout=3000)
    assert scroll.horizontalScrollBar().maximum() == 0  # the whole tree at 1600 px
    assert w.tree.canvas.width() >= w.tree.canvas.tree_layout.width
    canvas = w.tree.canvas
    fm = QFontMetrics(canvas.node_font())
    from app.window.tree.tree_layout import NODE_W

    room = NODE_W - 30  # the role letter and the padding take the rest
    dragon = canvas.drawn_label(ids["dragon"], room, fm)
    princess = canvas.drawn_label(ids["princess"], room, fm)
    assert fm.horizontalAdvance(dragon) <= room and fm.horizontalAdvance(princess) <= room
    assert "dragon" in dragon and "princess" in princess  # the words that tell them apart
    tip = canvas.tooltip_for(ids["dragon"]).split("\n")
    assert tip[1] == ("“Once upon a time there was a dragon. Write a Python function that reverses a string, "
                      "and explain how it works in detail.”")


def test_the_reply_figures_fit_beside_the_context_figure_at_1180_px(qtbot, open_window, data_dir):
    _seed(data_dir)
    w = _window(open_window, data_dir, 1180)
    status = w.status
    status.set_context(3800, 8192)
    status.model_label.setText("SmolLM2-135M-Instruct.Q4_1 · 135M")
    status.show_stats({**STATS, "prepared_tokens": 3622, "typed_tokens": 3600})
    _resize(w, 1180)
    full = status.stats_label.text()
    assert full.startswith("prefilled while you typed: 3,600 tokens") and full.endswith("46 tok/s")
    label, context = _rect_in_window(status.stats_label, w), _rect_in_window(status.context_label, w)
    assert label.right() < context.left()  # no overlap with the context figure
    shown = status.stats_label.shown_text()
    fm = QFontMetrics(status.stats_label.font())
    assert fm.horizontalAdvance(shown) <= status.stats_label.contentsRect().width()
    assert shown.endswith("46 tok/s")  # the speed is never the part cut off
    assert fm.horizontalAdvance(status.context_label.text()) <= status.context_label.width()
    if shown != full:
        assert "3,600" in status.stats_label.toolTip()  # the whole line on hover
    model = status.model_label
    assert QFontMetrics(model.font()).horizontalAdvance(model.shown_text()) <= model.contentsRect().width()


def test_progress_in_the_status_bar_is_not_clipped(qtbot, open_window, data_dir):
    _seed(data_dir)
    w = _window(open_window, data_dir, 800)
    bar = w.status.progress
    fm = QFontMetrics(bar.font())
    w.status.reply_progress("prefill", 1536, 1786)
    QApplication.processEvents()
    assert bar.isVisible() and bar.text() == "Prefilling 1,536/1,786 tokens"
    assert fm.horizontalAdvance(bar.text()) + 2 * fm.averageCharWidth() <= bar.width()
    assert bar.height() <= fm.height() * 2  # one line, not wrapped
    w.status.loading(68, 100)
    QApplication.processEvents()
    assert bar.text() == "Loading model… 68%"
    assert fm.horizontalAdvance(bar.text()) + 2 * fm.averageCharWidth() <= bar.width()
    context = _rect_in_window(w.status.context_label, w)
    assert not _rect_in_window(bar, w).intersects(context)


def _open_menu_and_close(qtbot, sidebar, row: int) -> QMenu:
    """Right-click row ``row`` of the sidebar (a real press, then its menu), then close the menu."""
    rect = sidebar.list.visualItemRect(sidebar.list.item(row))
    seen = []

    def close():
        seen.append(sidebar.menu)
        sidebar.menu.close()

    QTimer.singleShot(50, close)
    qtbot.mousePress(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
    sidebar.list.customContextMenuRequested.emit(rect.center())
    qtbot.waitUntil(lambda: bool(seen))
    qtbot.mouseRelease(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
    return seen[0]


def test_sidebar_highlight_pin_and_the_two_deletes(qtbot, open_window, data_dir):
    ids = _seed(data_dir)
    with ChatStore(data_dir / CHATS_DB) as s:
        other = s.create_conversation(title="Another chat").id
        s.add_message(other, None, "user", "Hello")
        s.set_pinned(ids["cid"], True)
    w = _window(open_window, data_dir, 1180)
    w.show_conversation(ids["cid"])
    sidebar = w.sidebar
    assert sidebar.ids()[0] == ids["cid"]  # pinned first
    menu = _open_menu_and_close(qtbot, sidebar, 1)  # the other chat's menu
    selected = [i.data(Qt.ItemDataRole.UserRole) for i in sidebar.list.selectedItems()]
    assert selected == [ids["cid"]]  # the chat shown keeps the highlight
    assert w.conversation_id == ids["cid"]
    tips = {a.text(): a.toolTip() for a in menu.actions() if a.text()}
    assert "Undo" in tips["Delete"] and "stays on disk" in tips["Delete"]
    assert "Undo" in tips["Delete and forget"] and "KV cache" in tips["Delete and forget"]
    assert tips["Delete"] != tips["Delete and forget"]
    pinned = sidebar.list.item(0)
    assert pinned.data(Qt.ItemDataRole.AccessibleTextRole).startswith("Pinned: ")
    assert "Pinned" in pinned.toolTip()
    # the pin is a drawn shape taller than a dot: rows of ink to the left of the title
    image = sidebar.list.viewport().grab(sidebar.list.visualItemRect(pinned)).toImage()
    background = image.pixelColor(image.width() // 2, 1)
    inked = {y for y in range(image.height()) for x in range(6, 22)
             if abs(image.pixelColor(x, y).lightness() - background.lightness()) > 60}
    assert len(inked) >= 9


def test_copy_code_says_copied_and_a_search_hit_is_marked(qtbot, open_window, data_dir):
    ids = _seed(data_dir)
    w = _window(open_window, data_dir, 1180)
    bubble = w.transcript.widget_for(ids["reply"])
    assert "Copy code</a>" in bubble.body.text()
    bubble.body.linkActivated.emit("copy:0")
    assert QGuiApplication.clipboard().text().startswith("def reverse_string(s):")
    assert "Copied</a>" in bubble.body.text() and "Copy code</a>" not in bubble.body.text()
    qtbot.waitUntil(lambda: "Copy code</a>" in bubble.body.text(), timeout=3000)
    qtbot.mouseClick(bubble.buttons["copy"], Qt.MouseButton.LeftButton)
    assert bubble.buttons["copy"].text() == "Copied"
    qtbot.waitUntil(lambda: bubble.buttons["copy"].text() == "Copy", timeout=3000)

    qtbot.keyClicks(w.sidebar.search, "slicing")
    qtbot.waitUntil(lambda: w.sidebar.list.item(0).data(Qt.ItemDataRole.UserRole + 5) is not None, timeout=3000)
    rect = w.sidebar.list.visualItemRect(w.sidebar.list.item(0))
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    hit = w.transcript.widget_for(ids["reply"])
    mark = f'<span style="background-color:{w.look.colors.search_mark};">slicing</span>'
    assert hit.highlighted and mark in hit.body.text()
    assert [b for b in w.transcript.widgets if b.marked] == [hit]


def test_search_marks_never_touch_markup():
    from app.window.transcript.message_widget import mark_terms

    rich = '<p style="color:#123">A &amp; b <a href="copy:0">span amp</a></p>'
    out = mark_terms(rich, ["amp", "span", "<b>"], "#ff0")
    assert out.count("background-color:#ff0") == 2  # "span" and "amp" in the link's text only
    assert '<p style="color:#123">A &amp; b ' in out and 'href="copy:0"' in out
    assert "<b>" not in out


def test_open_model_starts_in_the_models_folder_with_whole_sizes(qtbot, open_window, data_dir):
    _seed(data_dir)
    models = data_dir / "models"
    models.mkdir()
    with open(models / "tiny.gguf", "wb") as f:  # sparse: 93.3 MiB on paper, nothing on disk
        f.truncate(int(93.3 * 1024 * 1024))
    w = _window(open_window, data_dir, 1180)
    from engine.model_file import default_model_path

    w.model.good_path = str(default_model_path())  # the embedded model, inside site-packages
    assert w.model.dialog_folder() == models
    w.model.open_dialog()
    dialog = w.model.dialog
    try:
        assert dialog is not None and dialog.isVisible()
        assert dialog.directory().absolutePath() == str(models)
        view = dialog.findChild(QTreeView, "treeView")
        qtbot.waitUntil(lambda: view.model().rowCount(view.rootIndex()) >= 1, timeout=5000)
        row = view.model().index(0, 1, view.rootIndex())
        size = row.data()
        assert size == "93.3 MiB"
        assert view.header().sectionResizeMode(1) == QHeaderView.ResizeMode.ResizeToContents
        # The whole size fits: the column is at least as wide as its content needs with the
        # style's item padding (7 px on one machine, 8 on another, so not a constant).
        qtbot.waitUntil(lambda: view.columnWidth(1) >= view.sizeHintForColumn(1)
                        > view.fontMetrics().horizontalAdvance(size), timeout=3000)
    finally:
        dialog.reject()


def test_recent_models_lists_each_file_once(qtbot, open_window, data_dir, tmp_path):
    _seed(data_dir)
    real = tmp_path / "models" / "a.gguf"
    real.parent.mkdir()
    real.write_bytes(b"GGUF")
    link = tmp_path / "link.gguf"
    link.symlink_to(real)
    w = _window(open_window, data_dir, 1180)
    from engine.model_file import default_model_path

    w.settings.update(recent_models=[str(real), str(link), str(tmp_path / "models" / ".." / "models" / "a.gguf"),
                                     str(default_model_path())])
    menu = QMenu()
    w.model.fill_recent(menu)
    names = [a.text() for a in menu.actions() if a.text()]
    assert names == ["a.gguf", "Default model (SmolLM2-135M)"]
    w.settings.remember_model(str(link))
    assert w.settings.recent_models[0] == str(real)  # remembered once, by the file it names


def test_window_size_and_panels_are_remembered(qtbot, open_window, data_dir):
    _seed(data_dir)
    w = _window(open_window, data_dir)
    assert (w.width(), w.height()) == (1180, 760)  # the first start
    _resize(w, 1000, 700)
    w.splitter.setSizes([200, 480, 320])
    QApplication.processEvents()
    sizes = w.splitter.sizes()
    w.close()
    saved = json.loads((data_dir / "settings.json").read_text())["window_layout"]
    assert saved == {"width": 1000, "height": 700, "panels": sizes}
    again = _window(open_window, data_dir)
    for _ in range(4):
        QApplication.processEvents()
    assert (again.width(), again.height()) == (1000, 700)
    assert again.splitter.sizes() == sizes
