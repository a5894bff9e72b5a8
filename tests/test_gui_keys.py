"""Issue #29 items 1, 3 and 11 in the real window: Esc stops a reply whichever widget has the
focus (Chat → Stop reply shows Esc); Tab, Ctrl+Tab and Shift+Tab leave the message box
without typing a tab; every widget the keyboard reaches gets a visible outline in the light
and the dark theme; Down then Enter in search opens the result; the inline editor's keys
are the composer's, and it says so on screen."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel  # noqa: E402

from gui_helpers import REPLY_TIMEOUT_MS, new_chat, wait_for_tree  # noqa: E402

from app.window.shell import theme  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

LONG = {"max_tokens": 400}
STORY = "Write a long story about a dragon who learns to bake bread."


def focused(window):
    """The widget with the keyboard focus (the window itself when none has it)."""
    return QApplication.focusWidget() or window


def press(qtbot, window, key, modifier=Qt.KeyboardModifier.NoModifier):
    """A key press on the focused widget, as a keyboard gives it."""
    qtbot.keyClick(focused(window), key, modifier)


def _two_chats(data_dir) -> dict:
    with ChatStore(data_dir / CHATS_DB) as s:
        a = s.create_conversation(title="Baking")
        ua = s.add_message(a.id, None, "user", "How long should sourdough proof?")
        s.add_message(a.id, ua.id, "assistant", "About four hours at room temperature.")
        b = s.create_conversation(title="Capitals")
        ub = s.add_message(b.id, None, "user", "What is the capital of Portugal?")
        rb = s.add_message(b.id, ub.id, "assistant", "Lisbon.")
        return {"a": a.id, "b": b.id, "ub": ub.id, "rb": rb.id, "ua": ua.id}


def _bare_window(qtbot, open_window, data_dir, width=1180, **settings):
    (data_dir / "settings.json").write_text(json.dumps({"show_tree": True, **settings}))
    w = open_window(data_dir, wait=False, start_engine=False)
    w.resize(width, 760)
    activate(qtbot, w)
    wait_for_tree(qtbot, w)
    return w


def activate(qtbot, window) -> None:
    """Make ``window`` the active window (the keyboard's), as a click on it would."""
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=10_000)


def focus(qtbot, widget, reason=Qt.FocusReason.TabFocusReason) -> None:
    """Give ``widget`` the keyboard focus and wait until it has it."""
    widget.setFocus(reason)
    qtbot.waitUntil(widget.hasFocus, timeout=10_000)


# -- 1. Esc from anywhere ----------------------------------------------------------------


def test_esc_stops_a_reply_with_the_focus_anywhere_in_the_window(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 1, "show_tree": True}))
    w = open_window(data_dir)
    activate(qtbot, w)
    action = w.menu_actions["stop_reply"]
    assert action.shortcut().toString() == "Esc"  # the menu shows it beside "Stop reply"
    assert action.shortcutContext() == Qt.ShortcutContext.WindowShortcut
    cid = new_chat(w, LONG)

    def stop_from(focus_on):
        with qtbot.waitSignal(w.client.token, timeout=REPLY_TIMEOUT_MS):
            focus_on()
        target = focused(w)
        assert target is not w.composer.input
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
            qtbot.keyClick(target, Qt.Key.Key_Escape)
        reply = w.store.get_message(done.args[0])
        assert reply.status == "stopped" and reply.stats["finish_reason"] == "cancelled"
        assert reply.stats["generated_tokens"] < 400
        return reply, target

    def send_then_focus_tree():  # the reply starts, then the user moves to a tree node
        w.composer.input.setPlainText(STORY)
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        focus(qtbot, w.tree.canvas)
        qtbot.keyClick(w.tree.canvas, Qt.Key.Key_Up)

    first, target = stop_from(send_then_focus_tree)
    assert target is w.tree.canvas

    def regenerate_by_its_button():  # the Regenerate button, pressed from the keyboard
        button = w.transcript.widgets[-1].buttons["regenerate"]
        focus(qtbot, button)
        qtbot.keyClick(button, Qt.Key.Key_Space)

    second, _ = stop_from(regenerate_by_its_button)
    assert second.id != first.id and second.parent_id == first.parent_id

    def focus_sidebar_then_regenerate():
        focus(qtbot, w.sidebar.list)
        qtbot.keyClick(w.sidebar.list, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)  # Chat → Regenerate

    third, target = stop_from(focus_sidebar_then_regenerate)
    assert target is w.sidebar.list and third.id not in (first.id, second.id)
    assert len([m for m in w.store.tree(cid) if m.parent_id == first.parent_id]) == 3
    assert w.store.get_conversation(cid) is not None


