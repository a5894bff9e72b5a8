"""Tool-call syntax: detected from public chat templates, rendered by them, parsed back.

The templates are llama.cpp's copies (tests/data/tool_templates/SOURCE.md). Each test
renders an assistant turn holding tool calls through the model's own template, takes the
text the model would have generated (the full render less the prompt), and checks that
the parser splits it into exactly those calls, and that the calls render back to the
same text ("split and join")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.chat_template import ChatMessage, PromptBuilder
from engine.tool_calls import NO_TOOL_SUPPORT, ToolFormat, detect_format, parse_reply

DATA = Path(__file__).parent / "data" / "tool_templates"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Sum",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                      "b": {"type": "integer"}}}}},
]
CASES = {  # template -> (format, the text after the generated part that ends the turn)
    "Qwen-Qwen3-0.6B.jinja": (ToolFormat.HERMES, "<|im_end|>\n"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (ToolFormat.LLAMA3, "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (ToolFormat.MISTRAL, "</s>"),
    "openai-gpt-oss-120b.jinja": (ToolFormat.HARMONY, "<|call|>"),
}


def chars(text: str, _special: bool) -> list[int]:
    return [ord(c) for c in text]


def text_of(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def builder(name: str) -> PromptBuilder:
    return PromptBuilder((DATA / name).read_text(), chars, bos_token="<s>", eos_token="</s>")


def generated_part(pb: PromptBuilder, calls: list[dict], end: str) -> str:
    user = [ChatMessage("user", "Weather in Paris, and 2+3?")]
    prompt = text_of(pb.build(user, True, TOOLS))
    full = text_of(pb.build([*user, ChatMessage("assistant", "", tool_calls=tuple(calls))], False, TOOLS))
    assert full.startswith(prompt)
    rest = full[len(prompt):]
    assert rest.endswith(end), rest
    return rest[: len(rest) - len(end)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_format_is_detected_from_the_template(name):
    assert detect_format((DATA / name).read_text()) is CASES[name][0]
    assert builder(name).tool_format is CASES[name][0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_call_parses_back_to_the_same_call(name):
    fmt, end = CASES[name]
    pb = builder(name)
    calls = [call("abc123xyz", "get_weather", {"city": "Paris \u00e9\"q\""})]
    text = generated_part(pb, calls, end)
    parsed = parse_reply(fmt, text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris \u00e9\"q\""})]
    assert parsed.content == ""
    if fmt is ToolFormat.MISTRAL:
        assert parsed.tool_calls[0].id == "abc123xyz"  # Mistral's syntax carries the id
    # join: the parsed calls render back to the same text
    again = [c.to_openai() for c in parsed.tool_calls]
    again[0]["id"] = "abc123xyz"
    assert generated_part(pb, again, end) == text


def test_parallel_calls_split_in_hermes_and_mistral():
    two = [call("abc123xyz", "get_weather", {"city": "Paris"}), call("def456uvw", "add", {"a": 2, "b": 3})]
    for name in ("Qwen-Qwen3-0.6B.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"):
        fmt, end = CASES[name]
        parsed = parse_reply(fmt, generated_part(builder(name), two, end))
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
            ("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]


def test_tool_result_is_rendered_by_each_template():
    msgs = [ChatMessage("user", "Weather?"), ChatMessage("assistant", "", tool_calls=(call("abc123xyz", "get_weather", {"city": "Oslo"}),)),
            ChatMessage("tool", 'sunny, "12 C"', tool_call_id="abc123xyz", name="get_weather")]
    for name in CASES:
        text = text_of(builder(name).build(msgs, True, TOOLS))
        assert 'sunny' in text and "get_weather" in text, name
    llama = text_of(builder("meta-llama-Llama-3.3-70B-Instruct.jinja").build(msgs, True, TOOLS))
    assert '"sunny, \\"12 C\\""' in llama  # the template's tojson, escaped as it would be rendered


def test_sandbox_tojson_is_plain_json_in_order():
    pb = builder("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    text = text_of(pb.build([ChatMessage("user", "hi")], True, TOOLS))
    assert "&#34;" not in text and '"parameters": {"type": "object"' in text


def test_llama3_text_forms():
    p = parse_reply(ToolFormat.LLAMA3, '<|python_tag|>brave_search.call(query="weather in Paris", n=3)')
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [("brave_search", {"query": "weather in Paris", "n": 3})]
    p = parse_reply(ToolFormat.LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 1}}')
    assert p.tool_calls[0].name == "add" and json.loads(p.tool_calls[0].arguments) == {"a": 1}
    assert parse_reply(ToolFormat.LLAMA3, "The answer is {a} json").tool_calls == []


def test_mistral_v11_form_and_harmony_with_analysis():
    p = parse_reply(ToolFormat.MISTRAL, 'ok[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]get_weather[ARGS]{"city": "X"}')
    assert p.content == "ok" and [c.name for c in p.tool_calls] == ["add", "get_weather"]
    h = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
         'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    p = parse_reply(ToolFormat.HARMONY, h)
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [("get_weather", {"city": "Oslo"})]
    final = parse_reply(ToolFormat.HARMONY, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Hi!")
    assert final.content == "Hi!" and final.tool_calls == []


@pytest.mark.parametrize("fmt", list(ToolFormat))
def test_broken_calls_stay_content(fmt):
    for text in ("", "hello", '<tool_call>{"name": "x", "arguments": [1]}</tool_call>', '[TOOL_CALLS][{"name": 3}]',
                 '{"tool_calls": [{"arguments": {}}]}', '{"name": "x", "arguments": {"a": ', "\ud800"):
        p = parse_reply(fmt, text)
        assert p.tool_calls == [] and p.content == text


def test_template_without_tool_support_is_generic_and_says_so():
    smol = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
            "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    pb = PromptBuilder(smol, chars)
    assert pb.tool_format is ToolFormat.GENERIC
    assert "no tool support" in NO_TOOL_SUPPORT
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather?"),
            ChatMessage("assistant", "", tool_calls=(call("abc123xyz", "get_weather", {"city": "Oslo"}),)),
            ChatMessage("tool", "sunny", tool_call_id="abc123xyz", name="get_weather")]
    text = text_of(pb.build(msgs, True, TOOLS))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools:")
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}<|im_end|>' in text
    assert '<|im_start|>user\n{"tool_response": {"name": "get_weather", "content": "sunny"}}<|im_end|>' in text
    reply = parse_reply(ToolFormat.GENERIC, '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}')
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("add", {"a": 1, "b": 2})]
    # no tools and no tool messages: the prompt is exactly what it was before
    assert text_of(pb.build(msgs[:2], True)) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"


def test_a_lone_surrogate_the_model_writes_in_a_call_is_replaced():
    """A model may write the escape \\ud800 inside a call's JSON: the parsed call holds U+FFFD
    instead, so its name and arguments are text that UTF-8 (the store, the API) can carry."""
    text = '<tool_call>\n{"name": "get_weather\\udfff", "arguments": {"city": "Par\\ud800is"}}\n</tool_call>'
    (call,) = parse_reply(ToolFormat.HERMES, text).tool_calls
    assert call.name == "get_weather\ufffd"
    assert json.loads(call.arguments) == {"city": "Par\ufffdis"}
    call.arguments.encode("utf-8")
    (pair,) = parse_reply(ToolFormat.HERMES, '<tool_call>{"name": "add", "arguments": {"a": "\\ud83d\\ude00"}}'
                                             '</tool_call>').tool_calls
    assert json.loads(pair.arguments) == {"a": "\U0001F600"}  # a surrogate pair is one character, kept
