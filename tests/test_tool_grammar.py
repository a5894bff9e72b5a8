"""The tool-call grammar: GBNF from JSON schemas wrapped in each template's syntax, and on
the real default model (which does not call tools by itself) a forced call that parses
and fits its schema."""

from __future__ import annotations


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


def _tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


@pytest.mark.parametrize(("parameters", "words"), [
    ({"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}, "empty enum"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 10**9}}}, "minLength to 1000000000"),
    ({"type": "object", "properties": {"a": {"type": "array", "maxItems": 5000}}}, "maxItems to 5000"),
    (_nested(200), "nested more than 16 levels"),
])
def test_schemas_that_would_hang_or_crash_the_grammar_are_refused_in_words(parameters, words):
    """A breaker's finds: an empty enum made an empty rule (llama.cpp refused it, then
    crashed at the first token); minLength 1e9 and a 200-level schema held the server for
    minutes. Each is now a GrammarError naming the tool and the bound."""
    with pytest.raises(GrammarError, match=words):
        tool_call_grammar(ToolFormat.HERMES, _tool(parameters))
    tool_call_grammar(ToolFormat.HERMES, _tool(_nested(15)))  # within the bound: fine


def test_a_grammar_llama_cpp_refuses_is_an_error_not_a_crash(model_path):
    """A schema that refers to itself converts into a grammar llama.cpp cannot build;
    llama-cpp-python would add the NULL sampler and crash at the first token.
    ``check_grammar`` asks llama.cpp's parser first, with the real vocabulary."""
    import llama_cpp

    from engine.tool_grammar import check_grammar

    vocab_model = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(vocab_model.model)
    selfref = {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]}
    with pytest.raises(GrammarError, match="llama.cpp cannot use"):
        check_grammar(vocab, tool_call_grammar(ToolFormat.HERMES, _tool(selfref)))
    for refused in ('root ::= missing', 'root ::= root "a"'):  # an undefined rule; left recursion
        with pytest.raises(GrammarError):
            check_grammar(vocab, refused)
    check_grammar(vocab, tool_call_grammar(ToolFormat.HERMES, _tool({"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]})))  # a sound grammar passes
