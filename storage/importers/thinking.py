"""Reasoning written inline in a reply's text, turned into the collapsed-quote form of ``parts.reasoning``.

Two inline forms occur in exports:
- ``<think>…</think>`` (DeepSeek-R1, Qwen3 and other reasoning models emit it;
  LM Studio and SillyTavern keep it in the text when the app did not parse it);
- Open WebUI's ``<details type="reasoning" …><summary>…</summary> … </details>``,
  and the same element with ``type="tool_calls"`` or ``type="code_interpreter"``
  for tool calls and code-interpreter runs (backend/open_webui/utils/middleware.py
  in Open WebUI writes them).

Regular expressions here are linear (no nested quantifiers), so hostile text cannot
make them slow.
"""

from __future__ import annotations

import html
import re

from storage.importers.parts import join_parts, placeholder, reasoning

_THINK = re.compile(r"<think(?:ing)?>(.*?)(?:</think(?:ing)?>|\Z)", re.DOTALL | re.IGNORECASE)
_DETAILS = re.compile(r"<details\b([^>]*)>(.*?)</details>", re.DOTALL | re.IGNORECASE)
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL | re.IGNORECASE)


def split_think(text: str) -> str:
    """Replace ``<think>…</think>`` blocks (an unclosed one runs to the end) by a reasoning quote."""
    if "<think" not in text.lower():
        return text
    return _substitute(_THINK, text, lambda m: reasoning(m.group(1)))


def open_webui_details(text: str) -> str:
    """Rewrite Open WebUI's ``<details type=…>`` blocks: reasoning as a quote, tool calls
    and code-interpreter runs as placeholder lines; other ``<details>`` stay as they are."""
    if "<details" not in text.lower():
        return split_think(text)

    def replace(m: re.Match[str]) -> str:
        attrs = dict(_ATTR.findall(m.group(1)))
        kind = attrs.get("type", "")
        body = _SUMMARY.sub("", m.group(2), count=1)
        if kind == "reasoning":
            lines = [line[1:].lstrip() if line.startswith(">") else line for line in body.splitlines()]
            return reasoning(html.unescape("\n".join(lines)))
        if kind == "tool_calls":
            return placeholder("Tool call", html.unescape(attrs.get("name", "")),
                               "the call is kept in the original app, not here")
        if kind == "code_interpreter":
            return placeholder("Code interpreter run")
        return m.group(0)

    return split_think(_substitute(_DETAILS, text, replace))


def _substitute(pattern: re.Pattern[str], text: str, replace) -> str:
    """Replace each match by ``replace(match)`` as a paragraph of its own (blank lines around it)."""
    parts: list[str] = []
    end = 0
    for m in pattern.finditer(text):
        parts += [text[end:m.start()], replace(m)]
        end = m.end()
    parts.append(text[end:])
    return join_parts(parts)
