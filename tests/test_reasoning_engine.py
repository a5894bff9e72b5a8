"""Reasoning on the real default model, end to end (engine and CLI).

SmolLM2 never thinks by itself, so the shape is forced (tools/think_model.py): a copy of
the model whose chat template opens ``<think>`` in the generation prompt (as DeepSeek-R1's
does; written in place, same length), plus a GBNF grammar
(``llama_cpp.LlamaGrammar``) that makes the reply ``thinking\\n</think>\\n\\nanswer``. The
engine must split it, store both parts and every generated id, render the next prompt
with the answer alone, restore from the store up to where the two prompts diverge, and
give the same replies as ``--no-cache`` at temperature 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.chat_template import ChatMessage
from engine.reasoning import GRAMMAR_ENV, ReasoningFormat
from engine.settings import EngineSettings, SamplingParams
from tools.think_model import GRAMMAR, think_copy

SP = SamplingParams(temperature=0.0, max_tokens=120, seed=1)


@pytest.fixture(scope="module")
def think_model(tmp_path_factory, model_path) -> Path:
    d = tmp_path_factory.mktemp("think")
    return think_copy(model_path, d / "think.gguf")


@pytest.fixture(scope="module")
def grammar_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grammar") / "think.gbnf"
    path.write_text(GRAMMAR)
    return path


def _engine(path: Path, tmp_path: Path, grammar: Path | None, store: bool = True):
    from engine.core import Engine
    from engine.reasoning import grammar_from_env
    from storage.prefix_store import PrefixStore

    os.environ[GRAMMAR_ENV] = str(grammar) if grammar else ""
    try:
        s = PrefixStore(tmp_path / "kv.sqlite3") if store else None
        return Engine(path, EngineSettings(n_ctx=2048), store=s), s
    finally:
        os.environ.pop(GRAMMAR_ENV, None)
        assert grammar_from_env() is None


def test_reply_is_split_stored_and_the_next_prompt_drops_the_thinking(think_model, grammar_file, tmp_path):
    engine, store = _engine(think_model, tmp_path, grammar_file)
    try:
        syntax = engine.model.reasoning
        assert syntax.format == ReasoningFormat.THINK and syntax.starts_open
        assert engine.model.facts.reasoning_format == "<think>"
        q1 = [ChatMessage("user", "What is the capital of France?")]
        seen = {"reasoning": "", "answer": ""}
        r1 = engine.generate(q1, SP, on_token=lambda t, _i: seen.__setitem__("answer", seen["answer"] + t),
                             on_reasoning=lambda t, _i: seen.__setitem__("reasoning", seen["reasoning"] + t))
        assert r1.reasoning and r1.text and "</think>" not in r1.text + r1.reasoning
        assert (seen["reasoning"], seen["answer"]) == (r1.reasoning, r1.text)  # streamed apart, as stored
        full = engine.model.detokenize(r1.token_ids)
        head, tail = full.split("\n</think>\n\n")  # the stored ids are the whole reply
        # The answer is stored without the whitespace the model put after </think> (on an
        # AMD EPYC it began ' Sentence').
        assert (head.strip(), tail.lstrip()) == (r1.reasoning, r1.text)
        assert 0 < r1.stats.reasoning_tokens < r1.stats.generated_tokens and r1.stats.reasoning_ms > 0

        history = q1 + [ChatMessage("assistant", r1.text, r1.token_ids, r1.reasoning),
                        ChatMessage("user", "And of Spain?")]
        p2 = engine.prompt_tokens(history)
        text2 = engine.model.detokenize(p2)
        assert r1.text in text2 and r1.reasoning not in text2 and "</think>" not in text2
        computed = r1.prompt_ids + r1.token_ids  # what the store holds after turn 1
        diverge = next(i for i, (a, b) in enumerate(zip(computed, p2)) if a != b)
        assert engine.model.detokenize(p2[:diverge]).endswith("France?\nassistant\n")  # specials show as nothing

        engine.reset_context()  # so turn 2 restores from the prefix store, not the live context
        r2 = engine.generate(history, SP)
        assert r2.stats.restore_source == "store"
        assert r2.stats.restored_tokens == diverge  # up to where the re-rendered prompt departs
        assert r2.stats.restored_tokens + r2.stats.prefilled_tokens == len(p2)
    finally:
        engine.close()
        store.close()

    plain, _ = _engine(think_model, tmp_path / "nocache", grammar_file, store=False)
    try:
        n1 = plain.generate(q1, SP, use_cache=False)
        n2 = plain.generate(history, SP, use_cache=False)
        assert (n1.token_ids, n1.text, n1.reasoning) == (r1.token_ids, r1.text, r1.reasoning)
        assert (n2.token_ids, n2.text, n2.reasoning) == (r2.token_ids, r2.text, r2.reasoning)
    finally:
        plain.close()


def test_thinking_budget_closes_the_thinking_and_the_model_answers(think_model, tmp_path, model_path):
    engine, store = _engine(think_model, tmp_path, None)  # no grammar: SmolLM2 never closes by itself
    try:
        q = [ChatMessage("user", "Tell me about the moon.")]
        open_ended = engine.generate(q, SamplingParams(temperature=0.0, max_tokens=40))
        assert open_ended.text == "" and open_ended.reasoning  # never closed: all thinking
        r = engine.generate(q, SamplingParams(temperature=0.0, max_tokens=60), thinking_budget=10)
        closing = engine.model.tokenize("\n</think>\n\n", True)
        assert r.token_ids[:10] == open_ended.token_ids[:10]  # the same thinking up to the budget
        assert r.token_ids[10:10 + len(closing)] == closing  # then the closing tag, injected
        assert r.reasoning == engine.model.detokenize(r.token_ids[:10]).strip() and r.text
        assert engine.model.detokenize(closing[-1:]) == "\n\n"  # after "</think>": the answer's start
        assert r.stats.reasoning_tokens == 10 + len(closing) - 1  # up to the token that closes the tag
        # the window's path: the budget in the chat's sampling (Settings → Thinking budget)
        via_sampling = engine.generate(q, SamplingParams(temperature=0.0, max_tokens=60, thinking_budget=10))
        assert (via_sampling.token_ids, via_sampling.text, via_sampling.reasoning) == (r.token_ids, r.text, r.reasoning)
    finally:
        engine.close()
        store.close()
    base, store = _engine(model_path, tmp_path / "base", None)
    try:  # a model that does not think: the budget changes nothing
        q = [ChatMessage("user", "Say hello.")]
        a = base.generate(q, SamplingParams(temperature=0.0, max_tokens=30), use_cache=False)
        b = base.generate(q, SamplingParams(temperature=0.0, max_tokens=30), use_cache=False, thinking_budget=3)
        assert (a.token_ids, a.text, a.reasoning) == (b.token_ids, b.text, None)
        assert base.model.reasoning.format == ReasoningFormat.NONE
    finally:
        base.close()
        store.close()


def _bw(data_dir: Path, grammar: Path, *args):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir), GRAMMAR_ENV: str(grammar)}
    out = subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def test_cli_json_store_and_no_cache_agree(think_model, grammar_file, tmp_path):
    from storage.chats import ChatStore

    common = ["--model", think_model, "--temperature", "0", "--max-tokens", "120", "--ctx-size", "2048"]
    first = json.loads(_bw(tmp_path / "a", grammar_file, "chat", *common, "--json", "Name a color.").stdout)
    assert first["reasoning"] and first["text"] and first["model"]["reasoning_format"] == "<think>"
    assert first["stats"]["reasoning_tokens"] > 0
    second = json.loads(_bw(tmp_path / "a", grammar_file, "chat", *common, "--json", "--conversation",
                            first["conversation_id"], "Another one.").stdout)
    nocache = [json.loads(_bw(tmp_path / "b", grammar_file, "chat", *common, "--json", "--no-cache", "Name a color.").stdout)]
    nocache.append(json.loads(_bw(tmp_path / "b", grammar_file, "chat", *common, "--json", "--no-cache",
                                  "--conversation", nocache[0]["conversation_id"], "Another one.").stdout))
    assert [(r["reasoning"], r["text"]) for r in nocache] == [(r["reasoning"], r["text"]) for r in (first, second)]
    assert second["stats"]["restored_tokens"] > 0
    with ChatStore(tmp_path / "a" / "chats.sqlite3") as chats:
        reply = chats.get_message(first["assistant_message_id"])
        assert (reply.content, reply.reasoning) == (first["text"], first["reasoning"])
        assert reply.stats["reasoning_tokens"] == first["stats"]["reasoning_tokens"]
        assert reply.token_ids is not None and len(reply.token_ids) == first["stats"]["generated_tokens"]
    # a pipe gets the answer alone unless asked; --reasoning show prints the thinking first
    plain = _bw(tmp_path / "c", grammar_file, "chat", *common, "--quiet", "Name a color.").stdout
    shown = _bw(tmp_path / "d", grammar_file, "chat", *common, "--quiet", "--reasoning", "show", "Name a color.").stdout
    assert plain.strip() == first["text"].strip()
    assert shown.strip() == f"{first['reasoning']}\n\n{first['text']}".strip() and "\x1b" not in shown
