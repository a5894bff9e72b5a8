"""Continue, Export chat…, the draft token count and model-written titles (issue #29, item 14),
each driven through the real window on the real default model."""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from gui_helpers import REPLY_TIMEOUT_MS, new_chat, send_and_wait
from PySide6.QtCore import Qt

from engine import events as ev
from storage.chat_text import auto_title


def _wait_answer(qtbot, handle):
    """The answering event of ``handle`` (a PendingRequest)."""
    got = []
    handle.done.connect(got.append)
    handle.failed.connect(got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=REPLY_TIMEOUT_MS)
    return got[0]


# -- Continue ------------------------------------------------------------------------------


def test_continue_appends_to_the_same_reply_restored_from_the_store(qtbot, open_window, data_dir):
    settings = json.loads((data_dir / "settings.json").read_text())
    (data_dir / "settings.json").write_text(json.dumps({**settings, "prewarm": False}))  # no restore before the click
    w = open_window(data_dir)
    w.resize(1600, 900)
    cid = new_chat(w, {"max_tokens": 12})
    mid = send_and_wait(qtbot, w, "Write a short story about a lighthouse keeper.")
    first = w.store.get_message(mid)
    assert first.stats["finish_reason"] == "length" and len(first.token_ids) == 12
    qtbot.waitUntil(lambda: w.chat.figures.coverage_pending is False, timeout=30_000)
    w.model.restart()  # a new engine process: nothing is live, the stopped reply comes from the store
    qtbot.waitUntil(lambda: w.model_state == "ready", timeout=120_000)

    bubble = w.transcript.widget_for(mid)
    button = bubble.buttons["continue"]  # a reply cut at max tokens offers Continue
    assert button.isVisibleTo(bubble) and button.isEnabled()
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert blocker.args[0] == mid  # the same message, not a new sibling
    after = w.store.get_message(mid)
    assert [m.role for m in w.store.tree(cid)] == ["user", "assistant"]
    assert after.content.startswith(first.content) and len(after.content) > len(first.content)
    new_ids = list(after.token_ids[12:])
    assert list(after.token_ids[:12]) == list(first.token_ids) and len(new_ids) >= 1
    s = after.stats
    history = first.stats["prompt_tokens"]
    assert s["prompt_tokens"] == history + 12
    assert s["restore_source"] == "store"
    assert s["restored_tokens"] >= history + 12 - 2  # the stopped reply came back whole
    assert s["prefilled_tokens"] <= 2
    assert s["generated_tokens"] == len(after.token_ids) and s["continued_from"] == 12
    assert w.transcript.widget_for(mid).text == after.content

    # the continuation equals the one computed with no store at all (token for token)
    messages = w.chat.session.prompt(first.parent_id)
    handle = w.client.generate(messages, {"temperature": 0.0, "max_tokens": 12, "seed": 1}, use_cache=False,
                               reply_prefix=list(first.token_ids))
    cold = _wait_answer(qtbot, handle)
    assert isinstance(cold, ev.DoneEvent) and cold.stats["restored_tokens"] == 0
    assert list(cold.token_ids) == new_ids


def test_continue_a_reply_stopped_with_esc(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    w.resize(800, 700)
    new_chat(w, {"max_tokens": 200})
    w.composer.input.setPlainText("Count from one to one hundred in words.")
    got = []
    w.client.token.connect(lambda _rid, _t: got.append(1))
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: len(got) >= 3, timeout=REPLY_TIMEOUT_MS)
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Escape)
    mid = blocker.args[0]
    stopped = w.store.get_message(mid)
    assert stopped.status == "stopped" and stopped.stats["finish_reason"] == "cancelled"
    n = len(stopped.token_ids)
    assert "continue" in w.transcript.widget_for(mid).buttons
    w.store.set_sampling(stopped.conversation_id, {"temperature": 0.0, "max_tokens": 8, "seed": 1})
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        w.menu_actions["continue_reply"].trigger()  # Chat → Continue reply
    after = w.store.get_message(mid)
    assert after.status == "complete" and after.stats["finish_reason"] in ("length", "stop")
    assert after.stats["restored_tokens"] >= stopped.stats["prompt_tokens"] + n - 2
    assert after.stats["prefilled_tokens"] <= 2
    assert list(after.token_ids[:n]) == list(stopped.token_ids)


