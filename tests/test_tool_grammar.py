"""The tool-call grammar: GBNF from JSON schemas wrapped in each template's syntax, and on
the real default model (which does not call tools by itself) a forced call that parses
and fits its schema."""

from __future__ import annotations

import json

import pytest

from engine.chat_template import ChatMessage
from engine.settings import EngineSettings, SamplingParams
from engine.tool_calls import ToolFormat, parse_reply
from engine.tool_grammar import GrammarError, check_arguments, tool_call_grammar

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def test_grammar_shape():
    g = tool_call_grammar(ToolFormat.HERMES, [WEATHER, ADD])
    assert "tool0-get-weather-call ::=" in g and "tool1-add-call ::=" in g and g.count("root ::=") == 1
    assert "get-weather" not in tool_call_grammar(ToolFormat.HERMES, [WEATHER, ADD], only="add")


def test_named_function_must_exist():
    with pytest.raises(GrammarError, match="'nope'"):
        tool_call_grammar(ToolFormat.HERMES, [WEATHER], only="nope")


def test_check_arguments():
    schema = WEATHER["function"]["parameters"]
    assert check_arguments('{"city": "Oslo", "unit": "C"}', schema) is None
    assert "required unit" in check_arguments('{"city": "Oslo"}', schema)
    assert "not one of" in check_arguments('{"city": "Oslo", "unit": "K"}', schema)
    assert "unknown x" in check_arguments('{"city": "Oslo", "unit": "C", "x": 1}', schema)
    assert "type integer" in check_arguments('{"a": true, "b": 1}', ADD["function"]["parameters"])
    assert "not valid JSON" in check_arguments("{", schema)


@pytest.fixture(scope="module")
def engine(model_path):
    from engine.core import Engine

    e = Engine(model_path, EngineSettings(n_ctx=2048, n_threads=1), None)
    yield e
    e.close()


@pytest.mark.parametrize("fmt", list(ToolFormat))
def test_forced_calls_on_the_default_model_parse_and_fit_the_schema(engine, fmt):
    """Sampled (temperature 0.8) under each format's grammar, every reply is a call of a
    listed tool whose arguments fit its schema."""
    msgs = [ChatMessage("user", "What is the weather in Oslo, in Celsius? And what is 2+3?")]
    for only, seed in ((None, 1), ("add", 2), ("get_weather", 3)):
        grammar = tool_call_grammar(fmt, [WEATHER, ADD], only=only)
        r = engine.generate(msgs, SamplingParams(temperature=0.8, seed=seed, max_tokens=200), tools=[WEATHER, ADD],
                            grammar=grammar, snapshot=False)
        assert r.stats.finish_reason == "stop", r.text  # the grammar ended, then end-of-turn
        parsed = parse_reply(fmt, r.text)
        assert parsed.tool_calls, r.text
        for c in parsed.tool_calls:
            assert c.name in (("get_weather", "add") if only is None else (only,))
            schema = (WEATHER if c.name == "get_weather" else ADD)["function"]["parameters"]
            assert check_arguments(c.arguments, schema) is None, c.arguments


def test_default_model_has_no_tool_support_and_answers_in_words_unforced(engine):
    pb = engine.model.prompts
    assert pb.tool_format is ToolFormat.GENERIC  # SmolLM2's template has no tool support
    msgs = [ChatMessage("user", "Hello! Who are you?")]
    free = engine.generate(msgs, SamplingParams(temperature=0, max_tokens=16), tools=[WEATHER], snapshot=False)
    assert free.text and parse_reply(pb.tool_format, free.text).tool_calls == []
