"""Close the window, reopen it on the same data folder, continue: the prefix store restores."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402


def test_reopen_and_continue_restores_with_same_reply(qtbot, open_window, data_dir):
    w1 = open_window(data_dir)
    cid = new_chat(w1, system_prompt="You are a concise assistant.")
    send_and_wait(qtbot, w1, "Name three fruits.")
    w1.close()
    # restore at send, not on open (zero-wait turns: tests/test_gui_prewarm.py)
    settings = json.loads((data_dir / "settings.json").read_text())
    (data_dir / "settings.json").write_text(json.dumps({**settings, "prewarm": False}))

    w2 = open_window(data_dir)
    assert w2.conversation_id == cid  # the newest chat is shown at start
    assert len(w2.transcript.widgets) == 2
    cached_mid = send_and_wait(qtbot, w2, "Now name three vegetables.")
    cached = w2.store.get_message(cached_mid)
    assert cached.stats["restore_source"] == "store"
    assert cached.stats["restored_tokens"] > 0
    assert cached.stats["prefilled_tokens"] < cached.stats["prompt_tokens"]
    assert "restored" in w2.status.stats_label.text() and "nothing restored" not in w2.status.stats_label.text()

    # the same prompt without the cache gives the same reply (temperature 0)
    w2.chat.use_cache = False
    with qtbot.waitSignal(w2.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(w2.transcript.widgets[-1].buttons["regenerate"], Qt.MouseButton.LeftButton)
    fresh = w2.store.get_message(blocker.args[0])
    assert fresh.stats["restored_tokens"] == 0
    assert fresh.stats["prompt_tokens"] == cached.stats["prompt_tokens"]
    assert fresh.content == cached.content
    assert fresh.token_ids == cached.token_ids
