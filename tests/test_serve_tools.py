"""Tool calling through ``branchwise serve``, with the official ``openai`` client, and through
the remote engine (issue #28, items 1-3).

SmolLM2's own template has no tool support, so the tool tests serve a copy of the default
model whose chat template is Qwen3's (tests/data/tool_templates, Hermes-style
``<tool_call>``), written with gguf's ``gguf_new_metadata``. The model does not call tools
by itself: ``tool_choice: "required"`` (or a named function) samples under the schema
grammar, so every call is valid JSON by construction; the tests parse what comes back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest
from serve_procs import BranchwiseServe

from app.serve.tool_stream import ToolStream
from engine.chat_template import ChatMessage
from engine.settings import SamplingParams
from engine.tool_calls import ToolFormat

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
QUESTION = [{"role": "user", "content": "What is the weather in Oslo, in Celsius?"}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600,
                         http_client=httpx.Client(trust_env=False))


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory, model_path) -> Path:
    from tools.tool_loop_bench import tool_model as qwen3_copy

    return qwen3_copy(tmp_path_factory.mktemp("tool-model"), model_path)


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory, tool_model):
    with BranchwiseServe(tmp_path_factory.mktemp("serve-tools"), "--model", tool_model, "--threads", "1") as s:
        yield s.start()


def _args(call) -> dict:
    return json.loads(call.function.arguments)


def test_required_call_then_the_result_continues_from_the_previous_step(tool_server):
    c = client(tool_server.url)
    r = c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                  temperature=0, max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name in ("get_weather", "add")
    args = _args(call)
    if call.function.name == "get_weather":
        assert isinstance(args["city"], str) and args["unit"] in ("C", "F")
    else:
        assert isinstance(args["a"], int) and isinstance(args["b"], int)

    # The call and its result go back; the reply is text, and only the result is prefilled.
    history = [*QUESTION, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."}]
    final = c.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice="none",
                                      temperature=0, max_tokens=24)
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content and final.choices[0].finish_reason in ("stop", "length")
    step = r.usage.prompt_tokens + r.usage.completion_tokens
    assert final.usage.prompt_tokens_details.cached_tokens >= step  # the whole previous step, call included
    assert final.usage.prompt_tokens - final.usage.prompt_tokens_details.cached_tokens < 40


def test_streamed_call_comes_as_openai_streams_it(tool_server):
    c = client(tool_server.url)
    args = dict(model="m", messages=QUESTION, tools=TOOLS, tool_choice={"type": "function",
                                                                        "function": {"name": "get_weather"}},
                temperature=0, max_tokens=120)
    whole = c.chat.completions.create(**args).choices[0].message.tool_calls[0]
    chunks = list(c.chat.completions.create(**args, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name == "get_weather"
    assert first.function.arguments == ""
    assert len(rest) > 3 and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    streamed = "".join(d.function.arguments for d in rest)
    assert streamed == whole.function.arguments  # the same text as the non-streamed reply
    assert json.loads(streamed)["unit"] in ("C", "F")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_named_function_and_one_call_when_not_parallel(tool_server):
    r = client(tool_server.url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 2 plus 3?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False,
        temperature=0.8, seed=5, max_tokens=120)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "add" and set(_args(call)) >= {"a", "b"}
    assert all(isinstance(v, int) for v in _args(call).values())


def test_tool_choice_none_gives_text(tool_server):
    r = client(tool_server.url).chat.completions.create(model="m", messages=QUESTION, tools=TOOLS,
                                                        tool_choice="none", temperature=0, max_tokens=16)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "function tools only"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "'tools' is empty"),
    ({"messages": [*QUESTION, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id", "tool_call_id"),
    ({"messages": [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"}]},
     "messages[1].tool_calls[0].function.arguments", "string of JSON"),
])
def test_malformed_tool_fields_are_400_naming_the_field(tool_server, body, param, words):
    full = {"model": "m", "messages": QUESTION, "tools": TOOLS, "max_tokens": 4, **body}
    with httpx.Client(trust_env=False) as h:
        r = h.post(tool_server.url + "/chat/completions", json=full, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


def test_a_template_without_tool_support_says_so(tmp_path_factory):
    with BranchwiseServe(tmp_path_factory.mktemp("serve-plain"), "--threads", "1") as s:
        c = client(s.start().url)
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=8)
        assert "has no tool support" in err.value.message and err.value.code == "tools_not_supported"
        with pytest.raises(openai.BadRequestError):  # "auto" (the default with tools) as well
            c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, max_tokens=8)
        text = c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="none",
                                         temperature=0, max_tokens=8)
        assert text.choices[0].message.content and text.choices[0].message.tool_calls is None


# -- the remote engine -------------------------------------------------------------------


def test_remote_engine_against_serve_passes_tools_and_returns_the_calls(tool_server):
    from engine.remote import RemoteEngine

    e = RemoteEngine(tool_server.url)
    try:
        msgs = [ChatMessage("user", QUESTION[0]["content"])]
        r = e.generate(msgs, SamplingParams(temperature=0, max_tokens=120), tools=TOOLS, tool_choice="required")
        (call,) = r.tool_calls
        assert call["type"] == "function" and call["function"]["name"] in ("get_weather", "add") and call["id"]
        assert isinstance(json.loads(call["function"]["arguments"]), dict) and r.text == ""
        step = r.stats.prompt_tokens + r.stats.generated_tokens
        msgs += [ChatMessage("assistant", "", tool_calls=(call,)),
                 ChatMessage("tool", "Sunny.", tool_call_id=call["id"], name=call["function"]["name"])]
        again = e.generate(msgs, SamplingParams(temperature=0, max_tokens=12), tools=TOOLS, tool_choice="none")
        assert again.text and again.tool_calls is None
        assert again.stats.restored_tokens >= step  # the server restored the step the remote engine sent back
    finally:
        e.close()


class _FakeServer(BaseHTTPRequestHandler):
    """Streams llama-server's shape of a tool call, and records the request body."""

    bodies: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        chunks = [{"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "call_7", "type": "function", "function": {"name": "add", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 2, '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '"b": 3}'}}]},
                  {"tool_calls": [{"index": 1, "id": "call_8", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}}]}]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, delta in enumerate([*chunks, {}]):
            event = {"id": "x", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": "tool_calls" if i == len(chunks) else None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *_args):
        pass


def test_remote_engine_sends_tools_and_tool_messages_unchanged():
    from engine.remote import RemoteEngine

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    e = RemoteEngine(f"http://127.0.0.1:{srv.server_address[1]}/v1", model="m")
    earlier = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
    try:
        r = e.generate([ChatMessage("user", "2+3? Weather?"), ChatMessage("assistant", "", tool_calls=(earlier,)),
                        ChatMessage("tool", "2", tool_call_id="call_1", name="add")],
                       SamplingParams(max_tokens=50), tools=TOOLS, tool_choice="auto", parallel_tool_calls=True)
    finally:
        e.close()
        srv.shutdown()
    body = _FakeServer.bodies[-1]
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [earlier]}
    assert body["messages"][2] == {"role": "tool", "content": "2", "tool_call_id": "call_1", "name": "add"}
    assert r.tool_calls == [
        {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_8", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "unit": "C"}'}}]
    assert r.text == ""


def test_a_required_call_cut_by_max_tokens_sends_no_markup_as_content(tool_server):
    """Eight tokens end a forced call inside its JSON: OpenAI's API then answers with
    finish_reason "length" and no content; the template's raw ``<tool_call>`` markup is
    never text, streamed or not."""
    c = client(tool_server.url)
    r = c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                  temperature=0, max_tokens=8)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 8
    assert not choice.message.content and not choice.message.tool_calls
    chunks = list(c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                            temperature=0, max_tokens=8, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    full = c.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, tool_choice="required",
                                     temperature=0, max_tokens=120)  # the same call, given room, is a call
    assert full.choices[0].finish_reason == "tool_calls" and full.choices[0].message.tool_calls


# -- the stream splitter, without a model --------------------------------------------------


def _split(fmt, text, live, step=2):
    s = ToolStream(fmt, TOOLS, live=live)
    events = [d for i in range(0, len(text), step) for d in s.feed(text[i:i + step])]
    content, calls, last = s.finish()
    return content, calls, events + last


def test_auto_mode_streams_text_and_announces_only_calls_that_fit():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls, events = _split(ToolFormat.HERMES, "Let me add. " + call, live=False)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    kinds = [e.kind for e in events]
    assert kinds.index("call") > kinds.index("content") and "".join(
        e.text for e in events if e.kind == "content") == content == "Let me add. "
    assert "".join(e.text for e in events if e.kind == "arguments") == calls[0].arguments
    for bad in ('{"name": "add", "arguments": {"a": "two", "b": 3}}', '{"name": "nope", "arguments": {}}'):
        text = "<tool_call>\n" + bad + "\n</tool_call>"
        content, calls, events = _split(ToolFormat.HERMES, text, live=False)
        assert calls == [] and content == text and {e.kind for e in events} == {"content"}
    content, calls, events = _split(ToolFormat.HERMES, "a <tool_ca is not a call", live=False)
    assert calls == [] and "".join(e.text for e in events) == content == "a <tool_ca is not a call"


def test_a_call_cut_by_the_token_limit_leaves_only_the_text_before_it():
    cut = '<tool_call>\n{"name": "add", "arguments": {"a": 2'
    for live, before in ((True, ""), (False, "Let me add. ")):
        s = ToolStream(ToolFormat.HERMES, TOOLS, live=live)
        text = before + cut
        events = [d for i in range(0, len(text), 3) for d in s.feed(text[i:i + 3])]
        content, calls, last = s.finish(cut=True)
        assert calls == [] and content == before
        assert "".join(e.text for e in events + last if e.kind == "content") == before
    s = ToolStream(ToolFormat.HERMES, TOOLS, live=False)  # a cut reply with no call begun stays text
    s.feed("just text")
    assert s.finish(cut=True)[0] == "just text"


@pytest.mark.parametrize(("fmt", "full", "shown"), [
    (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcdefghi"}]',
     '[{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abcdefghi"}]'),
    (ToolFormat.LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}',
     '{"name": "add", "parameters": {"a": 2, "b": 3}}'),
    (ToolFormat.HARMONY, '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}',
     'commentary to=functions.add json{"a": 2, "b": 3}'),
])
def test_calls_whose_markers_are_control_tokens_stream_as_calls_not_text(fmt, full, shown):
    """The engine's streamed text leaves control tokens out; the end reads the calls from
    the text with them shown (the ids), and nothing of the call was sent as content."""
    s = ToolStream(fmt, TOOLS, live=False)
    events = [d for i in range(0, len(shown), 3) for d in s.feed(shown[i:i + 3])]
    content, calls, last = s.finish(full)
    events += last
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert content == "" and not [e for e in events if e.kind == "content"]
    assert [e.kind for e in events].count("call") == 1
    assert "".join(e.text for e in events if e.kind == "arguments") == calls[0].arguments
