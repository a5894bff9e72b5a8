"""A native crash of the engine process (issue #7, the window's half): the banner says what
happened in words, names engine.log and what Restart will do; Restart turns weight
repacking off (remembered for this machine); the unanswered message is retried in place; the next send works."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from app.window.flows.crash import crash_name, describe_exit  # noqa: E402
from engine.cpu import CrashVerdict  # noqa: E402
from gui_helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

LOG = "/data/logs/engine.log"


def test_describe_a_segfault_during_the_first_reply():
    r = describe_exit(-signal.SIGSEGV, LOG, early=True, repack="auto")
    assert r.native_crash and r.safe_restart
    assert r.message.startswith("The engine crashed in llama.cpp (segmentation fault). Your conversations are safe.")
    assert LOG in r.message and "repacking off" in r.message


def test_describe_a_later_crash_or_repacking_already_off():
    for early, repack in ((False, "auto"), (True, "off")):
        r = describe_exit(-signal.SIGABRT, LOG, early=early, repack=repack)
        assert r.native_crash and not r.safe_restart
        assert "(abort)" in r.message and "repacking" not in r.message


def test_describe_windows_exception_codes_and_plain_exits():
    assert crash_name(0xC0000005) == "access violation"
    assert crash_name(0xC000001D) == "illegal instruction"
    assert crash_name(1) is None and crash_name(None) is None
    killed = describe_exit(-signal.SIGKILL, LOG, early=True, repack="auto")
    assert not killed.native_crash and not killed.safe_restart
    assert "stopped unexpectedly (killed by SIGKILL" in killed.message and LOG in killed.message
    assert "exit code 3" in describe_exit(3, LOG, early=False, repack="auto").message


@pytest.mark.skipif(not hasattr(signal, "SIGSEGV") or os.name == "nt", reason="POSIX signals")
def test_segfault_before_the_first_token_then_restart_and_retry(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    assert w.settings.repack == "auto"
    cid = new_chat(w, {"max_tokens": 16})
    # a long prompt: the engine is still prefilling when it is killed, before the first token
    w.composer.input.setPlainText("Summarise: " + "The lighthouse keeper climbed the stairs at dusk. " * 120)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.streaming, timeout=30_000)  # counted, stored, the reply started
    with qtbot.waitSignal(w.engine_died, timeout=30_000) as died:
        os.kill(w.client.pid, signal.SIGSEGV)
    message = died.args[0]
    log_file = str(data_dir / "logs" / "engine.log")
    assert message.startswith("The engine crashed in llama.cpp (segmentation fault).")
    assert log_file in message and "weight repacking off" in message
    assert w.banner.isVisible() and w.banner.text == message
    assert w.model_state == "dead"
    # the user's message is kept, unanswered, with a Retry button
    path = w.store.active_path(cid)
    assert [m.role for m in path] == ["user"]
    user_id = path[0].id
    assert "retry" in w.transcript.widget_for(user_id).buttons

    qtbot.mouseClick(w.banner.button("Restart engine"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=LOAD_TIMEOUT_MS)
    # "auto" stays the setting; the crash is remembered for this machine and llama.cpp build,
    # and the new engine loaded without repacking because of it (engine/cpu.py)
    assert w.settings.repack == "auto"
    assert CrashVerdict.applies(data_dir)
    assert w.model.facts["repack"].startswith("off (the engine crashed on this machine")

    retry = w.transcript.widget_for(user_id).buttons["retry"]
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(retry, Qt.MouseButton.LeftButton)
    reply = w.store.get_message(blocker.args[0])
    assert reply.status == "complete" and reply.parent_id == user_id
    assert [m.id for m in w.store.active_path(cid)] == [user_id, reply.id]  # no second user message

    w.composer.input.clear()
    mid = send_and_wait(qtbot, w, "Thanks. Now say hi.")
    assert w.store.get_message(mid).status == "complete"
    assert [m.role for m in w.store.active_path(cid)] == ["user", "assistant", "user", "assistant"]


def _stream_then_freeze(qtbot, w, cid):
    """Send, wait for the first tokens, then freeze the engine process (SIGSTOP): it can no
    longer answer Stop, as an engine stuck in native code would not."""
    w.composer.input.setPlainText("Write a long story about a lighthouse keeper.")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.reply is not None and len(w.chat.reply.text) > 20, timeout=REPLY_TIMEOUT_MS)
    frozen = w.client.pid
    os.kill(frozen, signal.SIGSTOP)
    return frozen, w.chat.reply


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
@pytest.mark.parametrize("how", ["button", "timeout"])
def test_stop_ends_an_engine_that_does_not_answer(qtbot, open_window, data_dir, how):
    """The watchdog behind Stop (issue #16): Stop to a frozen engine first offers "End engine
    now", then ends the process by itself; the partial reply is kept as stopped, a new
    engine loads the model, and the next message is answered."""
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 400, "temperature": 0.0})
    if how == "timeout":  # the offer, then the end, sooner than in use (3 s and 30 s)
        w.chat.watchdog.hint.setInterval(500)
        w.chat.watchdog.deadline.setInterval(2_500)
    frozen, reply = _stream_then_freeze(qtbot, w, cid)
    try:
        w.chat.stop()
        assert w.status.stats_label.text() == "Stopping…"
        qtbot.waitUntil(lambda: w.banner.button("End engine now") is not None, timeout=10_000)
        assert "finishes its current step" in w.banner.text
        with qtbot.waitSignal(w.engine_died, timeout=30_000):
            if how == "button":
                qtbot.mouseClick(w.banner.button("End engine now"), Qt.MouseButton.LeftButton)
    finally:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert w.client.pid != frozen
    assert w.banner.text.startswith("The engine did not answer Stop, so Branchwise ended it")
    assert "engine.log" in w.banner.text
    saved = w.store.get_message(reply.message_id)
    assert saved.status == "stopped" and len(saved.content) > 20
    assert saved.content == reply.text
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=LOAD_TIMEOUT_MS)
    mid = send_and_wait(qtbot, w, "Hello")
    assert w.store.get_message(mid).status == "complete"
    assert [m.role for m in w.store.active_path(cid)] == ["user", "assistant", "user", "assistant"]


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
def test_stop_ends_an_engine_frozen_while_it_counts_a_long_paste(qtbot, open_window, data_dir):
    """Stop while a message is being counted before it is stored (a long paste) is covered by
    the same watchdog: the message is kept with an empty stopped reply, and the engine restarts."""
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 8})
    frozen = w.client.pid
    os.kill(frozen, signal.SIGSTOP)  # frozen before the count can be answered
    try:
        w.chat.watchdog.hint.setInterval(300)
        w.chat.watchdog.deadline.setInterval(1_500)
        w.composer.input.setPlainText("A question about lighthouses. " * 300)
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        assert w.overflow_flow.checking is not None  # long: counted first
        with qtbot.waitSignal(w.engine_died, timeout=30_000):
            w.chat.stop()
            qtbot.waitUntil(lambda: w.banner.button("End engine now") is not None, timeout=10_000)
    finally:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert w.overflow_flow.checking is None
    assert w.banner.text.startswith("The engine did not answer Stop, so Branchwise ended it")
    path = w.store.active_path(cid)
    assert [(m.role, m.status, m.content) for m in path][1:] == [("assistant", "stopped", "")]
    assert path[0].content.startswith("A question about lighthouses.")
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=LOAD_TIMEOUT_MS)


def test_enter_after_the_engine_was_killed_keeps_the_message_and_the_crash_s_words(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w)
    with qtbot.waitSignal(w.engine_died, timeout=30_000) as died:
        os.kill(w.client.pid, signal.SIGKILL)
    crash_words = died.args[0]
    assert "killed by SIGKILL" in crash_words
    assert "was not written" in crash_words or str(data_dir / "logs" / "engine.log") in crash_words
    w.composer.input.setPlainText("Are you there?")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.composer.input.toPlainText() == "Are you there?"
    assert w.composer.input.textCursor().position() == len("Are you there?")  # typing goes on at the end
    qtbot.keyClicks(w.composer.input, " Hello")
    assert w.composer.input.toPlainText() == "Are you there? Hello"
    assert w.banner.text == "Your message was not sent and is still in the box. " + crash_words
    assert w.banner.button("Restart engine") is not None
