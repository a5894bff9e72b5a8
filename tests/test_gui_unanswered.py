"""Issue #10.2 in the real window, on the default model: Esc before the first token keeps the
question and an empty reply marked stopped, with Retry (which takes the empty reply's
place); sending while the branch ends on a question with no answer asks first (answer it,
or replace it), never putting two questions in a row."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from gui_helpers import REPLY_TIMEOUT_MS, new_chat  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

LONG = "Summarise: " + "The lighthouse keeper climbed the stairs at dusk. " * 120


def _unanswered_chat(data_dir) -> tuple[int, int]:
    """A chat whose branch ends on a question with no reply (as after an engine crash)."""
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="unanswered",
                                         sampling={"temperature": 0.0, "max_tokens": 8, "seed": 1})
        q = store.add_message(conv.id, None, "user", "Say hi.")
        return conv.id, q.id


def test_esc_before_the_first_token_keeps_an_empty_stopped_reply_with_retry(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 8})
    w.composer.input.setPlainText(LONG)
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Escape)  # long before prefill ends
    path = w.store.active_path(cid)
    assert [(m.role, m.status, m.content) for m in path] == [("user", "complete", LONG.strip()),
                                                             ("assistant", "stopped", "")]
    assert blocker.args[0] == path[1].id
    bubble = w.transcript.widget_for(path[1].id)
    assert bubble.note.text() == "· stopped"
    assert "Stopped before the first token." in bubble.body.text()
    assert "retry" in bubble.buttons and bubble.buttons["retry"].isEnabled()
    w.grab().save(str(data_dir / "stopped.png"))
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(bubble.buttons["retry"], Qt.MouseButton.LeftButton)
    reply = w.store.get_message(blocker.args[0])
    assert reply.status == "complete" and reply.content and reply.parent_id == path[0].id
    assert [m.id for m in w.store.branches.children(path[0].id, cid)] == [reply.id]  # the empty one is gone


def test_sending_under_an_unanswered_question_asks_answer_it_first(qtbot, open_window, data_dir):
    cid, q = _unanswered_chat(data_dir)
    w = open_window(data_dir)
    assert w.conversation_id == cid
    w.composer.input.setPlainText("And say bye.")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    box = w.chat.unanswered_box
    assert box is not None and box.isVisible()
    assert "Say hi." in box.text()
    assert [m.id for m in w.store.active_path(cid)] == [q]  # nothing sent yet
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(box.answer, Qt.MouseButton.LeftButton)
    reply = w.store.get_message(blocker.args[0])
    assert reply.parent_id == q and reply.status == "complete"
    assert w.composer.text() == "And say bye."  # kept, to be sent after
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)  # now nothing to ask
    assert w.chat.unanswered_box is None
    assert [m.role for m in w.store.active_path(cid)] == ["user", "assistant", "user", "assistant"]


def test_sending_under_an_unanswered_question_can_replace_it(qtbot, open_window, data_dir):
    cid, q = _unanswered_chat(data_dir)
    w = open_window(data_dir)
    w.composer.input.setPlainText("Say bye instead.")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.mouseClick(w.chat.unanswered_box.replace, Qt.MouseButton.LeftButton)
    path = w.store.active_path(cid)
    assert [(m.role, m.content) for m in path][0] == ("user", "Say bye instead.")
    assert [m.role for m in path] == ["user", "assistant"]
    assert [m.id for m in w.store.branches.siblings(path[0].id)] == [q, path[0].id]  # the old one stays
    assert w.composer.text() == ""


def test_sending_under_a_reply_another_process_streams_waits_for_it(qtbot, open_window, data_dir):
    """The CLI's refusal in the window: a chat whose last reply another process is still
    writing (it holds the reply's stream lock) is not answered from the half-written text;
    the text goes back in the box with one sentence, nothing is stored; once the reply is
    finished, the same send goes through."""
    from storage.chats.live_streams import LiveStreams

    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="busy", sampling={"temperature": 0.0, "max_tokens": 4, "seed": 1})
        q = store.add_message(conv.id, None, "user", "Tell me a story.")
        a = store.add_message(conv.id, q.id, "assistant", "Once upon a", status="streaming")
    writer = LiveStreams(data_dir / CHATS_DB)  # the other process: holds the reply's lock
    writer.claim(a.id)
    try:
        w = open_window(data_dir)
        assert w.conversation_id == conv.id
        assert w.store.get_message(a.id).status == "streaming"  # not marked stopped at start
        w.composer.input.setPlainText("And then?")
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        assert w.composer.input.toPlainText() == "And then?"
        assert "still being written by another Branchwise" in w.banner.label.text()
        assert [m.id for m in w.store.active_path(conv.id)] == [q.id, a.id]
    finally:
        writer.close()
    w.store.update_message(a.id, content="Once upon a time.", status="complete")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    path = w.store.active_path(conv.id)
    assert [m.content for m in path[:3]] == ["Tell me a story.", "Once upon a time.", "And then?"]