# -- Export --------------------------------------------------------------------------------


def _export(qtbot, w, monkeypatch, target, chosen):
    from app.window.flows import export_flow

    monkeypatch.setattr(export_flow.QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), chosen)))
    with qtbot.waitSignal(w.extras.exporting.exported, timeout=30_000) as blocker:
        w.menu_actions["export_chat"].trigger()  # File → Export chat…
    return blocker.args


def test_export_chat_to_json_and_markdown(qtbot, open_window, data_dir, tmp_path, monkeypatch):
    w = open_window(data_dir)
    cid = new_chat(w, {"max_tokens": 8})
    send_and_wait(qtbot, w, "Say hello in French.")
    out = tmp_path / "out"
    out.mkdir()

    path, message = _export(qtbot, w, monkeypatch, out / "chat.json", "Branchwise JSON (*.json)")
    assert path == str(out / "chat.json") and "Exported" in message
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads((out / "chat.json").read_text(encoding="utf-8"))
    assert data["id"] == cid and [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][0]["content"] == "Say hello in French."

    path, _ = _export(qtbot, w, monkeypatch, out / "chat", "Markdown (*.md)")  # the suffix is added
    assert path == str(out / "chat.md") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = (out / "chat.md").read_text(encoding="utf-8")
    assert text.startswith("# ") and "## User · message" in text and "Say hello in French." in text
    assert "## Assistant · message" in text
    assert sorted(p.name for p in out.iterdir()) == ["chat.json", "chat.md"]  # no temporary files left


def test_export_failures_are_one_sentence(qtbot, open_window, data_dir, tmp_path, monkeypatch):
    w = open_window(data_dir, wait=False)
    conv = w.store.create_conversation()
    w.store.add_message(conv.id, None, "user", "hello")
    w.show_conversation(conv.id)
    missing = tmp_path / "no such folder" / "chat.md"
    path, message = _export(qtbot, w, monkeypatch, missing, "Markdown (*.md)")
    assert path == "" and message == f"The chat was not exported to {missing}: that folder does not exist; nothing was written there."
    assert w.banner.text == message

    out = tmp_path / "full"
    out.mkdir()

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    path, message = _export(qtbot, w, monkeypatch, out / "chat.json", "Branchwise JSON (*.json)")
    assert path == "" and "the disk is full" in message and message.count(".") >= 1
    assert list(out.iterdir()) == []  # nothing half-written is left


# -- the draft's token count ---------------------------------------------------------------


