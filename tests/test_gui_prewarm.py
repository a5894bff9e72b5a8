"""Zero-wait turns in the real window (app/window/flows/prewarm_controller.py): the draft is
prefilled while it sits in the composer, Enter evaluates nothing (the first token is sampled
from the prewarm's logits),
the status line says what was ready, the reply is the one computed without any cache; and
nothing is asked of the engine when the setting is off or the window is hidden."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from app.window.flows.prewarm_controller import IDLE_MS, PARTIAL_MS  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402


def _type(qtbot, w, text: str) -> dict:
    """Put ``text`` in the composer and wait for the prewarm of its whole prompt."""
    with qtbot.waitSignal(w.prewarm.answered, timeout=REPLY_TIMEOUT_MS,
                          check_params_cb=lambda r: r["kind"] == "prompt" and r["finished"]
                          and r["ready_tokens"] == r["target_tokens"]) as blocker:
        w.composer.input.setPlainText(text)
    return blocker.args[0]


def test_a_draft_prefilled_while_typing_leaves_nothing_for_enter(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w, system_prompt="You are a concise assistant.")
    send_and_wait(qtbot, w, "Name three fruits.")
    ready = _type(qtbot, w, "Now name three vegetables, please.")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    warm = w.store.get_message(blocker.args[0])
    assert warm.stats["restore_source"] == "context"
    assert warm.stats["prefilled_tokens"] == 0
    assert warm.stats["prepared_tokens"] == warm.stats["prompt_tokens"] == ready["target_tokens"]
    assert 0 < warm.stats["typed_tokens"] < warm.stats["prepared_tokens"]
    assert f"prefilled while you typed: {warm.stats['typed_tokens']:,} tokens" in w.status.stats_label.text()
    assert "nothing left to prefill" in w.status.stats_label.text()

    w.chat.use_cache = False  # the same prompt from scratch gives the same reply (temperature 0)
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(w.transcript.widgets[-1].buttons["regenerate"], Qt.MouseButton.LeftButton)
    fresh = w.store.get_message(blocker.args[0])
    assert fresh.stats["restored_tokens"] == 0 and fresh.stats["prompt_tokens"] == warm.stats["prompt_tokens"]
    assert fresh.token_ids == warm.token_ids


def test_nothing_is_prewarmed_when_off_or_hidden(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w, system_prompt="Be brief.")
    qtbot.waitUntil(lambda: w.prewarm.requests > 0)  # the shown chat's system prompt and user header
    w.settings.update(prewarm=False)
    sent = w.prewarm.requests
    w.composer.input.setPlainText("Hello there, how are")
    qtbot.wait(PARTIAL_MS + IDLE_MS + 200)
    assert w.prewarm.requests == sent
    w.settings.update(prewarm=True)
    w.hide()
    w.composer.input.setPlainText("Hello there, how are you")
    qtbot.wait(PARTIAL_MS + IDLE_MS + 200)
    assert w.prewarm.requests == sent
    w.show()
    w.composer.input.setPlainText("Hello there, how are you today")
    qtbot.waitUntil(lambda: w.prewarm.requests > sent)
    mid = send_and_wait(qtbot, w, "Hi")
    assert w.store.get_message(mid).stats["prefilled_tokens"] >= 2


def _answer(qtbot, w, kind: str, act) -> dict:
    """Do ``act()`` and wait for a finished prewarm of ``kind``."""
    with qtbot.waitSignal(w.prewarm.answered, timeout=REPLY_TIMEOUT_MS,
                          check_params_cb=lambda r: r["kind"] == kind and r["finished"]) as blocker:
        act()
    return blocker.args[0]


def test_opening_a_chat_restores_it_and_regenerate_and_edit_are_prepared(qtbot, open_window, data_dir):
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    w1 = open_window(data_dir)
    cid = new_chat(w1, system_prompt="You are a concise assistant.")
    send_and_wait(qtbot, w1, "Name three fruits.")
    w1.close()

    w2 = open_window(data_dir, wait=False)
    answers: list[dict] = []
    w2.prewarm.answered.connect(answers.append)
    qtbot.waitUntil(lambda: any(a["kind"] == "open" and a["finished"] for a in answers), timeout=REPLY_TIMEOUT_MS)
    opened = next(a for a in answers if a["kind"] == "open" and a["finished"])  # at start, the newest chat
    assert w2.conversation_id == cid
    assert opened["restored_tokens"] > 0 and opened["ready_tokens"] == opened["target_tokens"]
    w2.prewarm._hovered = None  # the pointer may have passed over Regenerate already

    button = w2.transcript.widgets[-1].buttons["regenerate"]
    hovered = _answer(qtbot, w2, "prompt", lambda: QApplication.sendEvent(button, QEvent(QEvent.Type.Enter)))
    assert hovered["ready_tokens"] == hovered["target_tokens"]
    with qtbot.waitSignal(w2.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    again = w2.store.get_message(blocker.args[0])
    assert again.stats["prefilled_tokens"] == 2 and again.stats["restore_source"] == "context"
    assert again.stats["prepared_tokens"] == hovered["target_tokens"] - 2

    first = w2.transcript.widgets[0]
    edited = _answer(qtbot, w2, "prompt", first.begin_edit)  # the path before it, then its text, sent as is
    assert edited["ready_tokens"] == edited["target_tokens"] == again.stats["prompt_tokens"]


def test_the_shown_path_is_read_and_pickled_off_the_ui_thread(qtbot, open_window, data_dir, monkeypatch):
    from engine.events import unpack_messages

    w = open_window(data_dir)
    new_chat(w, system_prompt="Be brief.")
    send_and_wait(qtbot, w, "Name a colour.")
    reply = w.store.active_path(w.chat.conversation_id)[-1].content
    sent: list = []
    real = w.client.prewarm
    monkeypatch.setattr(w.client, "prewarm", lambda messages, *a, **k: (sent.append(messages), real(messages, *a, **k))[1])
    w.chat.path_shown.emit()  # as a redraw of the branch does
    assert w.chat.shown_prompt.current() is None and w.reader.pending("shown-prompt")  # nothing read on the UI thread
    qtbot.waitUntil(lambda: bool(sent), timeout=REPLY_TIMEOUT_MS)
    assert isinstance(sent[-1], bytes)  # the path's pickled bytes, made on the reader thread
    path = unpack_messages(sent[-1])
    assert [(m.role, m.content) for m in path] == [("system", "Be brief."), ("user", "Name a colour."),
                                                   ("assistant", reply)]
    assert path[-1].token_ids  # a reply goes back as its generated ids


def test_packed_messages_come_back_whole_across_chunks():
    from engine.chat_template import ChatMessage
    from engine.events import PACK_CHUNK, pack_messages, unpack_messages

    messages = [ChatMessage("user" if i % 2 else "assistant", f"message {i} <b>&amp;</b>", [i, i + 1] if i % 2 == 0 else None)
                for i in range(PACK_CHUNK * 2 + 3)]
    assert unpack_messages(pack_messages(messages)) == messages
    assert unpack_messages(pack_messages([])) == []
    assert unpack_messages(messages) == messages


def test_enter_sends_the_branch_read_off_the_ui_thread(qtbot, open_window, data_dir, monkeypatch):
    """The send goes with the shown branch's packed prompt (read on the reader thread):
    pressing Enter reads only the conversation's row, and the engine gets the same prompt."""
    from engine.events import unpack_messages

    w = open_window(data_dir)
    new_chat(w, system_prompt="Be brief.")
    send_and_wait(qtbot, w, "Name a colour.")
    w.composer.input.setPlainText("Another one?")
    qtbot.waitUntil(lambda: w.chat.shown_prompt.current() is not None, timeout=REPLY_TIMEOUT_MS)
    reads: list = []
    for name in ("active_path", "tree"):
        real_read = getattr(w.store, name)
        monkeypatch.setattr(w.store, name, lambda *a, _r=real_read, _n=name, **k: (reads.append(_n), _r(*a, **k))[1])
    real_path_to = w.store.branches.path_to
    monkeypatch.setattr(w.store.branches, "path_to", lambda *a: (reads.append("path_to"), real_path_to(*a))[1])
    sent: list = []
    real = w.client.generate
    monkeypatch.setattr(w.client, "generate", lambda messages, *a, **k: (sent.append((messages, k.get("path"))),
                                                                          real(messages, *a, **k))[1])
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        assert reads == []  # the request went without reading the branch on the UI thread
    monkeypatch.undo()
    messages, path = sent[0]
    assert isinstance(path, bytes) and [m.content for m in messages] == ["Another one?"]
    reply = w.store.get_message(blocker.args[0])
    assert unpack_messages(path) + messages == w.chat.session.prompt(reply.parent_id)


def test_opening_a_chat_reads_its_branch_once_for_the_count_and_the_prewarm(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    send_and_wait(qtbot, w, "Name a colour.")
    leaf = w.store.get_conversation(cid).active_leaf_id
    other = w.store.create_conversation(title="Other")
    w.show_conversation(other.id)
    reads, prewarms = w.chat.shown_prompt.reads, w.prewarm.requests
    w.chat.figures.counted_path = None
    w.show_conversation(cid)
    qtbot.waitUntil(lambda: (w.chat.figures.counted_path or (None, None))[:2] == (cid, leaf), timeout=REPLY_TIMEOUT_MS)
    qtbot.waitUntil(lambda: w.prewarm.requests > prewarms, timeout=REPLY_TIMEOUT_MS)
    assert w.chat.shown_prompt.reads == reads + 1  # one read of the branch, shared
    assert w.chat.figures.counted_path[2] == w.status.context_used > 0
