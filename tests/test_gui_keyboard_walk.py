"""Issue #29, "done when": a keyboard-only user does what a mouse user does. One walk through
the real window on the default model, every step a key press on the widget that has the
focus (no mouse, no method called on a widget): send, stop, regenerate, switch branch with
‹, edit, switch branch in the tree, search and open a result, open and close Settings."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from gui_helpers import REPLY_TIMEOUT_MS  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

CTRL = Qt.KeyboardModifier.ControlModifier


def test_everything_from_the_keyboard(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({
        "n_ctx": 2048, "n_threads": 1, "show_tree": True, "prewarm": False,
        "default_sampling": {"temperature": 0.0, "max_tokens": 400, "seed": 1}}))
    with ChatStore(data_dir / CHATS_DB) as s:  # an older chat to find by search
        other = s.create_conversation(title="Capitals")
        question = s.add_message(other.id, None, "user", "What is the capital of Portugal?")
        s.add_message(other.id, question.id, "assistant", "Lisbon.")
    w = open_window(data_dir)
    w.resize(1180, 760)
    w.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=10_000)

    def focused():
        return QApplication.focusWidget() or w

    def press(key, modifier=Qt.KeyboardModifier.NoModifier):
        qtbot.keyClick(focused(), key, modifier)
        qtbot.wait(5)  # the event loop runs between key presses, as it does for a person

    def type_text(text):
        qtbot.keyClicks(focused(), text)

    def tab_to(wanted, limit=80):
        for _ in range(limit):
            if wanted(focused()):
                return focused()
            press(Qt.Key.Key_Tab)
        raise AssertionError(f"Tab never reached it; focus on {type(focused()).__name__}")

    def reply_then_stop(start):
        """Run ``start`` (keys that begin a reply), then Esc once it writes; the stopped reply."""
        with qtbot.waitSignal(w.client.token, timeout=REPLY_TIMEOUT_MS):
            start()
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
            press(Qt.Key.Key_Escape)
        reply = w.store.get_message(done.args[0])
        assert reply.status == "stopped" and reply.stats["generated_tokens"] < 400
        return reply

    # a new chat, and send
    press(Qt.Key.Key_N, CTRL)
    assert focused() is w.composer.input
    first = reply_then_stop(lambda: (type_text("Tell me a long story about a lighthouse."), press(Qt.Key.Key_Return)))
    cid = w.conversation_id
    assert first.conversation_id == cid != other.id

    # regenerate (Chat → Regenerate last reply), stopped too
    second = reply_then_stop(lambda: press(Qt.Key.Key_R, CTRL))
    assert second.parent_id == first.parent_id and w.store.active_path(cid)[-1].id == second.id

    # switch branch with ‹ on the reply
    prev = tab_to(lambda f: f is getattr(w.transcript.widgets[-1], "buttons", {}).get("prev"))
    press(Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: w.store.active_path(cid)[-1].id == first.id, timeout=10_000)
    assert prev is not None

    # edit the message (Chat → Edit last message): Enter saves and sends
    press(Qt.Key.Key_E, CTRL)
    assert focused().objectName() == "inline_editor"
    edited = reply_then_stop(lambda: (type_text("Tell me a short story about a lighthouse."),
                                      press(Qt.Key.Key_Return)))
    path = w.store.active_path(cid)
    assert path[0].content == "Tell me a short story about a lighthouse." and path[-1].id == edited.id
    assert path[0].id != first.parent_id

    # switch back to the first message's branch in the tree: Up to it, Left to its sibling, Enter
    canvas = tab_to(lambda f: f is w.tree.canvas)
    qtbot.waitUntil(lambda: not w.tree.loading, timeout=30_000)
    press(Qt.Key.Key_End)
    press(Qt.Key.Key_Up)
    assert canvas.current == path[0].id
    press(Qt.Key.Key_Left)
    assert canvas.current == first.parent_id
    press(Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.store.active_path(cid)[0].id == first.parent_id, timeout=10_000)

    # search, Down, Enter: the other chat opens
    press(Qt.Key.Key_F, CTRL)
    assert focused() is w.sidebar.search
    type_text("Portugal")
    qtbot.waitUntil(lambda: w.sidebar.ids() == [other.id] and not w.sidebar.searching, timeout=10_000)
    press(Qt.Key.Key_Down)
    press(Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.conversation_id == other.id, timeout=10_000)

    # Settings, and Esc closes it
    press(Qt.Key.Key_Comma, CTRL)
    dlg = w.settings_flow.dialog
    assert dlg is not None and dlg.isVisible()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is dlg, timeout=10_000)
    press(Qt.Key.Key_Escape)
    assert w.settings_flow.dialog is None and not dlg.isVisible()
