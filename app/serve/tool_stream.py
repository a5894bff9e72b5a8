"""A reply split, while it streams, into content and tool calls, as OpenAI streams them.

``branchwise serve`` feeds :class:`ToolStream` the reply's text with control tokens
shown (``<|python_tag|>``, ``[TOOL_CALLS]`` and gpt-oss's channels are control tokens,
which the engine's text leaves out). It answers with :class:`Delta` events:

* ``content``: text before the first call marker streams at once; a tail that may be the
  start of a marker (``<tool_ca``) is held back until it is not;
* ``call``: a call's index, id and name, once its name is read (OpenAI's first
  ``tool_calls`` delta: ``{"index", "id", "type": "function", "function": {"name",
  "arguments": ""}}``);
* ``arguments``: the next characters of that call's arguments, the JSON text as the model
  writes it, up to its closing brace (``{"index", "function": {"arguments"}}``).

``live`` True (``tool_choice`` "required" or a named function: the grammar makes every
call well-formed) streams arguments as they are generated. ``live`` False (``"auto"``:
nothing constrains the model) holds each call until it is complete and its arguments fit
the tool's schema (``engine.tool_grammar.check_arguments``), then sends it whole: a
malformed call or one naming no listed tool is never announced, and the reply is then
text. :meth:`ToolStream.finish` settles the reply with ``engine.tool_calls.parse_reply``,
the authority on what is a call; every call and every character of content is sent
exactly once, so the deltas joined equal the non-streamed reply.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from engine.tool_calls import ToolCall, ToolFormat, new_call_id, parse_reply
from engine.tool_grammar import check_arguments

__all__ = ["Delta", "ToolStream"]

_OPENERS = {ToolFormat.HERMES: ("<tool_call>",), ToolFormat.MISTRAL: ("[TOOL_CALLS]", '[{"name"'),
            ToolFormat.LLAMA3: ("<|python_tag|>",), ToolFormat.HARMONY: (), ToolFormat.GENERIC: ()}
_JSON_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_HARMONY_HEAD = re.compile(r"to=functions\.([\w.-]+)[^{]*?(?:<\|message\|>|json)\s*(?=\{)")


@dataclass
class Delta:
    """One stream event: ``kind`` "content" (``text``), "call" (``index``, ``id``,
    ``name``) or "arguments" (``index``, ``text``)."""

    kind: str
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""

    def to_openai(self) -> dict:
        """The chunk's ``delta`` object for this event."""
        if self.kind == "content":
            return {"content": self.text}
        if self.kind == "call":
            return {"tool_calls": [{"index": self.index, "id": self.id, "type": "function",
                                    "function": {"name": self.name, "arguments": ""}}]}
        return {"tool_calls": [{"index": self.index, "function": {"arguments": self.text}}]}


@dataclass
class _Call:
    id: str
    name: str
    args_start: int  # where the arguments' JSON begins in the text
    scan: int = 0  # next character to scan
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    end: int = -1  # one past the closing brace, once it is read
    sent: int = 0  # characters of the arguments already sent
    index: int = -1  # its index in the stream, once announced
    args: str = ""

    def advance(self, text: str) -> None:
        """Scan the arguments' JSON as far as ``text`` goes (a string-aware brace count)."""
        i = max(self.scan, self.args_start)
        while i < len(text) and self.end < 0:
            c = text[i]
            if self.depth == 0 and c.isspace():
                self.args_start += 1  # blanks before the object are not part of it
            elif self.depth == 0 and c != "{":
                self.end = -2  # not an object: left to the final parse
                break
            elif self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
            i += 1
        self.scan = i
        stop = self.end if self.end >= 0 else i
        self.args = text[self.args_start:stop]