# -- 3. Tab leaves the message box; a focus outline everywhere ----------------------------


def test_tab_and_ctrl_tab_leave_the_message_box_without_typing_a_tab(qtbot, open_window, data_dir):
    w = _bare_window(qtbot, open_window, data_dir)
    box = w.composer.input
    for key, modifier in ((Qt.Key.Key_Tab, Qt.KeyboardModifier.NoModifier),
                          (Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier),
                          (Qt.Key.Key_Backtab, Qt.KeyboardModifier.ShiftModifier),
                          (Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)):
        focus(qtbot, box)
        box.setPlainText("draft")
        qtbot.keyClick(box, key, modifier)
        assert box.toPlainText() == "draft"  # no tab typed
        assert not box.hasFocus(), (key, modifier)
    focus(qtbot, box)
    qtbot.keyClick(box, Qt.Key.Key_Tab)
    assert w.composer.button.hasFocus()  # Tab goes on to Send
    qtbot.keyClick(w.composer.button, Qt.Key.Key_Backtab, Qt.KeyboardModifier.ShiftModifier)
    assert box.hasFocus()  # and Shift+Tab comes back


def _close(a: QColor, b: QColor, tol: int = 48) -> bool:
    return abs(a.red() - b.red()) + abs(a.green() - b.green()) + abs(a.blue() - b.blue()) <= tol


