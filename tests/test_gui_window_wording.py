"""What the window says about a reply, with the real default model (issue #29, items 4, 8,
9 and 13): what was restored after a restart, the context figure during a prefill, the
words for a first reply and for the prefill, and a model banner that goes away."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QTimer  # noqa: E402
from gui_helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

LONG_QUESTION = ("Here is a list of fruits: " + ", ".join(["apple", "banana", "cherry", "grape", "mango"] * 12)
                 + ". Which one is yellow?")


def _settings(data_dir, **values) -> None:
    path = data_dir / "settings.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_after_a_restart_the_status_line_says_what_was_restored_now(qtbot, open_window, data_dir):
    w1 = open_window(data_dir)
    cid = new_chat(w1)
    send_and_wait(qtbot, w1, LONG_QUESTION)
    w1.close()
    w2 = open_window(data_dir)
    assert w2.conversation_id == cid
    answers = []
    w2.prewarm.answered.connect(answers.append)
    qtbot.waitUntil(lambda: any(a.get("kind") == "open" and a.get("restored_tokens", 0) > 0 for a in answers),
                    timeout=REPLY_TIMEOUT_MS)
    opened = next(a for a in answers if a.get("kind") == "open" and a.get("restored_tokens", 0) > 0)
    text = w2.status.stats_label.text()
    assert text.startswith(f"Restored {opened['restored_tokens']:,} tokens of this chat from the store")
    assert "Last reply" not in text and "ready before you sent" not in text


def test_the_context_figure_moves_during_a_prefill(qtbot, open_window, data_dir):
    _settings(data_dir, prewarm=False)
    w = open_window(data_dir)
    new_chat(w)
    qtbot.waitUntil(lambda: w.status.context_label.text() == "context 0 / 2,048", timeout=REPLY_TIMEOUT_MS)
    seen: list[int] = []
    poll = QTimer(interval=5)
    poll.timeout.connect(lambda: w.chat.streaming and not w.chat.reply.text and seen.append(w.status.context_used))
    poll.start()
    try:
        mid = send_and_wait(qtbot, w, LONG_QUESTION * 6)
    finally:
        poll.stop()
    stats = w.store.get_message(mid).stats
    assert stats["prefilled_tokens"] > 512  # more than one batch: progress came during it
    during = [v for v in seen if v > 0]
    assert during, seen[-5:]  # not "context 0 / 2,048" through the prefill
    assert max(during) <= stats["prompt_tokens"]
    assert w.status.context_used == stats["prompt_tokens"] + stats["generated_tokens"]


def test_first_reply_and_prefill_are_worded_plainly(qtbot, open_window, data_dir):
    _settings(data_dir, prewarm=False, show_tree=True)
    w = open_window(data_dir)
    new_chat(w)
    send_and_wait(qtbot, w, "Name one fruit.")
    new_chat(w)  # a brand-new chat: the template's opening is in the live context already
    w.composer.input.setPlainText("Name one colour.")
    before_first_word: set[tuple[str, str]] = set()  # (the reply bubble's note, the status line)
    poll = QTimer(interval=2)
    poll.timeout.connect(lambda: w.transcript.pending is not None and not w.chat.reply.text and before_first_word.add(
        (w.transcript.pending.note.text(), w.status.stats_label.text())))
    poll.start()
    try:
        with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
            w.composer.input.submit.emit()
    finally:
        poll.stop()
    assert before_first_word == {("· reading your message…", "Reading your message…")}
    stats = w.store.get_message(done.args[0]).stats
    assert stats["restored_tokens"] > 0  # the shared opening was reused
    footer = w.transcript.widget_for(done.args[0]).footer.text()
    assert f"reused {stats['restored_tokens']:,} cached" in footer and "restored" not in footer
    assert "restored" not in w.status.stats_label.text()
    assert f"reused {stats['restored_tokens']:,} cached tokens" in w.status.stats_label.text()
    # a later turn of the same chat did restore the conversation, and says so
    mid = send_and_wait(qtbot, w, "And another one.")
    later = w.store.get_message(mid).stats
    assert f"restored {later['restored_tokens']:,}" in w.transcript.widget_for(mid).footer.text()
    # the tree's tooltips in plain words
    qtbot.waitUntil(lambda: not w.chat.figures.coverage_pending, timeout=REPLY_TIMEOUT_MS)
    with qtbot.waitSignal(w.coverage_ready, timeout=REPLY_TIMEOUT_MS):
        w.chat.figures.refresh_coverage()
    assert mid in w.tree.canvas.coverage
    stored, total = w.tree.canvas.coverage[mid]
    tip = w.tree.canvas.tooltip_for(mid)
    assert f"Saved for instant replies: {stored:,} of {total:,} tokens of the prompt" in tip
    assert "KV" not in tip


def test_a_fall_back_banner_goes_away_with_the_next_reply(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(8192))
    with qtbot.waitSignal(w.model_failed, timeout=LOAD_TIMEOUT_MS):
        w.load_model(str(fake))
    qtbot.waitUntil(lambda: w.model_state in ("ready", "failed", "dead"), timeout=LOAD_TIMEOUT_MS)
    assert w.model_state == "ready" and w.banner.isVisible() and "Going back to" in w.banner.text
    new_chat(w)
    send_and_wait(qtbot, w, "Hello!")
    assert not w.banner.isVisible()
