"""Big input (issue #10.3): a 20,000-line paste is counted by the engine before it is
stored (the window keeps running meanwhile), and a long message is drawn collapsed with a
"Show all 20,000 lines" button, its whole text one click away."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat  # noqa: E402

LINES = [f"{i:05d} a log line with some words, as a pasted file has" for i in range(20_000)]
PASTE = "\n".join(LINES)  # about 1 MB


def test_enter_with_a_20000_line_paste_counts_first_and_stores_nothing_that_cannot_fit(qtbot, open_window,
                                                                                         data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    w.composer.input.setPlainText(PASTE)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    # Enter returned at once: the engine counts in its own process, the window says so
    assert w.overflow_flow.checking is not None and w.composer.button.text() == "Stop"
    assert w.status.stats_label.text().startswith("Counting tokens (")
    assert w.store.active_path(cid) == []
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(), timeout=REPLY_TIMEOUT_MS)
    assert w.store.active_path(cid) == []  # nothing stored: it cannot fit
    assert w.composer.button.text() == "Send"
    qtbot.mouseClick(w.overflow_flow.box.buttons()[-1], Qt.MouseButton.LeftButton)  # "Edit the message"
    assert w.composer.text() == PASTE


def test_a_long_message_opens_collapsed_with_show_all(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    conv = w.store.create_conversation(title="Paste")
    w.store.add_message(conv.id, None, "user", PASTE)
    w.show_conversation(conv.id)
    bubble = w.transcript.widgets[-1]
    assert bubble.text == PASTE  # Copy and Edit still see all of it
    shown = bubble.body.text()
    assert LINES[0] in shown and LINES[19] in shown and LINES[20] not in shown and LINES[-1] not in shown
    button = bubble.expander.button
    qtbot.waitUntil(button.isVisible)  # shown with the bubble
    assert button.text() == f"Show all 20,000 lines ({len(PASTE):,} characters)"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert bubble.expander.expanded and bubble.expander.full.toPlainText() == PASTE
    assert bubble.expander.full.isReadOnly() and button.text() == "Show less"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert not bubble.expander.expanded

    # a short message is shown whole, with no button
    short = w.store.create_conversation(title="Short")
    w.store.add_message(short.id, None, "user", "\n".join(LINES[:40]))
    w.show_conversation(short.id)
    bubble = w.transcript.widgets[-1]
    qtbot.waitUntil(bubble.body.isVisible)
    assert LINES[39] in bubble.body.text() and not bubble.expander.isVisible()


def test_the_engine_dying_while_counting_keeps_the_message_with_retry(qtbot, open_window, data_dir):
    import signal

    w = open_window(data_dir)
    cid = new_chat(w)
    w.composer.input.setPlainText(PASTE)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.overflow_flow.checking is not None  # a 1 MB count takes the engine seconds
    with qtbot.waitSignal(w.engine_died, timeout=30_000):
        os.kill(w.client.pid, signal.SIGKILL)
    assert w.overflow_flow.checking is None and w.composer.button.text() == "Send"
    path = w.store.active_path(cid)
    assert [m.content for m in path] == [PASTE]
    assert "retry" in w.transcript.widget_for(path[0].id).buttons
