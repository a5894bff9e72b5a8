"""The status bar with the real default model: the context figure of an opened chat, the
reply figures after a branch switch, the model's name, and the context-overflow choice."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

from gui_helpers import REPLY_TIMEOUT_MS, TEST_SAMPLING, new_chat  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

SAVED_STATS = {"restored_tokens": 0, "restore_ms": 0.0, "prefilled_tokens": 31, "prefill_ms": 120.0,
               "decode_tokens_per_s": 55.0, "prompt_tokens": 31, "generated_tokens": 9}


def _seed_two_branches(data_dir) -> tuple[int, int, int]:
    """A chat with a short and a long branch; returns (conversation, short leaf, long leaf)."""
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="Two branches", sampling=TEST_SAMPLING)
        short_u = store.add_message(conv.id, None, "user", "Hi!")
        short_a = store.add_message(conv.id, short_u.id, "assistant", "Hello.", stats=SAVED_STATS)
        long_u = store.add_message(conv.id, None, "user", "Please describe the water cycle " * 12)
        long_a = store.add_message(conv.id, long_u.id, "assistant", "Water evaporates, condenses and falls. " * 8)
        store.set_active_leaf(conv.id, long_a.id)
    return conv.id, short_a.id, long_a.id


def test_context_figure_of_an_opened_chat_and_branch_switch(qtbot, open_window, data_dir):
    cid, short_leaf, long_leaf = _seed_two_branches(data_dir)
    w = open_window(data_dir)
    assert w.conversation_id == cid
    qtbot.waitUntil(lambda: w.status.context_used > 0, timeout=REPLY_TIMEOUT_MS)
    long_tokens = w.status.context_used
    assert long_tokens > 12 * 5  # the long branch: at least the words of its messages
    assert w.status.context_label.text() == f"context {long_tokens:,} / 2,048"
    assert w.status.stats_label.text() == ""  # the long branch's reply has no saved figures

    w.chat.select(short_leaf)
    qtbot.waitUntil(lambda: 0 < w.status.context_used < long_tokens, timeout=REPLY_TIMEOUT_MS)
    assert w.status.context_used < long_tokens // 2  # "Hi!" and "Hello." plus the chat template
    assert w.status.stats_label.text().startswith("Last reply on this branch: nothing restored · prefilled 31")

    w.chat.select(long_leaf)
    qtbot.waitUntil(lambda: w.status.context_used == long_tokens, timeout=REPLY_TIMEOUT_MS)
    assert w.status.stats_label.text() == ""


def test_model_name_is_the_file_name(qtbot, open_window, data_dir, model_path):
    w = open_window(data_dir)
    stem = model_path.name.removesuffix(".gguf")
    assert w.status.model_label.text().startswith(f"\u2068{stem}\u2069 · ")
    from app.window.flows.model_controller import facts_text

    assert f"Name: {w.facts['name']}" in facts_text(w.facts)  # the Model info dialog


def test_overflow_offers_a_choice_and_raising_the_context_answers(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 256, "n_threads": 1}))
    w = open_window(data_dir)
    assert w.facts["n_ctx"] == 256
    cid = new_chat(w, {"max_tokens": 8})
    w.composer.input.setPlainText("Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 40)
    w.composer.button.click()
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(),
                    timeout=REPLY_TIMEOUT_MS)
    box = w.overflow_flow.box
    assert "256" in box.text()
    labels = sorted(b.text() for b in box.buttons())
    assert labels == ["Edit the message", "Raise context to 1,024"]  # nothing older to drop: no new branch
    raise_button = next(b for b in box.buttons() if b.text().startswith("Raise context to"))
    assert w.store.active_path(cid) == []  # checked before storing: nothing written yet
    assert w.status.context_label.text().endswith("/ 256") and w.status.context_over
    with qtbot.waitSignal(w.reply_finished, timeout=2 * REPLY_TIMEOUT_MS) as blocker:
        raise_button.click()
    reply = w.store.get_message(blocker.args[0])
    assert reply.status == "complete" and reply.content.strip()
    assert w.facts["n_ctx"] == 1024
    assert json.loads((data_dir / "settings.json").read_text())["n_ctx"] == 1024
    assert w.store.active_path(cid)[-1].id == reply.id


def test_overflow_continue_on_a_new_branch_drops_the_oldest_turns(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 256, "n_threads": 1}))
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="Long", system_prompt="Be brief.",
                                         sampling={**TEST_SAMPLING, "max_tokens": 8})
        parent = None
        for i in range(6):
            parent = store.add_message(conv.id, parent, "user", f"Question {i}: " + "tell me about rivers " * 6).id
            parent = store.add_message(conv.id, parent, "assistant", f"Answer {i}: " + "rivers flow to seas " * 6).id
    w = open_window(data_dir)
    assert w.conversation_id == conv.id
    w.composer.input.setPlainText("And lakes?")
    w.composer.button.click()
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(),
                    timeout=REPLY_TIMEOUT_MS)
    branch_button = next(b for b in w.overflow_flow.box.buttons() if b.text() == "Continue on a new branch")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        branch_button.click()
    reply = w.store.get_message(blocker.args[0])
    assert reply.status == "complete"
    path = w.store.active_path(conv.id)
    assert path[-1].id == reply.id
    assert path[-2].content == "And lakes?"
    assert path[0].role == "user" and path[0].parent_id is None  # a new root branch
    assert 2 < len(path) < 13  # kept some of the newest turns, dropped the oldest
    assert not path[0].content.startswith("Question 0")
    assert reply.stats["prompt_tokens"] < 256
