"""The window's path from Enter to the first streamed text (issue #12, the window TTFT):
the request leaves before the message is stored and the message is never lost; a turn adds
its bubbles without rebuilding the others and the saved reply only replaces its streaming
bubble; the first text is shown when it arrives; a long message is laid out once; the send
timeline marks every step. Real window, real default model, temperature 0."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402
from app.window.transcript.send_timeline import STEPS  # noqa: E402
from engine.events import DoneEvent, TokenEvent  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

from storage.errors import StorageError  # noqa: E402


def _shown(w) -> list[tuple]:
    """What the transcript shows, bubble by bubble (role, id, text, notes, enabled actions)."""
    return [(b.role, b.message.id if b.message else None, b.text, b.note.text(), b.footer.text(),
             sorted(k for k, button in b.buttons.items() if button.isEnabled())) for b in w.transcript.widgets]


def test_the_first_streamed_text_is_in_the_bubble_when_it_arrives(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w)
    at_first_token = []

    def handled(event) -> None:  # after the window handled the event (EngineClient.event comes last)
        if isinstance(event, TokenEvent) and not at_first_token:
            at_first_token.append((w.transcript.pending.text, w.chat.reply.text))

    w.client.event.connect(handled)
    send_and_wait(qtbot, w, "Name three colours.")
    shown, streamed = at_first_token[0]
    assert streamed.strip()
    assert shown == streamed  # not left for the flush timer's next tick


def test_a_turn_adds_its_bubbles_and_the_saved_reply_replaces_only_its_own(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    first_reply = send_and_wait(qtbot, w, "Name three fruits.")
    before = list(w.transcript.widgets)
    streaming = []
    w.client.token.connect(lambda *_: streaming or streaming.append(
        (list(w.transcript.widgets), _shown(w))))

    mid = send_and_wait(qtbot, w, "Now name three vegetables.")

    widgets, shown = streaming[0]
    assert len(widgets) == 4 and all(a is b for a, b in zip(widgets, before))  # not rebuilt when sent
    user = w.store.active_path(cid)[2]
    assert shown[2][:3] == ("user", user.id, "Now name three vegetables.")
    assert shown[3][:2] == ("assistant", None)  # the streaming bubble
    assert shown[1][1] == first_reply and shown[1][5] == ["copy"]  # Regenerate, Fork… wait for the reply
    after = list(w.transcript.widgets)
    assert all(a is b for a, b in zip(after[:3], widgets[:3]))  # not rebuilt when saved
    assert after[3] is not widgets[3] and after[3].message.id == mid
    assert after[3].text == w.store.get_message(mid).content
    incremental = _shown(w)
    assert incremental[1][5] == ["copy", "fork", "regenerate"]
    w.chat.render()  # drawing the whole transcript again shows the same
    w.transcript.finish_building()  # (it builds the newest bubbles first, the others between timers)
    assert _shown(w) == incremental


def test_a_long_message_is_laid_out_once_while_other_bubbles_change(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    conv = w.store.create_conversation()
    long = w.store.add_message(conv.id, None, "user", "The keeper wrote down every ship and storm. " * 250)
    reply = w.store.add_message(conv.id, long.id, "assistant", "Short.")
    w.show_conversation(conv.id)
    bar = w.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)  # laid out, at its width with the scroll bar
    qtbot.wait(100)
    body = w.transcript.widget_for(long.id).body
    computed = body.hfw_computed
    assert computed >= 1
    other = w.transcript.widget_for(reply.id)
    for i in range(1, 6):  # as a streamed reply grows: the layout asks every bubble its height again
        other.set_text("A longer reply. " * 30 * i)
        qtbot.wait(20)
    assert body.hfw_computed == computed
    width = body.width()
    old = body.heightForWidth(width)
    body.setText("<p>" + "a much longer text " * 1500 + "</p>")  # a new text is measured again
    assert body.heightForWidth(width) == QLabel.heightForWidth(body, width) > old


def test_the_request_leaves_first_and_the_message_is_stored_under_the_shown_leaf(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    first_reply = send_and_wait(qtbot, w, "Name three fruits.")
    generate, stored_at_request = w.client.generate, []

    def spy(messages, sampling, use_cache=True, **kw):
        stored_at_request.append(len(w.store.active_path(cid)))
        return generate(messages, sampling, use_cache, **kw)

    w.client.generate = spy
    mid = send_and_wait(qtbot, w, "Now name three vegetables.")
    assert stored_at_request == [2]  # the request left before the message was written
    path = w.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]
    assert (path[2].content, path[2].parent_id, path[3].id) == ("Now name three vegetables.", first_reply, mid)
    assert w.store.get_message(mid).stats["queued_ms"] >= 0  # the engine says how long it waited


def test_a_message_sent_as_the_engine_goes_is_kept_and_shown_with_retry(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    w.client.generate = lambda *a, **k: None  # as when the engine process has just died
    w.composer.input.setPlainText("Hello?")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.store.active_path(cid) != [])
    path = w.store.active_path(cid)
    assert [(m.role, m.content) for m in path] == [("user", "Hello?")]
    bubble = w.transcript.widgets[-1]
    assert bubble.message.id == path[0].id and bubble.buttons["retry"].isEnabled()
    assert not w.chat.streaming and w.composer.button.text() == "Send"


def test_a_message_that_cannot_be_stored_cancels_its_request(qtbot, open_window, data_dir, monkeypatch):
    w = open_window(data_dir)
    cid = new_chat(w)
    send_and_wait(qtbot, w, "Name three fruits.")  # the path is counted: the next send is not
    cancelled, cancel = [], w.client.cancel
    w.client.cancel = lambda handle: (cancelled.append(handle), cancel(handle))

    def disk_full(*_a, **_k):
        raise StorageError("database or disk is full")

    monkeypatch.setattr(w.chat.session, "send", disk_full)
    w.composer.input.setPlainText("Now name three vegetables.")
    with qtbot.waitSignal(w.client.event, timeout=REPLY_TIMEOUT_MS,
                          check_params_cb=lambda e: isinstance(e, DoneEvent)) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert [h.id for h in cancelled] == [blocker.args[0].id]
    assert blocker.args[0].stats["finish_reason"] == "cancelled"
    assert w.composer.text() == "Now name three vegetables."
    assert "could not be saved" in w.banner.text
    assert len(w.store.active_path(cid)) == 2 and not w.chat.streaming


def test_the_send_timeline_marks_every_step_in_order(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w)
    send_and_wait(qtbot, w, "Say hello.")
    mid = send_and_wait(qtbot, w, "Say goodbye.")
    qtbot.waitUntil(lambda: "painted" in w.chat.timeline.at)
    at = [w.chat.timeline.at[step] for step in STEPS]
    assert at == sorted(at)
    stats = w.store.get_message(mid).stats
    parts = w.chat.timeline.breakdown(stats)
    assert parts["engine_ttft"] == round(stats["ttft_ms"], 1) > 0
    assert parts["window_ttft"] >= parts["before_request"] + parts["engine_ttft"]


def test_the_newest_bubble_is_in_view_under_a_long_message(qtbot, open_window, data_dir):
    """A word-wrapped label's size hint is its height at about 80 characters a line: taken as
    its minimum, a 10,000-character message made the transcript taller than its bubbles, and
    the view, put at the bottom, showed blank space instead of the reply being written."""
    w = open_window(data_dir, wait=False, start_engine=False)
    w.resize(1280, 800)
    conv = w.store.create_conversation()
    long = w.store.add_message(conv.id, None, "user", "The keeper wrote down every ship and storm. " * 230)
    w.store.add_message(conv.id, long.id, "assistant", "A logbook of forty winters.")
    w.show_conversation(conv.id)
    pending = w.transcript.start_pending()
    pending.set_text("The keeper")
    bar = w.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    qtbot.wait(100)
    assert bar.value() == bar.maximum() > 0
    assert not pending.stream.live.visibleRegion().isEmpty()  # the block being written (StreamingBody)
    inner, last = w.transcript.widget(), w.transcript.widgets[-1]
    assert inner.height() - last.geometry().bottom() <= 40  # the bottom margin, no blank space


def test_a_long_streamed_reply_leaves_no_blank_space_below_it(qtbot, open_window, data_dir):
    """The streamed reply's finished blocks are labels of their own (StreamingBody): sized
    like a saved message's body, not at their size hint as a minimum (1,361 px of blank space
    below a twelve-paragraph reply)."""
    w = open_window(data_dir, wait=False, start_engine=False)
    w.resize(1280, 800)
    conv = w.store.create_conversation()
    w.store.add_message(conv.id, None, "user", "Tell me about the lighthouse.")
    w.show_conversation(conv.id)
    pending = w.transcript.start_pending()
    text = ""
    for _ in range(12):
        text += "The keeper wrote down every ship and storm. " * 25 + "\n\n"
        pending.set_text(text + "And then")
        qtbot.wait(20)
    assert len(pending.stream.frozen) >= 2
    bar = w.transcript.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)
    qtbot.wait(100)
    inner = w.transcript.widget()
    assert bar.value() == bar.maximum()
    assert inner.height() - pending.geometry().bottom() <= 40  # the bottom margin, no blank space
    assert not pending.stream.live.visibleRegion().isEmpty()  # the text being written is in view
