"""Issue #10.10 in the real window (no model needed): the tree panel draws one root, the
conversation, so an edited first message is connected; each node shows the first words of
its message as plain text; the tree works from the keyboard (arrows move, Enter opens);
every control of the window and its dialogs has an accessible name."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QAccessible  # noqa: E402
from PySide6.QtWidgets import QComboBox, QLineEdit, QPlainTextEdit, QWidget  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402

from app.window.shell.a11y import CONTROLS, is_internal  # noqa: E402
from app.window.tree.tree_panel import ROOT_ID, R  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _edited_first(data_dir) -> dict:
    """A chat whose first message was edited: two root messages, the second one shown."""
    (data_dir / "settings.json").write_text(json.dumps({"show_tree": True}))
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Capitals <b>quiz</b>")
        france = s.add_message(conv.id, None, "user", "What is the capital of France?")
        paris = s.add_message(conv.id, france.id, "assistant", "Paris.")
        spain = s.add_message(conv.id, None, "user", "What is the capital of Spain?")
        madrid = s.add_message(conv.id, spain.id, "assistant", "<b>Madrid</b>, of course.")
        madrid2 = s.add_message(conv.id, spain.id, "assistant", "It is Madrid.")
        return {"cid": conv.id, "france": france.id, "paris": paris.id, "spain": spain.id,
                "madrid": madrid.id, "madrid2": madrid2.id}


def _window(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    w.resize(1400, 800)
    wait_for_tree(qtbot, w)
    return w


def test_one_root_connects_an_edited_first_message(qtbot, open_window, data_dir):
    ids = _edited_first(data_dir)
    w = _window(qtbot, open_window, data_dir)
    canvas = w.tree.canvas
    assert canvas.root is not None and canvas.label_of(ROOT_ID) == "Capitals <b>quiz</b>"
    roots = [n for n in canvas.nodes if n.message.parent_id in (None, ROOT_ID)]
    assert sorted(n.message.id for n in roots) == [ids["france"], ids["spain"]]
    assert all(n.message.parent_id == ROOT_ID for n in roots)  # hung under the conversation
    top = canvas.center_of(ROOT_ID)
    assert all(canvas.center_of(n.message.id).y() > top.y() for n in roots)
    # an edge is drawn from the conversation node down to each first message
    image = canvas.grab().toImage()
    background = image.pixelColor(1, image.height() - 2)
    for n in roots:
        c = canvas.center_of(n.message.id)
        mid_x, mid_y = int((top.x() + c.x()) / 2), int((top.y() + R + c.y() - R) / 2)
        near = [image.pixelColor(x, y) for x in range(mid_x - 3, mid_x + 4) for y in range(mid_y - 3, mid_y + 4)]
        assert any(p != background for p in near), n.message.id


def test_nodes_show_the_first_words_as_plain_text(qtbot, open_window, data_dir):
    ids = _edited_first(data_dir)
    w = _window(qtbot, open_window, data_dir)
    canvas = w.tree.canvas
    assert canvas.label_of(ids["spain"]) == "What is the capital of Spain?"
    assert canvas.label_of(ids["madrid"]) == "<b>Madrid</b>, of course."  # drawn as typed
    w.tree.grab().save(str(data_dir / "tree.png"))


def test_the_tree_works_from_the_keyboard(qtbot, open_window, data_dir):
    ids = _edited_first(data_dir)
    w = _window(qtbot, open_window, data_dir)
    canvas = w.tree.canvas
    assert canvas.accessibleName() == "Conversation tree"
    canvas.setFocus()
    qtbot.waitUntil(canvas.hasFocus)
    assert canvas.current == ids["madrid2"]  # the active leaf
    assert canvas.accessibleDescription() == "Assistant, version 2 of 2, on the shown branch: It is Madrid."
    qtbot.keyClick(canvas, Qt.Key.Key_Left)
    assert canvas.current == ids["madrid"]
    qtbot.keyClick(canvas, Qt.Key.Key_Return)  # open that branch
    wait_for_tree(qtbot, w)
    assert w.store.active_path(ids["cid"])[-1].id == ids["madrid"]
    assert w.transcript.widgets[-1].message.id == ids["madrid"]
    qtbot.keyClick(canvas, Qt.Key.Key_Up)
    assert canvas.current == ids["spain"]
    qtbot.keyClick(canvas, Qt.Key.Key_Left)  # the edited first message's sibling
    assert canvas.current == ids["france"]
    qtbot.keyClick(canvas, Qt.Key.Key_Up)
    assert canvas.current == ROOT_ID
    assert canvas.accessibleDescription() == "Conversation: Capitals <b>quiz</b>"
    qtbot.keyClick(canvas, Qt.Key.Key_Down)  # down the shown branch
    assert canvas.current == ids["spain"]
    qtbot.keyClick(canvas, Qt.Key.Key_Left)
    qtbot.keyClick(canvas, Qt.Key.Key_Down)
    assert canvas.current == ids["paris"]
    qtbot.keyClick(canvas, Qt.Key.Key_Enter)
    wait_for_tree(qtbot, w)
    assert [m.id for m in w.store.active_path(ids["cid"])] == [ids["france"], ids["paris"]]
    assert canvas.hasFocus() and canvas.current == ids["paris"]  # the redraw keeps the place


def _unnamed(root: QWidget) -> list[str]:
    """Visible controls under ``root`` that a screen reader could not name in words; inputs,
    lists and combo boxes need a name of their own (Qt would read their content)."""
    bad = []
    for c in root.findChildren(QWidget):
        if not isinstance(c, CONTROLS) or is_internal(c) or not c.isVisibleTo(root):
            continue
        iface = QAccessible.queryAccessibleInterface(c)
        name = iface.text(QAccessible.Text.Name) if iface is not None else ""
        own = c.accessibleName() if isinstance(c, (QLineEdit, QPlainTextEdit, QComboBox)) or \
            c.inherits("QAbstractItemView") else name
        if not any(ch.isalpha() for ch in name) or not own:
            bad.append(f"{type(c).__name__} {c.objectName()!r} named {name!r}")
    return bad


def test_every_control_has_an_accessible_name(qtbot, open_window, data_dir):
    ids = _edited_first(data_dir)
    w = _window(qtbot, open_window, data_dir)
    qtbot.waitExposed(w)
    qtbot.keyClicks(w.sidebar.search, "capital")  # the search box's clear button shows
    w.banner.show_message("A message with a close button.", "info", [("Undo", lambda: None)])
    bubble = w.transcript.widget_for(ids["madrid2"])
    assert "prev" in bubble.buttons  # the ‹ 2/2 › navigator is there
    w.transcript.widget_for(ids["spain"]).begin_edit()  # the inline editor
    assert _unnamed(w) == []
    assert bubble.buttons["prev"].accessibleName() == "Previous version"
    w.open_settings()
    dialog = w.settings_flow.dialog
    qtbot.waitExposed(dialog)
    assert _unnamed(dialog) == []
    dialog.reject()
    w.links.confirm("https://example.com/a?b=1")
    qtbot.waitExposed(w.links.dialog)
    assert _unnamed(w.links.dialog) == []
    w.links.dialog.reject()


def test_a_node_reads_as_text_not_as_markdown_syntax():
    from types import SimpleNamespace

    from app.window.tree.tree_panel import node_label

    def label(text: str) -> str:
        return node_label(SimpleNamespace(content=text, status="complete"))

    assert label("```python\ndef reverse(s):\n    return s[::-1]\n```") == "def reverse(s): return s[::-1]"
    assert label("# Title\n**Bold**, `code` and [a link](http://x)") == "Title Bold, code and a link"
    assert label("- first\n- *second*\n3. third") == "first second third"
    assert label("snake_case and 2 * 3 * 4") == "snake_case and 2 * 3 * 4"  # not emphasis
    assert label("<b>Madrid</b> &amp; more") == "<b>Madrid</b> &amp; more"  # still drawn as typed
