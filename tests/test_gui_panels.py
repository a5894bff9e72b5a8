"""Settings dialog, themes and the tree panel in the real window, without a model."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QPalette  # noqa: E402
from PySide6.QtWidgets import QApplication, QDialogButtonBox  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402

from app.window.shell import theme  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def test_settings_dialog_saves_sampling_and_system_prompt(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    cid = w.store.create_conversation(title="Tuned").id
    w.show_conversation(cid)
    w.open_settings()
    dlg = w.settings_flow.dialog
    assert dlg is not None and dlg.isVisible()
    dlg.system_prompt.setPlainText("  You answer in French.  ")
    dlg.temperature.setValue(0.3)
    dlg.top_p.setValue(0.8)
    dlg.top_k.setValue(12)
    dlg.min_p.setValue(0.1)
    dlg.repeat_penalty.setValue(1.2)
    dlg.seed.setText("42")
    dlg.max_tokens.setValue(77)
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert w.settings_flow.dialog is None
    conv = w.store.get_conversation(cid)
    assert conv.system_prompt == "You answer in French."
    assert conv.sampling == {"temperature": 0.3, "top_p": 0.8, "top_k": 12, "min_p": 0.1,
                             "repeat_penalty": 1.2, "seed": 42, "max_tokens": 77,
                             "thinking": "", "thinking_budget": None}  # no thinking control without a model
    with ChatStore(data_dir / CHATS_DB) as store:  # on disk, not only in memory
        assert store.get_conversation(cid).sampling["max_tokens"] == 77


def test_settings_dialog_cancel_changes_nothing(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    cid = w.store.create_conversation(title="Untouched").id
    w.show_conversation(cid)
    before = w.store.get_conversation(cid)
    w.open_settings()
    w.settings_flow.dialog.temperature.setValue(1.5)
    w.settings_flow.dialog.reject()
    assert w.store.get_conversation(cid).sampling == before.sampling


def test_theme_switch_changes_the_palette(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    app = QApplication.instance()
    try:
        w.look.set_theme("dark")
        assert app.palette().color(QPalette.ColorRole.Window).name() == theme.DARK.window
        assert app.palette().color(QPalette.ColorRole.Text).name() == theme.DARK.text
        assert w.look.colors is theme.DARK
        assert json.loads((data_dir / "settings.json").read_text())["theme"] == "dark"
        w.look.set_theme("light")
        assert app.palette().color(QPalette.ColorRole.Window).name() == theme.LIGHT.window
        assert w.look.colors is theme.LIGHT
    finally:
        theme.apply(app, "light")


def _wide_tree(data_dir, replies: int) -> tuple[int, int, list[int]]:
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="Tree")
        user = store.add_message(conv.id, None, "user", "Tell me   a story\nabout " + "dragons " * 30)
        ids = [store.add_message(conv.id, user.id, "assistant", f"Reply number {i}").id for i in range(replies)]
    return conv.id, user.id, ids


def test_tree_fits_without_scroll_bars_and_has_tooltips(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({"show_tree": True}))
    cid, user_id, replies = _wide_tree(data_dir, 2)
    w = open_window(data_dir, wait=False, start_engine=False)
    w.show_conversation(cid)
    wait_for_tree(qtbot, w)
    scroll = w.tree.scroll
    qtbot.waitUntil(lambda: w.tree.canvas.width() >= scroll.viewport().width() > 0, timeout=3000)
    assert not scroll.horizontalScrollBar().isVisible()
    assert scroll.horizontalScrollBar().maximum() == 0
    tip = w.tree.canvas.tooltip_for(user_id)
    lines = tip.split("\n")
    assert lines[0] == "You"
    # the whole start of the text on one line (issue #29: not cut after a few words)
    assert lines[1] == "“Tell me a story about " + " ".join(["dragons"] * 30) + "”"
    assert w.tree.canvas.tooltip_for(replies[1]).split("\n") == ["Assistant", "“Reply number 1”"]
    assert "not stored" in w.tree.legend.text() and "active branch" in w.tree.legend.text()


def test_wide_tree_scrolls_to_the_active_leaf(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({"show_tree": True}))
    cid, user_id, replies = _wide_tree(data_dir, 20)
    w = open_window(data_dir, wait=False, start_engine=False)
    for target in (replies[-1], replies[0], replies[10]):
        w.chat.select(target)
        wait_for_tree(qtbot, w)
        qtbot.wait(30)
        scroll = w.tree.scroll
        bar = scroll.horizontalScrollBar()
        assert bar.maximum() > 0  # twenty leaves do not fit
        centre = w.tree.canvas.center_of(target)
        assert bar.value() <= centre.x() <= bar.value() + scroll.viewport().width(), target
        assert w.tree.canvas.leaf_id == target
    qtbot.mouseClick(w.tree.canvas, Qt.MouseButton.LeftButton,
                     pos=w.tree.canvas.center_of(replies[11]).toPoint())
    assert w.store.active_path(cid)[-1].id == replies[11]
