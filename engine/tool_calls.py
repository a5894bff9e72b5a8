"""Tool calls in the model's own words: which syntax a chat template uses, and parsing it.

A chat template that supports tools renders the request's ``tools`` (OpenAI's list of
``{"type": "function", "function": {name, description, parameters}}``), assistant
messages' ``tool_calls`` and ``role: "tool"`` results itself; the model then answers a
call in the syntax its template taught it. The syntaxes read here are those llama.cpp
reads (``common/chat.cpp``, and its ``models/templates/`` for the templates):

* :attr:`ToolFormat.HERMES` (Hermes 2/3, Qwen 2.5/3): ``<tool_call>\\n{"name": ..,
  "arguments": {..}}\\n</tool_call>``, one block per call;
* :attr:`ToolFormat.LLAMA3` (Llama 3.1-3.3): a bare JSON ``{"name": .., "parameters":
  {..}}`` (or ``"arguments"``), optionally after ``<|python_tag|>``, where a built-in tool
  call ``name.call(key="value", ..)`` may also stand;
* :attr:`ToolFormat.MISTRAL`: ``[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ..}]``
  (Nemo, Small 3.1) or ``[TOOL_CALLS]name[ARGS]{..}`` (Small 3.2, Devstral);
* :attr:`ToolFormat.HARMONY` (gpt-oss): ``<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{..}`` (the call ends at the ``<|call|>`` token);
* :attr:`ToolFormat.GENERIC`: the template has no tool support. Then Branchwise says so
  (:data:`NO_TOOL_SUPPORT`), describes the tools in a system message, and asks for JSON
  ``{"tool_calls": [{"name": .., "arguments": {..}}]}`` as llama.cpp's generic format does;
  calls and results are given to the template as plain assistant and user text.

Model output is hostile text: a parse never raises, and what is not a well-formed call
stays content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["NO_TOOL_SUPPORT", "ParsedReply", "ToolCall", "ToolFormat", "detect_format", "generic_chat_messages",
           "new_call_id", "parse_reply", "reply_text_with_controls", "template_message"]


class ToolFormat(StrEnum):
    """The tool-call syntax of a chat template (see the module docstring)."""

    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    HARMONY = "harmony"
    GENERIC = "generic"


NO_TOOL_SUPPORT = ("The model's chat template has no tool support, so Branchwise describes the tools in a "
                   "system message and asks for a JSON reply; a model not trained for tools may not call them "
                   "unless tool_choice is \"required\" or names a function.")


def detect_format(template: str | None) -> ToolFormat:
    """The :class:`ToolFormat` of a chat template's text (None or blank: GENERIC)."""
    t = template or ""
    if "<|channel|>" in t and ("to=functions" in t or "<|call|>" in t):
        return ToolFormat.HARMONY
    if "[TOOL_CALLS]" in t:
        return ToolFormat.MISTRAL
    if "<tool_call>" in t:
        return ToolFormat.HERMES
    if "<|python_tag|>" in t or "ipython" in t:
        return ToolFormat.LLAMA3
    return ToolFormat.GENERIC


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is the JSON text of an object (as OpenAI sends it)."""

    id: str
    name: str
    arguments: str

    def to_openai(self, index: int | None = None) -> dict:
        """OpenAI's ``tool_calls[i]`` object (with ``index`` for a stream chunk)."""
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass
class ParsedReply:
    """A reply split into its text ``content`` and its ``tool_calls`` (maybe none)."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""  # a leading <think>…</think> block (Qwen 3, DeepSeek R1), without its tags


def new_call_id() -> str:
    """A fresh call id: 9 letters and digits (Mistral's templates refuse any other shape)."""
    return uuid.uuid4().hex[:9]


def _call(name, args, call_id=None) -> ToolCall | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    cid = call_id if isinstance(call_id, str) and call_id else new_call_id()
    return ToolCall(as_text(cid), as_text(name), as_text(json.dumps(args, ensure_ascii=False)))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def as_text(value: str) -> str:
    """``value`` with each lone UTF-16 surrogate (what JSON's ``"\\ud800"`` without its pair
    decodes to: no character, and UTF-8 cannot hold it) replaced by U+FFFD, so a call's id,
    name and arguments, and a tool's result, can be stored and sent."""
    return _LONE_SURROGATE.sub("\ufffd", value)


def _json_at(text: str, pos: int):
    """``(value, end)`` of the JSON value starting at ``pos`` (after blanks), or None."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return json.JSONDecoder().raw_decode(text, pos)
    except (ValueError, RecursionError):
        return None


def _from_object(obj) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    args = obj.get("arguments", obj.get("parameters"))
    return _call(obj.get("name"), args, obj.get("id"))


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def _parse_hermes(text: str) -> ParsedReply:
    think = _THINK.match(text)
    if think:
        inner = _parse_hermes(text[think.end():])
        if inner.tool_calls:
            inner.reasoning = think.group(1).strip()
            return inner
        return ParsedReply(text)
    calls, kept, pos = [], [], 0
    for m in _HERMES.finditer(text):
        got = _json_at(m.group(1), 0)
        call = _from_object(got[0]) if got and not m.group(1)[got[1]:].strip() else None
        if call is None:
            continue
        calls.append(call)
        kept.append(text[pos:m.start()])
        pos = m.end()
    kept.append(text[pos:])
    return ParsedReply("".join(kept).strip() if calls else text, calls)


_BUILTIN = re.compile(r"^\s*([A-Za-z_][\w.]*)\.call\((.*)\)\s*$", re.S)
_KWARG = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*("(?:[^"\\]|\\.)*"|[^,]+)\s*(?:,|$)')


def _parse_llama3(text: str) -> ParsedReply:
    body = text
    tagged = "<|python_tag|>" in text
    if tagged:
        before, body = text.split("<|python_tag|>", 1)
        m = _BUILTIN.match(body)
        if m:
            args = {}
            for k, v in _KWARG.findall(m.group(2)):
                try:
                    args[k] = json.loads(v)
                except ValueError:
                    args[k] = v.strip()
            call = _call(m.group(1), args)
            return ParsedReply(before.strip(), [call]) if call else ParsedReply(text)
    calls, rest = [], body
    while True:  # one JSON object, or several separated by ";" (Llama 3.1's parallel form)
        got = _json_at(rest, 0)
        call = _from_object(got[0]) if got else None
        if call is None:
            break
        calls.append(call)
        rest = rest[got[1]:].lstrip().removeprefix(";")
        if not rest.strip():
            rest = ""
            break
    if not calls or rest.strip():
        return ParsedReply(text)
    return ParsedReply(text.split("<|python_tag|>", 1)[0].strip() if tagged else "", calls)


def _parse_mistral(text: str) -> ParsedReply:
    if "[TOOL_CALLS]" not in text:
        return ParsedReply(text)
    content, tail = text.split("[TOOL_CALLS]", 1)
    got = _json_at(tail, 0)
    if got and isinstance(got[0], list):
        calls = [_from_object(o) for o in got[0]]
        if calls and all(calls) and not tail[got[1]:].strip():
            return ParsedReply(content.strip(), calls)
        return ParsedReply(text)
    calls = []  # name[ARGS]{...} repeated, each maybe after its own [TOOL_CALLS]
    for part in tail.split("[TOOL_CALLS]"):
        name, sep, args = part.partition("[ARGS]")
        got = _json_at(args, 0) if sep else None
        call = _call(name.strip(), got[0]) if got and not args[got[1]:].strip() else None
        if call is None:
            return ParsedReply(text)
        calls.append(call)
    return ParsedReply(content.strip(), calls)


_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:to=functions\.([\w.-]+)\s*)?<\|channel\|>commentary"
    r"(?:\s+to=functions\.([\w.-]+))?\s*(?:<\|constrain\|>\s*\w+|json)?\s*<\|message\|>", re.S)
_HARMONY_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.S)


def _parse_harmony(text: str) -> ParsedReply:
    calls = []
    for m in _HARMONY_CALL.finditer(text):
        name = m.group(1) or m.group(2)
        if not name:
            continue
        got = _json_at(text, m.end())
        call = _call(name, got[0]) if got else None
        if call is not None:
            calls.append(call)
    if not calls:
        final = _HARMONY_FINAL.search(text)
        return ParsedReply(final.group(1) if final else text)
    final = _HARMONY_FINAL.search(text)
    return ParsedReply(final.group(1).strip() if final else "", calls)


def _parse_generic(text: str) -> ParsedReply:
    got = _json_at(text, 0)
    if not got or text[got[1]:].strip() or not isinstance(got[0], dict):
        return ParsedReply(text)
    obj = got[0]
    if isinstance(obj.get("tool_calls"), list):
        calls = [_from_object(o) for o in obj["tool_calls"]]
        return ParsedReply("", calls) if calls and all(calls) else ParsedReply(text)
    if isinstance(obj.get("tool_call"), dict):
        call = _from_object(obj["tool_call"])
        return ParsedReply("", [call]) if call else ParsedReply(text)
    if isinstance(obj.get("response"), str):
        return ParsedReply(obj["response"])
    return ParsedReply(text)


_PARSERS = {ToolFormat.HERMES: _parse_hermes, ToolFormat.LLAMA3: _parse_llama3, ToolFormat.MISTRAL: _parse_mistral,
            ToolFormat.HARMONY: _parse_harmony, ToolFormat.GENERIC: _parse_generic}


def parse_reply(fmt: ToolFormat, text: str) -> ParsedReply:
    """Split a reply ``text`` (detokenized with control tokens shown) into content and
    tool calls in syntax ``fmt``. Never raises: what is not a well-formed call is content."""
    return _PARSERS[fmt](text)


def reply_text_with_controls(model, token_ids: list[int]) -> str:
    """The text of a reply's ``token_ids`` with control tokens shown (``[TOOL_CALLS]``,
    ``<|python_tag|>``, gpt-oss's channels), what :func:`parse_reply` reads: the engine's
    streamed text leaves them out. ``model``: an ``engine.model.Model`` (``token_bytes``)."""
    return b"".join(model.token_bytes(t, special=True) for t in token_ids).decode("utf-8", "replace")


# -- templates without tool support ------------------------------------------------------


def generic_system_text(tools: list[dict]) -> str:
    """The system text that describes ``tools`` to a model whose template has no tool support."""
    specs = json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=2)
    return ("You can call these tools:\n" + specs + "\n\nTo call tools, reply with JSON only: "
            '{"tool_calls": [{"name": <tool name>, "arguments": <arguments object>}]}. '
            "To answer the user, reply with plain text.")


def generic_call_text(tool_calls: list[dict]) -> str:
    """An assistant's ``tool_calls`` (OpenAI objects) as the JSON text the generic format
    asks for (the same spelling its grammar produces)."""
    calls = []
    for tc in tool_calls:
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        calls.append({"name": fn.get("name"), "arguments": args if args is not None else {}})
    return json.dumps({"tool_calls": calls}, ensure_ascii=False)


def _args_object(tc: dict) -> dict:
    fn = dict(tc.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
            fn["arguments"] = parsed if isinstance(parsed, dict) else args
        except ValueError:
            pass
    return {**tc, "function": fn}


def template_message(m, content: str) -> dict:
    """A ``ChatMessage``-like ``m`` as a chat template sees it, ``content`` in place of its
    own: an assistant's ``tool_calls`` with their arguments as objects (llama.cpp does the
    same: templates loop over ``arguments | items`` or ``tojson`` them), a tool result with
    its ``tool_call_id`` and ``name``."""
    out = {"role": m.role, "content": content}
    if m.tool_calls:
        out["tool_calls"] = [_args_object(tc) for tc in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def generic_chat_messages(messages, tools: list[dict] | None) -> list:
    """``messages`` (``ChatMessage``) rewritten for a template with no tool support: the
    tools described in the first system message, an assistant's calls as the JSON text of
    :func:`generic_call_text` (a generated one keeps its own text and ids), tool results as
    user messages ``{"tool_response": {"name", "content"}}`` (llama.cpp's polyfill)."""
    from engine.chat_template import ChatMessage  # noqa: PLC0415 - chat_template imports this module

    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls and m.token_ids is None:
            content = (m.content + "\n" if m.content else "") + generic_call_text(list(m.tool_calls))
            out.append(ChatMessage("assistant", content))
        elif m.role == "tool":
            body = {"tool_response": {"name": m.name or "", "content": m.content}}
            out.append(ChatMessage("user", json.dumps(body, ensure_ascii=False)))
        else:
            out.append(ChatMessage(m.role, m.content, m.token_ids))
    if tools:
        text = generic_system_text(tools)
        if out and out[0].role == "system":
            out[0] = ChatMessage("system", out[0].content + "\n\n" + text)
        else:
            out.insert(0, ChatMessage("system", text))
    return out
