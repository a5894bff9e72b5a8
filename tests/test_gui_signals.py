"""Ctrl+C in the terminal and SIGTERM close the window the way its close button does, and
the KV snapshot of the reply that just finished is written whole (issue #27, item 5).

Before: a terminal's Ctrl+C reached the engine process too, which died inside the snapshot
(nothing of the turn was kept in the prefix store), and the window itself ignored it; a
SIGTERM ended the window at once. Each case runs the real window (offscreen) in a process of
its own, on the default model, and stops it right after ``reply_finished``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

_WINDOW = """
import os, signal, sys
from PySide6.QtCore import QTimer
from app.window.shell import gui, main_window

how = sys.argv[2]

class StopAfterReply(main_window.MainWindow):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tick = QTimer(self, interval=50)
        self._tick.timeout.connect(self._send_when_ready)
        self._tick.start()
        self.reply_finished.connect(self._stop)

    def _send_when_ready(self):
        if self.model_state == "ready":
            self._tick.stop()
            conv = self.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": 48, "seed": 1})
            self.show_conversation(conv.id)
            self.send_message("Name three deserts.")

    def _stop(self, *_):  # the reply is shown; its KV snapshot is being written in the engine process
        if how == "ctrl-c":
            os.killpg(0, signal.SIGINT)  # a terminal's Ctrl+C reaches the whole process group
        else:
            os.kill(os.getpid(), signal.SIGTERM)

main_window.MainWindow = StopAfterReply
sys.exit(gui.run(sys.argv[1], None))
"""


@pytest.mark.parametrize(("how", "code"), [("ctrl-c", 130), ("sigterm", 143)])
def test_a_stop_signal_closes_the_window_and_keeps_the_replys_kv(tmp_path, how, code):
    data = tmp_path / "data"
    data.mkdir()
    (data / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 1}))
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    window = subprocess.run([sys.executable, "-c", _WINDOW, str(data), how], capture_output=True, text=True,
                            env=env, timeout=300, start_new_session=True)
    assert window.returncode == code, window.stderr
    assert "Traceback" not in window.stderr, window.stderr

    from storage.chats import ChatStore

    with ChatStore(data / "chats.sqlite3") as chats:
        reply = next(m for m in chats.tree(1) if m.role == "assistant")
    assert reply.status == "complete" and reply.content
    reply_end = reply.stats["prompt_tokens"] + reply.stats["generated_tokens"]
    follow = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--data-dir", str(data), "--json",
                             "--conversation", "1", "--temperature", "0", "--max-tokens", "2", "Which is largest?"],
                            capture_output=True, text=True, timeout=300)
    assert follow.returncode == 0, follow.stderr
    restored = json.loads(follow.stdout)["stats"]["restored_tokens"]
    assert restored >= reply_end - 2, (restored, reply_end)  # the turn's KV, the reply's included
