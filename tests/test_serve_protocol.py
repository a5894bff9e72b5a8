"""The request validation and stop-sequence cutting of ``branchwise serve``, without a server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.serve.protocol import ApiError, StopScanner, parse_chat_request
from app.serve.server import is_loopback
from engine.remote import chat_completions_url, clean
from engine.settings import SamplingParams


@given(st.lists(st.text("ab\n", max_size=4), max_size=12), st.text("ab\n", min_size=1, max_size=3))
def test_stop_scanner_sends_exactly_the_text_before_the_stop(pieces, stop):
    scanner = StopScanner([stop])
    sent = "".join(scanner.feed(p) for p in pieces) + scanner.flush()
    text = "".join(pieces)
    assert sent == (text[: text.index(stop)] if stop in text else text)
    assert scanner.stopped == (stop in text)


def test_stop_scanner_holds_back_only_a_possible_stop():
    s = StopScanner(["END"])
    assert s.feed("hello E") == "hello "
    assert s.feed("x") == "Ex"
    assert s.feed(" EN") == " "
    assert s.feed("D more") == "" and s.stopped and s.text == "hello Ex "


def test_missing_fields_take_branchwise_defaults_and_given_ones_override():
    r = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    assert r.sampling == SamplingParams() and not r.stream and r.stop == []
    r = parse_chat_request({"model": "x", "messages": [{"role": "developer", "content": "be brief"},
                                                       {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                    {"type": "text", "text": "b"}]}],
                            "temperature": 0, "top_p": 0.5, "max_completion_tokens": 7, "seed": 2**40 + 3,
                            "stop": "\n", "stream": True, "stream_options": {"include_usage": True}, "n": 1})
    assert [(m.role, m.content) for m in r.messages] == [("system", "be brief"), ("user", "ab")]
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.max_tokens, r.sampling.seed) == (0, 0.5, 7, 3)
    assert r.stop == ["\n"] and r.stream and r.include_usage


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": True}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
])
def test_bad_fields_are_named(body, param):
    with pytest.raises(ApiError) as err:
        parse_chat_request(body)
    assert err.value.status == 400 and err.value.param == param and err.value.message


def test_loopback_and_urls():
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.com")
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("https://h/api/v1/chat/completions") == "https://h/api/v1/chat/completions"
    assert clean("bad\x1b[31m\u202etext\n") == "bad [31m text"


_CALLED = {"role": "user", "content": "2+3?"}


def _call_request(fn: dict, call_id: str = "call_1", result: dict | None = None) -> dict:
    return {"messages": [_CALLED, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": fn}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5", **(result or {})}]}


@pytest.mark.parametrize("body, param", [
    (_call_request({"name": "add\ud800", "arguments": "{}"}), "messages[1].tool_calls[0].function.name"),
    (_call_request({"name": "add", "arguments": '{"a": "\ud800"}'}), "messages[1].tool_calls[0].function.arguments"),
    (_call_request({"name": "add", "arguments": "{}"}, call_id="c\udfff"), "messages[1].tool_calls[0].id"),
    (_call_request({"name": "add", "arguments": "{}"}, result={"tool_call_id": "call_1\ud800"}),
     "messages[2].tool_call_id"),
    (_call_request({"name": "add", "arguments": "{}"}, result={"name": "add\ud800"}), "messages[2].name"),
    (_call_request({"name": "add", "arguments": "{}"}, result={"content": "fi\ud800ve"}), "messages[2].content"),
    ({"messages": [_CALLED], "tools": [{"type": "function", "function": {
        "name": "add", "description": "Sum \ud800"}}]}, "tools[0].function.description"),
    ({"messages": [_CALLED], "tools": [{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {"a": {"description": "\udc00"}}}}}]},
     "tools[0].function.parameters"),
])
def test_a_lone_surrogate_in_a_tool_field_is_a_400_naming_it(body, param):
    """JSON's "\\ud800" without its pair decodes to a lone surrogate: no character, and it
    cannot be written as UTF-8 (the chat store, an export, the prompt)."""
    with pytest.raises(ApiError) as err:
        parse_chat_request(body)
    assert err.value.status == 400 and err.value.param == param
    assert "lone UTF-16 surrogate" in err.value.message and "\n" not in err.value.message
    good = parse_chat_request(_call_request({"name": "add", "arguments": r'{"a": "\ud83d\ude00"}'}))  # a pair
    assert json.loads(good.messages[1].tool_calls[0]["function"]["arguments"]) == {"a": "\U0001F600"}


_ASK = {"role": "user", "content": "hi"}
_ENUM_TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "F"]}}}}}


def _with_file(name: str) -> dict:
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "read"},
        {"type": "file", "file": {"filename": name, "file_data": "data:text/plain;base64,aGk="}}]}]}


@pytest.mark.parametrize("body, param", [
    ({"messages": [_ASK], "tools": [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"un\ud800it": {"type": "string"}}}}}]}, "tools[0].function.parameters"),
    ({"messages": [_ASK], "tools": [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "\udc00F"]}}}}}]},
     "tools[0].function.parameters"),
    ({"messages": [_ASK, {"role": "assistant", "content": "ok", "reasoning_content": "hm\ud800"}, _ASK]},
     "messages[1].reasoning_content"),
    ({"messages": [_ASK], "stop": "\udfff"}, "stop"),
    ({"messages": [_ASK], "stop": ["end", "x\ud800"]}, "stop[1]"),
    (_with_file("notes\ud800.txt"), "messages[0].content[1].file.filename"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a\ud800"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": "hi", "name": "b\ud800b"}]}, "messages[0].name"),
    ({"messages": [_ASK], "model": "m\ud800"}, "model"),
])
def test_a_lone_surrogate_anywhere_in_a_request_is_a_400_naming_the_field(body, param):
    """One check over the whole decoded body (app.serve.protocol.check_text): also the
    fields no per-field check covered (a tool parameter's name or enum, reasoning, stop,
    a file's name)."""
    with pytest.raises(ApiError) as err:
        parse_chat_request(body)
    assert err.value.status == 400 and err.value.param == param
    assert "lone UTF-16 surrogate" in err.value.message and "\n" not in err.value.message
    assert not _LONE.search(err.value.message)  # the message itself can be sent as UTF-8
    json.dumps(err.value.body(), ensure_ascii=False).encode("utf-8")


_LONE = __import__("re").compile("[\ud800-\udfff]")


def test_a_lone_surrogate_in_a_key_outside_a_schema_names_its_parent():
    with pytest.raises(ApiError) as err:
        parse_chat_request({"messages": [{"role": "user", "content": "hi", "na\ud800me": "x"}]})
    assert err.value.param == "messages[0]" and not _LONE.search(err.value.message)


def test_valid_unicode_in_those_fields_is_accepted():
    r = parse_chat_request({"messages": [_ASK, {"role": "assistant", "content": "ok", "reasoning_content": "\U0001F600"},
                                         {"role": "user", "content": "hi", "name": "\u00e9mile"}],
                            "tools": [_ENUM_TOOL], "stop": ["\U0001F600"]})
    assert r.stop == ["\U0001F600"] and r.messages[1].reasoning == "\U0001F600"
    assert r.tools.tools[0]["function"]["parameters"]["properties"]["unit"]["enum"] == ["C", "F"]


@pytest.mark.parametrize("role", ["user", "system", "assistant", "tool"])
def test_a_message_name_that_is_not_a_string_is_a_400_naming_it(role):
    m = {"role": role, "content": "x", "name": 5, **({"tool_call_id": "c1"} if role == "tool" else {})}
    messages = [_ASK, m] if role in ("assistant", "tool") else [m]
    if role != "user":
        messages.append(_ASK)
    with pytest.raises(ApiError) as err:
        parse_chat_request({"messages": messages})
    assert err.value.status == 400 and err.value.param == f"messages[{messages.index(m)}].name"
    assert err.value.code == "invalid_type"