def _outlined(window, widget, accent: QColor) -> bool:
    """Whether the window shows a line in ``accent`` along all four sides of ``widget``'s
    visible part (within 4 px of its edge, in its middle half)."""
    r = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    parent = widget.parentWidget()
    while parent is not None and parent is not window:  # the part its scroll areas show
        r = r.intersected(QRect(parent.mapTo(window, QPoint(0, 0)), parent.size()))
        parent = parent.parentWidget()
    if r.isEmpty():
        return False
    image = window.grab().toImage()
    ratio = image.devicePixelRatio()

    def pixel(x, y):
        return image.pixelColor(int(x * ratio), int(y * ratio))

    def side(points_for_offset) -> bool:
        for d in range(-4, 5):
            points = points_for_offset(d)
            inside = [p for p in points if 0 <= p.x() < window.width() and 0 <= p.y() < window.height()]
            if inside and sum(_close(pixel(p.x(), p.y()), accent) for p in inside) >= 0.8 * len(points):
                return True
        return False

    xs = range(r.left() + r.width() // 4, r.right() - r.width() // 4 + 1)
    ys = range(r.top() + r.height() // 4, r.bottom() - r.height() // 4 + 1)
    return all((
        side(lambda d: [QPoint(x, r.top() + d) for x in xs]),
        side(lambda d: [QPoint(x, r.bottom() + d) for x in xs]),
        side(lambda d: [QPoint(r.left() + d, y) for y in ys]),
        side(lambda d: [QPoint(r.right() + d, y) for y in ys]),
    ))


def test_every_widget_tab_reaches_is_outlined_in_light_and_dark(qtbot, open_window, data_dir, tmp_path):
    ids = _two_chats(data_dir)
    w = _bare_window(qtbot, open_window, data_dir)
    w.show_conversation(ids["b"])
    qtbot.waitUntil(lambda: len(w.transcript.widgets) == 2, timeout=10_000)
    for name in ("light", "dark"):
        w.look.set_theme(name)
        accent = QColor(theme.resolve(name).accent)
        focus(qtbot, w.composer.input)
        seen = []
        for _ in range(40):
            widget = focused(w)
            if widget in seen:
                break
            seen.append(widget)
            qtbot.wait(20)
            assert _outlined(w, widget, accent), (name, type(widget).__name__, widget.objectName(),
                                                 widget.accessibleName())
            press(qtbot, w, Qt.Key.Key_Tab)
        kinds = {type(x).__name__ for x in seen}
        # the message box, Send, the chat list, search, a bubble's buttons and the tree
        assert {"_Input", "QPushButton", "QListWidget", "QLineEdit", "QToolButton", "TreeCanvas"} <= kinds, kinds
        w.grab().save(str(tmp_path / f"focus-{name}.png"))


def test_a_button_focused_by_a_click_gets_no_outline_a_text_box_does(qtbot, open_window, data_dir):
    w = _bare_window(qtbot, open_window, data_dir)
    accent = QColor(theme.resolve(w.settings.theme).accent)
    focus(qtbot, w.composer.input)
    qtbot.mouseClick(w.composer.button, Qt.MouseButton.LeftButton)  # Send, with nothing to send
    qtbot.waitUntil(w.composer.button.hasFocus, timeout=5_000)
    qtbot.wait(20)
    assert not _outlined(w, w.composer.button, accent)
    qtbot.mouseClick(w.sidebar.search, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(w.sidebar.search.hasFocus, timeout=5_000)
    qtbot.wait(20)
    assert _outlined(w, w.sidebar.search, accent)
    qtbot.keyClick(w.sidebar.search, Qt.Key.Key_Backtab, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: focused(w) is w.sidebar.new_button, timeout=5_000)
    qtbot.wait(20)
    assert _outlined(w, w.sidebar.new_button, accent)  # the same kind of button, reached by the keyboard


def test_down_then_enter_in_search_opens_the_result(qtbot, open_window, data_dir):
    ids = _two_chats(data_dir)
    w = _bare_window(qtbot, open_window, data_dir)
    w.show_conversation(ids["b"])
    focus(qtbot, w.composer.input)
    press(qtbot, w, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert w.sidebar.search.hasFocus()
    qtbot.keyClicks(w.sidebar.search, "sourdough")
    qtbot.waitUntil(lambda: not w.sidebar._search_timer.isActive() and not w.sidebar.searching, timeout=10_000)
    assert w.sidebar.ids() == [ids["a"]]
    press(qtbot, w, Qt.Key.Key_Down)
    assert w.sidebar.list.hasFocus() and w.sidebar.list.currentRow() == 0
    press(qtbot, w, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.conversation_id == ids["a"], timeout=10_000)
    qtbot.waitUntil(lambda: any(x.message and x.message.id == ids["ua"] for x in w.transcript.widgets),
                    timeout=10_000)
    # Enter straight from the search box opens the first result too
    w.sidebar.focus_search()
    w.sidebar.search.setText("Portugal")
    qtbot.waitUntil(lambda: not w.sidebar._search_timer.isActive() and not w.sidebar.searching, timeout=10_000)
    assert w.sidebar.ids() == [ids["b"]]
    qtbot.keyClick(w.sidebar.search, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.conversation_id == ids["b"], timeout=10_000)


# -- 11. the inline editor's keys -----------------------------------------------------------


def test_inline_edit_enter_saves_shift_enter_adds_a_line_esc_cancels(qtbot, open_window, data_dir):
    ids = _two_chats(data_dir)
    w = _bare_window(qtbot, open_window, data_dir)
    w.show_conversation(ids["b"])
    qtbot.waitUntil(lambda: len(w.transcript.widgets) == 2, timeout=10_000)
    bubble = next(x for x in w.transcript.widgets if x.role == "user")
    stops = []
    w.menu_actions["stop_reply"].triggered.connect(lambda *_a: stops.append(1))

    press(qtbot, w, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)  # Chat → Edit last message
    editor = bubble.editor
    assert editor is not None and editor.hasFocus()
    hint = bubble.findChild(QLabel, "edit_hint")
    assert hint is not None
    qtbot.waitUntil(hint.isVisible, timeout=5_000)
    assert hint.text() == "Enter saves and sends · Shift+Enter adds a line · Esc cancels"
    qtbot.keyClick(editor, Qt.Key.Key_Escape)  # cancels the edit, and stops nothing
    assert bubble.editor is None and stops == []
    assert bubble.body.isVisible()

    saved = []
    w.transcript.edit_saved.connect(lambda mid, text: saved.append((mid, text)))
    bubble.begin_edit()
    editor = bubble.editor
    qtbot.keyClicks(editor, "What is the capital of Spain?")
    qtbot.keyClick(editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(editor, "One word.")
    assert saved == [] and editor.toPlainText() == "What is the capital of Spain?\nOne word."
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert saved == [(ids["ub"], "What is the capital of Spain?\nOne word.")]
    assert bubble.editor is None
