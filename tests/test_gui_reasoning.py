"""A reasoning reply in the real window, end to end, on the real default model forced into
the ``<think>…</think>answer`` shape (the copy whose template opens ``<think>`` and the GBNF
grammar of tests/test_reasoning_engine.py): the thinking streams into its block above the
answer, the block folds when the answer starts, the answer bubble holds the answer alone,
both are stored apart, and the reply equals the engine's ``use_cache=False`` one at
temperature 0."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from gui_helpers import new_chat, send_and_wait, wait_for_tree  # noqa: E402
from test_reasoning_engine import grammar_file, think_model  # noqa: E402,F401 - fixtures

from app.session.markdown_export import branch_markdown  # noqa: E402
from app.window.transcript.message_widget import MessageWidget  # noqa: E402
from app.window.transcript.thought_block import thought_summary  # noqa: E402
from app.window.tree.tree_panel import node_label  # noqa: E402
from engine.chat_template import ChatMessage  # noqa: E402
from engine.reasoning import GRAMMAR_ENV  # noqa: E402
from engine.settings import EngineSettings, SamplingParams  # noqa: E402

QUESTION = "What is the capital of France?"


def test_thinking_streams_folds_and_is_stored_apart(qtbot, open_window, data_dir, think_model, grammar_file,
                                                    monkeypatch):
    monkeypatch.setenv(GRAMMAR_ENV, str(grammar_file))  # read by the engine process as it starts
    seen: list[tuple] = []  # (what was set, the thinking shown, block open, answer so far) of the streaming bubble
    for name in ("set_reasoning", "set_text"):
        original = getattr(MessageWidget, name)

        def spy(self, text, _name=name, _original=original):
            _original(self, text)
            if self.message is None and (text or _name == "set_reasoning"):
                seen.append((_name, self.thought.body.text(), self.thought.is_open, self.text))
        monkeypatch.setattr(MessageWidget, name, spy)

    settings = json.loads((data_dir / "settings.json").read_text())
    (data_dir / "settings.json").write_text(json.dumps({**settings, "show_tree": True}))
    w = open_window(data_dir, model_path=str(think_model))
    assert w.model.facts["reasoning_format"] == "<think>"
    cid = new_chat(w, {"max_tokens": 120})
    mid = send_and_wait(qtbot, w, QUESTION)
    assert mid, (w.banner.text, (data_dir / "logs" / "engine.log").read_text()[-3000:])
    reply = w.store.get_message(mid)
    assert reply.reasoning and reply.content and "</think>" not in reply.reasoning + reply.content
    assert reply.stats["reasoning_tokens"] > 0 and reply.stats["reasoning_ms"] > 0

    # streaming: the thinking grew in the open block while the answer was empty, then it folded
    thinking = [s for s in seen if s[0] == "set_reasoning"]
    answering = [s for s in seen if s[0] == "set_text"]
    assert thinking and answering
    assert all(shown and is_open and answer == "" for _, shown, is_open, answer in thinking), seen
    assert reply.reasoning.startswith(thinking[0][1]) and thinking[-1][1] == reply.reasoning
    assert all(not is_open and shown == "" for _, shown, is_open, _a in answering)  # folded at the first answer text
    assert seen.index(answering[0]) > seen.index(thinking[-1])

    # the saved bubble: the answer alone, the thinking folded to its stored figures
    bubble = w.transcript.widgets[-1]
    assert bubble.message.id == mid and bubble.text == reply.content
    assert reply.reasoning not in bubble.body.text()
    block = bubble.thought
    assert block.isVisibleTo(bubble) and not block.is_open and block.body.text() == ""
    summary = thought_summary(reply.stats["reasoning_ms"], reply.stats["reasoning_tokens"])
    assert block.header.text() == summary and summary.startswith("Thought for ")
    assert f"· {reply.stats['reasoning_tokens']} token" in summary
    qtbot.mouseClick(block.header, Qt.MouseButton.LeftButton)  # reopened by a click
    assert block.is_open and block.body.text() == reply.reasoning
    assert block.body.textFormat() == Qt.TextFormat.PlainText
    block.header.setFocus()
    qtbot.keyClick(block.header, Qt.Key.Key_Space)  # and folded again from the keyboard
    assert not block.is_open
    qtbot.keyClick(block, Qt.Key.Key_Return)
    assert block.is_open

    # copy leaves the thinking out unless asked
    menu = {a.text(): a for a in bubble.context_menu().actions()}
    menu["Copy message"].trigger()
    assert QGuiApplication.clipboard().text() == reply.content
    menu["Copy with reasoning"].trigger()
    assert QGuiApplication.clipboard().text() == f"{reply.reasoning}\n\n{reply.content}"
    assert reply.reasoning not in branch_markdown(w.store, cid)
    assert "Copy with reasoning" not in {a.text() for a in w.transcript.widgets[0].context_menu().actions()}

    # the tree labels the reply by its answer
    wait_for_tree(qtbot, w)
    assert w.tree.canvas.label_of(mid) == node_label(reply)
    label, tip = w.tree.canvas.label_of(mid), w.tree.canvas.tooltip_for(mid)
    assert label and label in reply.content and reply.reasoning[:20] not in label + tip

    # a stored reply with reasoning, drawn anew, shows the folded block
    w.chat.render()
    again = w.transcript.widgets[-1]
    assert again.thought.isVisibleTo(again) and again.thought.header.text() == summary and again.text == reply.content

    # the same reply as the engine's with no cache at all, at temperature 0
    sampling = SamplingParams.from_dict(dict(w.store.get_conversation(cid).sampling))
    w.close()
    from engine.core import Engine

    engine = Engine(think_model, EngineSettings(n_ctx=2048, n_threads=1))
    try:
        plain = engine.generate([ChatMessage("user", QUESTION)], sampling, use_cache=False)
    finally:
        engine.close()
    assert (plain.text, plain.reasoning, list(plain.token_ids)) == (reply.content, reply.reasoning,
                                                                    list(reply.token_ids))
