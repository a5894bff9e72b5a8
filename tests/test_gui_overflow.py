"""A message too long for the context (issue #10.4): checked before it is stored, and only
the choices that can work are offered, computed from the engine's token counts, with the
largest context this model and this machine allow; the context figure turns red."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

from app.session.overflow import largest_context  # noqa: E402


def _press_enter(qtbot, w, text):
    w.composer.input.setPlainText(text)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(), timeout=REPLY_TIMEOUT_MS)
    return w.overflow_flow.box


def test_a_message_larger_than_any_allowed_context_is_offered_nothing_that_fails(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    assert w.facts["context_length"] == 8192  # SmolLM2-135M was trained for 8,192 tokens
    cid = new_chat(w, {"max_tokens": 8})
    send_and_wait(qtbot, w, "Hi")
    before = [m.id for m in w.store.active_path(cid)]
    text = "alpha beta gamma delta " * 2600  # about 10,400 tokens: more than 8,192
    box = _press_enter(qtbot, w, text)
    assert [b.text() for b in box.buttons()] == ["Edit the message"]
    tokens = int(box.text().split(" tokens")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert 8192 < tokens < 12_000 and "the context holds 2,048" in box.text()
    assert "The largest context this model and this computer's memory allow is 8,192 tokens" in box.informativeText()
    assert "Shorten the message" in box.informativeText()
    assert w.status.context_over and w.status.context_label.text() == f"context {tokens:,} / 2,048"
    assert [m.id for m in w.store.active_path(cid)] == before  # nothing stored
    qtbot.mouseClick(box.buttons()[0], Qt.MouseButton.LeftButton)
    assert w.composer.text() == text.strip()  # back in the composer (as sent: stripped), to shorten


def test_the_raise_offered_fits_the_tokens_and_no_branch_when_the_newest_alone_overflows(qtbot, open_window,
                                                                                           data_dir):
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 8})
    send_and_wait(qtbot, w, "Hi")
    text = "alpha beta gamma delta " * 750  # about 3,000 tokens: over 2,048, under 4,096
    box = _press_enter(qtbot, w, text)
    labels = [b.text() for b in box.buttons()]
    assert "Continue on a new branch" not in labels  # the newest message alone does not fit 2,048
    assert "Raise context to 4,096" in labels
    with qtbot.waitSignal(w.reply_finished, timeout=2 * REPLY_TIMEOUT_MS) as done:
        qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Raise context to 4,096"),
                         Qt.MouseButton.LeftButton)
    reply = w.store.get_message(done.args[0])
    assert reply.status == "complete" and w.facts["n_ctx"] == 4096
    assert json.loads((data_dir / "settings.json").read_text())["n_ctx"] == 4096
    assert [m.role for m in w.store.active_path(cid)] == ["user", "assistant", "user", "assistant"]
    qtbot.waitUntil(lambda: w.status.context_used > 2048, timeout=REPLY_TIMEOUT_MS)
    assert not w.status.context_over


def test_largest_context_is_the_smaller_of_training_and_memory():
    kvb = 23_040  # SmolLM2-135M f16: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes
    assert largest_context(8192, kvb, 2048, 64 * 2**30) == 8192  # plenty of memory: the training limit
    assert largest_context(8192, kvb, 2048, 50 * 2**20) == 3072  # 0.8 x (50 MB + the 2,048 in use)
    assert largest_context(0, kvb, 2048, 50 * 2**20) == 3072
    assert largest_context(0, 0, 2048, 0) == 0  # nothing known


def test_a_message_that_surely_fits_is_sent_without_a_count_first(qtbot, open_window, data_dir):
    """The shown path's last count plus the message's bytes under the context: no round trip
    to the engine before the reply (it would wait for a running prewarm batch)."""
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 8})
    send_and_wait(qtbot, w, "Hi")
    qtbot.waitUntil(lambda: w.chat.figures.counted_path is not None and w.chat.figures.counted_path[0] == cid, timeout=30_000)
    w.composer.input.setPlainText("And again?")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        assert w.chat.streaming  # the reply started at once, not after a count
    # a message that may not fit is still counted first
    w.composer.input.setPlainText("word " * 2100)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert not w.chat.streaming and w.overflow_flow.checking is not None
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(), timeout=REPLY_TIMEOUT_MS)


def test_a_chat_too_long_for_the_template_opens_the_too_long_dialog(qtbot, open_window, data_dir):
    """50,000 messages (past the template's render time limit): Enter opens the dialog with
    the chat's real size, instead of storing the message with no reply and no word."""
    from storage.chats import ChatStore
    from storage.paths import CHATS_DB

    with ChatStore(data_dir / CHATS_DB) as store:
        cid = store.create_conversation(title="deep").id
        parent = None
        for i in range(50_000):
            parent = store.add_message(cid, parent, "user" if i % 2 == 0 else "assistant",
                                       f"message number {i} of a long chat").id
    w = open_window(data_dir)
    w.show_conversation(cid)
    box = _press_enter(qtbot, w, "And now?")
    tokens = int(box.text().split(" tokens")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert box.windowTitle() == "This message is too long" and tokens > 400_000  # 9+ tokens a message
    assert "the context holds 2,048" in box.text()
    with ChatStore(data_dir / CHATS_DB) as store:
        assert store.get_conversation(cid).active_leaf_id == parent  # nothing stored
