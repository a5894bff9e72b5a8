"""The window survives a dead engine and a bad model file."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import signal  # noqa: E402

from PySide6.QtCore import Qt  # noqa: E402
from gui_helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402


def test_engine_killed_mid_reply_then_restart(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 400})
    w.composer.input.setPlainText("Write a long story about a lighthouse keeper.")
    with qtbot.waitSignal(w.client.token, timeout=REPLY_TIMEOUT_MS):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.wait(100)  # let a few more tokens arrive
    with qtbot.waitSignal(w.engine_died, timeout=30_000):
        os.kill(w.client.pid, signal.SIGKILL)

    # the partial reply is kept, marked stopped, and still shown
    path = w.store.active_path(cid)
    assert [m.role for m in path] == ["user", "assistant"]
    partial = path[-1]
    assert partial.status == "stopped" and partial.content.strip()
    assert w.transcript.widgets[-1].text == partial.content
    assert w.banner.isVisible() and "stopped unexpectedly" in w.banner.text
    assert w.composer.button.text() == "Send"

    restart = w.banner.button("Restart engine")
    assert restart is not None
    qtbot.mouseClick(restart, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=LOAD_TIMEOUT_MS)
    w.store.set_sampling(cid, {"temperature": 0.0, "max_tokens": 16})
    mid = send_and_wait(qtbot, w, "Thanks. Now say hi.")
    reply = w.store.get_message(mid)
    assert reply.status == "complete" and reply.content.strip()
    assert [m.role for m in w.store.active_path(cid)] == ["user", "assistant", "user", "assistant"]


def test_bad_model_file_reports_and_app_stays_usable(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir)
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(os.urandom(4096))
    with qtbot.waitSignal(w.model_failed, timeout=10_000) as blocker:
        w.load_model(str(garbage))
    assert "not a GGUF" in blocker.args[0]
    assert w.banner.isVisible() and "still loaded and in use" in w.banner.text
    assert "Traceback" not in w.banner.text

    # the file was refused before the engine was asked: the working model still answers
    new_chat(w)
    mid = send_and_wait(qtbot, w, "hello?")
    assert w.store.get_message(mid).status == "complete"

    # a file with a GGUF header but a corrupt body reaches llama.cpp: reported, and the
    # model that worked is loaded again (or the engine dies, and says so)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(8192))
    w.load_model(str(fake))
    qtbot.waitUntil(lambda: w.model_state in ("ready", "dead") and "fake.gguf" in w.banner.text
                    or w.model_state == "dead", timeout=LOAD_TIMEOUT_MS)
    assert w.banner.isVisible()
    if w.model_state == "dead":
        qtbot.mouseClick(w.banner.button("Restart engine"), Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: w.model_state == "ready", timeout=LOAD_TIMEOUT_MS)
    assert w.model_state == "ready"
    w.composer.input.clear()
    mid = send_and_wait(qtbot, w, "Say hi.")
    assert w.store.get_message(mid).status == "complete"
