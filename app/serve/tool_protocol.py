"""The tool-calling fields of OpenAI's chat-completions request, checked like every other field.

* ``tools``: a list of ``{"type": "function", "function": {"name", "description",
  "parameters", "strict"}}`` (at most :data:`MAX_TOOLS`; a name of letters, digits,
  ``_``, ``-`` and ``.``, up to 64 characters; ``parameters`` a JSON-schema object);
* ``tool_choice``: "none", "auto" (the default with tools), "required", or
  ``{"type": "function", "function": {"name": NAME}}`` naming one of the tools;
* ``parallel_tool_calls``: true (the default) or false;
* messages: an assistant's ``tool_calls`` (``{"id", "type": "function", "function":
  {"name", "arguments"}}``, ``arguments`` a JSON string) with ``content`` null or text,
  and ``{"role": "tool", "tool_call_id", "content"}`` results.

A mistake raises :class:`ToolFieldError` naming the field (a 400 ``ApiError`` in
``app.serve.protocol``). A lone UTF-16 surrogate in any string of the request is refused
before these fields are read (``app.serve.protocol.check_text``); here only the JSON an
``arguments`` string holds is decoded and checked for one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.chat_template import ChatMessage

__all__ = ["MAX_TOOLS", "ToolFieldError", "ToolRequest", "assistant_calls", "calls_key", "parse_tools", "tool_message"]

MAX_TOOLS = 128  # OpenAI's limit
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
CHOICES = ("none", "auto", "required")


@dataclass
class ToolRequest:
    """The request's tools: ``choice`` is "none", "auto" or "required"; ``named`` the
    one function ``tool_choice`` names (then ``choice`` is "required")."""

    tools: list[dict] = field(default_factory=list)
    choice: str = "none"
    named: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """True when the model may call a tool in this reply."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """True when the reply must be a call (``required`` or a named function)."""
        return self.active and self.choice == "required"


class ToolFieldError(ValueError):
    """A tool field a request got wrong: ``param`` names it, ``code`` is OpenAI's error code
    (``app.serve.protocol`` turns it into a 400 ``ApiError``)."""

    def __init__(self, message: str, param: str, code: str):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _bad(message: str, param: str, code: str = "invalid_value") -> ToolFieldError:
    return ToolFieldError(message, param, code)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _decoded_text(value: str, param: str) -> None:
    """ToolFieldError naming ``param`` when the JSON the string ``value`` holds (as
    ``arguments`` does) decodes to a lone surrogate (an escaped ``"\\ud800"`` inside it); the
    strings of the request themselves are checked once, by ``app.serve.protocol.check_text``."""
    try:
        text = json.dumps(json.loads(value), ensure_ascii=False)
    except (ValueError, RecursionError):
        return
    bad = _LONE_SURROGATE.search(text)
    if bad:
        raise _bad(f"{param} holds a lone UTF-16 surrogate (\\u{ord(bad.group()):04x}), which is not text; "
                   "send valid Unicode (a surrogate pair, or the character itself).", param)


def _tool(t, where: str) -> dict:
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        raise _bad(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}; this server takes "
                   "function tools only.", "tools", "invalid_type")
    fn = t["function"]
    extra = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if extra:
        raise _bad(f"{where}.function has fields this server does not take: {', '.join(extra)}.",
                   f"{where}.function.{extra[0]}", "unknown_parameter")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.'.",
                   f"{where}.function.name")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise _bad(f"{where}.function.description must be a string.", f"{where}.function.description", "invalid_type")
    params = fn.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
        raise _bad(f"{where}.function.parameters must be a JSON schema of type \"object\".",
                   f"{where}.function.parameters", "invalid_type")
    out = {"name": name}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = params if params is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": out}


def parse_tools(body: dict) -> ToolRequest:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a request body.

    Raises:
        ToolFieldError: naming the field (a tool of the wrong shape, two tools with one
            name, a choice naming no listed tool, "required" without tools).
    """
    raw = body.get("tools") or []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _bad(f"'tools' must be a list of at most {MAX_TOOLS} function tools.", "tools", "invalid_type")
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise _bad(f"'tools' lists the function '{dup}' twice.", "tools")
    choice, named = body.get("tool_choice"), None
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": NAME}}.", "tool_choice", "invalid_type")
        named, choice = fn["name"], "required"
        if named not in names:
            raise _bad(f"'tool_choice' names the function '{named}', which is not in 'tools'.", "tool_choice")
    elif choice not in CHOICES:
        raise _bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": NAME}}.", "tool_choice")
    if choice == "required" and not tools:
        raise _bad("'tool_choice' asks for a tool call, but 'tools' is empty.", "tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise _bad("'parallel_tool_calls' must be true or false.", "parallel_tool_calls", "invalid_type")
    return ToolRequest(tools, choice, named, parallel)


def assistant_calls(m: dict, where: str) -> tuple[dict, ...] | None:
    """An assistant message's ``tool_calls``, checked (None when it has none)."""
    raw = m.get("tool_calls")
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise _bad(f"{where}.tool_calls must be a list.", f"{where}.tool_calls", "invalid_type")
    out = []
    for i, tc in enumerate(raw):
        w = f"{where}.tool_calls[{i}]"
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or tc.get("type", "function") != "function" or not isinstance(tc.get("id"), str):
            raise _bad(f"{w} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}.",
                       w, "invalid_type")
        name, args = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str) or not name:
            raise _bad(f"{w}.function.name must be a non-empty string.", f"{w}.function.name", "invalid_type")
        if not isinstance(args, str):
            raise _bad(f"{w}.function.arguments must be a string of JSON.", f"{w}.function.arguments", "invalid_type")
        _decoded_text(args, f"{w}.function.arguments")
        out.append({"id": tc["id"], "type": "function", "function": {"name": name, "arguments": args}})
    return tuple(out)


def tool_message(m: dict, where: str, content: str) -> ChatMessage:
    """A ``{"role": "tool"}`` message (its ``content`` already read by the caller).

    Raises:
        ToolFieldError: when ``tool_call_id`` is missing or not a string.
    """
    call_id = m.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_call_id must name the call this result answers.", f"{where}.tool_call_id",
                   "missing_required_parameter" if call_id is None else "invalid_type")
    return ChatMessage("tool", content, tool_call_id=call_id, name=m.get("name"))


def calls_key(content: str, calls) -> str:
    """The text an assistant reply holding ``calls`` (OpenAI objects) is remembered by in
    :class:`app.serve.replies.ReplyMemory`: its content, the calls' ids, names and
    argument texts exactly as they were sent (a NUL first: no plain reply is this text)."""
    parts = [[c["id"], c["function"]["name"], c["function"]["arguments"]] for c in calls]
    return "\x00tool_calls " + json.dumps([content or "", parts], ensure_ascii=False)