class ToolStream:
    """Feed the reply's text (control tokens shown) piece by piece; see the module docstring.

    Args:
        fmt: the template's tool-call syntax.
        tools: the request's OpenAI function objects (names and schemas for the checks).
        live: stream arguments as generated (a grammar-forced reply) rather than per call.
    """

    def __init__(self, fmt: ToolFormat, tools: list[dict], *, live: bool):
        self.fmt, self.live = fmt, live
        self.schemas = {f.get("name"): f.get("parameters") for f in (t.get("function", t) for t in tools)}
        self.text = ""
        self.content_sent = ""  # content released so far
        self.calls_from: int | None = 0 if live else None  # where the calls begin, once seen
        self.calls: list[_Call] = []
        self.announced = 0

    # -- streaming -----------------------------------------------------------------------

    def feed(self, piece: str) -> list[Delta]:
        """The events ``piece`` (the next text of the reply) makes ready."""
        self.text += piece
        out: list[Delta] = []
        if self.calls_from is None:
            self._release_content(out)
        if self.calls_from is not None:
            self._scan_calls(out)
        return out

    def _release_content(self, out: list[Delta]) -> None:
        text, fmt = self.text, self.fmt
        if fmt is ToolFormat.HARMONY:  # channels: the final parse says what is content
            return
        if fmt in (ToolFormat.LLAMA3, ToolFormat.GENERIC) and text.lstrip()[:1] == "{":
            self.calls_from = 0  # a bare JSON call (Llama 3.x, the generic form)
            return
        if fmt in (ToolFormat.LLAMA3, ToolFormat.GENERIC) and not text.strip():
            return
        hits = [i for i in (text.find(o) for o in _OPENERS[fmt]) if i >= 0]
        if hits:
            self.calls_from = min(hits)
            safe = self.calls_from
        else:
            hold = 0
            for o in _OPENERS[fmt]:
                for k in range(min(len(o) - 1, len(text)), 0, -1):
                    if text.endswith(o[:k]):
                        hold = max(hold, k)
                        break
            safe = len(text) - hold
        if safe > len(self.content_sent):
            out.append(Delta("content", text[len(self.content_sent):safe]))
            self.content_sent = text[:safe]

    def _scan_calls(self, out: list[Delta]) -> None:
        head = _HARMONY_HEAD if self.fmt is ToolFormat.HARMONY else _JSON_HEAD
        while True:
            last = self.calls[-1] if self.calls else None
            if last is not None:
                last.advance(self.text)
                self._announce(last, out)
                if last.end < 0:
                    return  # still open (or not an object: the final parse decides)
            pos = last.end if last is not None else self.calls_from
            m = head.search(self.text, pos)
            if m is None:
                return
            try:
                name = json.loads(f'"{m.group(1)}"') if head is _JSON_HEAD else m.group(1)
            except ValueError:
                return
            self.calls.append(_Call(new_call_id(), name, m.end()))

    def _announce(self, call: _Call, out: list[Delta]) -> None:
        if call.end == -2 or not self.live and (call.end < 0 or not self._valid(call.name, call.args)):
            return
        if call.index < 0:
            call.index = self.announced
            self.announced += 1
            out.append(Delta("call", index=call.index, id=call.id, name=call.name))
        if len(call.args) > call.sent:
            out.append(Delta("arguments", call.args[call.sent:], index=call.index))
            call.sent = len(call.args)

    def _valid(self, name: str, arguments: str) -> bool:
        return name in self.schemas and check_arguments(arguments, self.schemas[name]) is None

    # -- the end -------------------------------------------------------------------------

    def finish(self, full_text: str | None = None, *, cut: bool = False) -> tuple[str, list[ToolCall], list[Delta]]:
        """``(content, calls, last events)`` once the reply is complete: the calls are
        those :func:`engine.tool_calls.parse_reply` finds in ``full_text`` (the reply with
        control tokens shown, read from its token ids; None: the text fed) that name a
        listed tool with arguments fitting its schema (the streamed id and argument text
        where the stream followed the same call); with none, the whole reply is content,
        unless ``cut`` (the token limit ended it) found a call begun: then the content is
        the text before that call (none when ``live``), never the call's partial markup,
        as OpenAI's API answers a call cut by ``max_tokens``."""
        parsed = parse_reply(self.fmt, self.text if full_text is None else full_text)
        streamed = {c.index: c for c in self.calls if c.index >= 0}
        calls, out = [], []
        for i, pc in enumerate(c for c in parsed.tool_calls if self._valid(c.name, c.arguments)):
            sc = streamed.get(i)
            if sc is not None and sc.name == pc.name and _same_json(sc.args, pc.arguments):
                calls.append(ToolCall(sc.id, sc.name, sc.args))
                continue
            if sc is not None and sc.name == pc.name and pc.arguments.startswith(sc.args):
                out.append(Delta("arguments", pc.arguments[len(sc.args):], index=sc.index))
                calls.append(ToolCall(sc.id, sc.name, pc.arguments))
                continue
            index = self.announced  # one the stream did not follow: sent whole now
            self.announced += 1
            calls.append(pc)
            out += [Delta("call", index=index, id=pc.id, name=pc.name), Delta("arguments", pc.arguments, index=index)]
        target = parsed.content if calls or self.fmt is ToolFormat.HARMONY else self.text  # text: as streamed
        if cut and not calls and self.calls_from is not None and self.fmt is not ToolFormat.HARMONY:
            target = self.text[:self.calls_from]  # a call begun and cut by the limit: not text
        k = len(os.path.commonprefix([self.content_sent, target]))
        if target[k:]:  # what the stream has not said yet (content after or between calls)
            out.append(Delta("content", target[k:]))
        return self.content_sent + target[k:], calls, out


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False