def test_draft_token_count_under_the_composer(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    w.resize(800, 700)
    new_chat(w, {"max_tokens": 6})
    send_and_wait(qtbot, w, "Hi there.")
    label = w.extras.draft_count.label
    assert not label.isVisible()
    before = w.extras.draft_count.requests
    qtbot.keyClicks(w.composer.input, "What is the tallest mountain on Earth?")
    qtbot.waitUntil(lambda: label.isVisible() and w.extras.draft_count.counted is not None, timeout=30_000)
    assert w.extras.draft_count.requests - before <= 3  # debounced: not one count per key
    own, context, n_ctx = w.extras.draft_count.counted
    assert re.fullmatch(r"message \d+ tokens · after sending: context [\d,]+ / 2,048", label.text()), label.text()
    assert label.text() == f"message {own} tokens · after sending: context {context:,} / {n_ctx:,}" and n_ctx == 2048
    assert 5 <= own <= 20
    mid = send_and_wait(qtbot, w, "What is the tallest mountain on Earth?")  # the count was the real prompt
    assert w.store.get_message(mid).stats["prompt_tokens"] == context
    qtbot.waitUntil(lambda: not label.isVisible(), timeout=5_000)  # an empty composer shows nothing

    w.composer.set_text("word " * 3000)  # more than the context holds: counted off the UI thread, in red
    qtbot.waitUntil(lambda: label.isVisible() and "c0392b" in label.styleSheet(), timeout=60_000)
    own, context, _ = w.extras.draft_count.counted
    assert own >= 3000 and context > 2048


# -- titles --------------------------------------------------------------------------------


def test_the_model_titles_a_chat_after_its_first_reply(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    w.resize(1600, 900)
    cid = new_chat(w)
    first = "What is the capital of France?"
    with qtbot.waitSignal(w.extras.titles.titled, timeout=REPLY_TIMEOUT_MS) as blocker:
        send_and_wait(qtbot, w, first)
    assert blocker.args[0] == cid
    title = w.store.get_conversation(cid).title
    assert title == blocker.args[1] and title != auto_title(first)
    assert 1 <= len(title.split()) <= 8 and not re.search(r"[<>*#`\[\]{}|\\_]", title) and title.isprintable()
    assert w.windowTitle() == f"{title} — Branchwise"

    # the title job changes no prefix-store entry, and the next turn reuses the whole chat
    def store_stats():
        return _wait_answer(qtbot, w.client.cache(ev.CacheAction.STATS)).stats

    before = store_stats()
    handle = w.client.title(w.chat.session.prompt(w.store.get_conversation(cid).active_leaf_id))
    again = _wait_answer(qtbot, handle)
    assert again.finished and again.text == blocker.args[2]  # greedy: the same title
    after = store_stats()
    kept = ("blocks", "bytes", "tokens", "lookups", "hits", "tokens_restored", "tokens_prefilled")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    first_reply = w.store.get_message(w.store.get_conversation(cid).active_leaf_id)
    turn_one = first_reply.stats["prompt_tokens"] + len(first_reply.token_ids)
    mid = send_and_wait(qtbot, w, "And of Italy?")
    s = w.store.get_message(mid).stats
    assert s["restored_tokens"] >= turn_one - 2 and s["restored_tokens"] + s["prefilled_tokens"] == s["prompt_tokens"]
    assert w.store.get_conversation(cid).title == title  # only the first reply is titled


def test_a_rename_wins_and_a_request_interrupts_the_title_job(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    cid = new_chat(w)
    w.chat.reply_finished.connect(lambda _mid: w.store.rename(cid, "My own name"))  # before the job answers
    with qtbot.waitSignal(w.extras.titles.titled, timeout=REPLY_TIMEOUT_MS) as blocker:
        send_and_wait(qtbot, w, "What is the capital of France?")
    assert blocker.args[1] == "" and w.store.get_conversation(cid).title == "My own name"

    # a reply asked for while the title job decodes goes first: the job stops between decode
    # steps, and runs again (whole) after the reply
    order: list[str] = []
    state = {}
    messages = w.chat.session.prompt(w.store.get_conversation(cid).active_leaf_id)

    def on_event(event):
        if isinstance(event, ev.ProgressEvent) and event.phase == "title" and "reply" not in state:
            order.append("title token")
            state["reply"] = w.client.generate(messages[:1], {"temperature": 0.0, "max_tokens": 4, "seed": 1})
        elif isinstance(event, ev.DoneEvent) and state.get("reply") is not None and event.id == state["reply"].id:
            order.append("reply done")
        elif isinstance(event, ev.TitleEvent):
            order.append("title done")
            state["title"] = event

    w.client.event.connect(on_event)
    w.client.title(messages)
    qtbot.waitUntil(lambda: "title" in state, timeout=REPLY_TIMEOUT_MS)
    assert order == ["title token", "reply done", "title done"], order
    assert state["title"].finished and state["title"].attempts >= 2
    assert state["title"].text == blocker.args[2]  # the same title as the uninterrupted job wrote
