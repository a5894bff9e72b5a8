"""The chat flow in the real window (offscreen, real default model, temperature 0)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QPushButton  # noqa: E402
from app.session import model_label  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def test_send_streams_reply_and_persists(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    pieces: list[str] = []
    painted: list[str] = []
    w.client.token.connect(lambda _rid, text: pieces.append(text))
    w.chat.flush_timer.timeout.connect(lambda: w.transcript.pending and painted.append(w.transcript.pending.text))

    mid = send_and_wait(qtbot, w, "Name three colours.")

    assert mid > 0
    assert len(pieces) >= 2  # streamed token by token
    assert any(painted), "the streaming bubble was never painted"
    with ChatStore(data_dir / CHATS_DB) as store:
        path = store.active_path(cid)
        reply = store.get_message(mid)
    assert [m.role for m in path] == ["user", "assistant"]
    assert path[0].content == "Name three colours."
    assert reply.status == "complete"
    assert reply.content == "".join(pieces)
    assert reply.content.strip()
    assert len(reply.token_ids) == reply.stats["generated_tokens"] <= 24
    assert w.transcript.widgets[-1].text == reply.content
    assert "prefilled" in w.status.stats_label.text()
    assert w.store.get_conversation(cid).title == "Name three colours."
    # the snapshot's figures arrive after the reply and are stored with it (issue #8: they were 0)
    qtbot.waitUntil(lambda: w.store.get_message(mid).stats["snapshot_ms"] > 0, timeout=REPLY_TIMEOUT_MS)
    assert w.store.get_message(mid).stats["snapshot_bytes_written"] > 0
    assert w.store.get_message(mid).model == model_label(w.model.path) == "SmolLM2-135M-Instruct.Q4_1"
    assert w.composer.button.text() == "Send"


def test_stop_mid_stream_keeps_partial_reply(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 400})
    w.composer.input.setPlainText("Write a long story about a dragon who learns to bake bread.")
    with qtbot.waitSignal(w.client.token, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.composer.button.text() == "Stop"
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Escape)
    reply = w.store.get_message(blocker.args[0])
    assert reply.status == "stopped"
    assert reply.content.strip()
    assert reply.stats["finish_reason"] == "cancelled"
    assert reply.stats["generated_tokens"] < 400
    assert w.store.active_path(cid)[-1].id == reply.id
    assert "stopped" in w.transcript.widgets[-1].note.text()
    assert w.composer.button.text() == "Send"


def test_edit_creates_sibling_and_navigator_switches(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    send_and_wait(qtbot, w, "Say hello.")
    first_user = w.store.active_path(cid)[0]

    widget = w.transcript.widget_for(first_user.id)
    qtbot.mouseClick(widget.buttons["edit"], Qt.MouseButton.LeftButton)
    assert widget.editor is not None
    widget.editor.setPlainText("Say goodbye.")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        qtbot.mouseClick(widget.findChild(QPushButton, "save_edit"), Qt.MouseButton.LeftButton)

    path = w.store.active_path(cid)
    assert path[0].content == "Say goodbye."
    assert [m.id for m in w.store.branches.siblings(path[0].id)] == [first_user.id, path[0].id]
    user_widget = w.transcript.widgets[0]
    assert user_widget.position.text() == "2/2"

    qtbot.mouseClick(user_widget.buttons["prev"], Qt.MouseButton.LeftButton)
    assert w.transcript.widgets[0].text == "Say hello."
    assert w.transcript.widgets[0].position.text() == "1/2"
    assert w.store.active_path(cid)[0].id == first_user.id
    assert len(w.transcript.widgets) == 2  # the first branch's reply is shown again

    qtbot.mouseClick(w.transcript.widgets[0].buttons["next"], Qt.MouseButton.LeftButton)
    assert w.transcript.widgets[0].text == "Say goodbye."


def test_regenerate_adds_a_sibling_reply(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    first = send_and_wait(qtbot, w, "What is two plus two?")
    assistant_widget = w.transcript.widgets[-1]
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(assistant_widget.buttons["regenerate"], Qt.MouseButton.LeftButton)
    second = blocker.args[0]
    assert second != first
    assert [m.id for m in w.store.branches.siblings(second)] == [first, second]
    path = w.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant"] and path[-1].id == second
    assert w.transcript.widgets[-1].position.text() == "2/2"
    # temperature 0: the same prompt gives the same reply, and the prompt came from the live context
    assert w.store.get_message(second).content == w.store.get_message(first).content
    assert w.store.get_message(second).stats["restored_tokens"] > 0
