"""Text for what Branchwise cannot show, and small parsers shared by the readers.

A message is Markdown (rendered by ``app/window/transcript/markdown_view.py`` with raw HTML
shown as text), so:
- content Branchwise cannot show (an image, a file, a tool call, a hidden
  system message) becomes one italic placeholder line in square brackets that
  says what was there, e.g. ``*[Image: photo.png (not imported)]*``;
- reasoning ("thoughts") becomes a block quote under a bold "Reasoning"
  heading, set apart from the answer (``<details>`` would show as raw text).

Names taken from a file (file names, tool names) are escaped so that they
show as the characters they are and never become links or formatting.
"""

from __future__ import annotations

import re
from datetime import datetime

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~])")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown punctuation and flatten newlines: ``text`` shows literally."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def placeholder(kind: str, detail: str = "", note: str = "not imported") -> str:
    """One readable line for content that was not imported: ``*[Kind: detail (note)]*``.

    ``kind`` is our own wording ("Image", "File", "Tool call"); ``detail``
    comes from the file and is escaped; ``note`` may be "".
    """
    body = kind + (f": {md_escape(detail)}" if detail and str(detail).strip() else "")
    if note:
        body += f" ({note})"
    return f"*\\[{body}\\]*"


def reasoning(text: str, title: str = "Reasoning") -> str:
    """Reasoning/"thoughts" as a block quote under a bold title ("" for blank text)."""
    text = text.strip("\n")
    if not text.strip():
        return ""
    quoted = "\n".join(f"> {line}" if line.strip() else ">" for line in text.splitlines())
    return f"> **{md_escape(title)}**\n>\n{quoted}"


def code_block(code: str, language: str = "") -> str:
    """A fenced code block long enough that no backtick run inside ``code`` closes it."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    lang = re.sub(r"[^A-Za-z0-9_+.-]", "", language)[:30]
    return f"{fence}{lang}\n{code.rstrip()}\n{fence}"


def join_parts(parts: list[str]) -> str:
    """Join non-blank parts with a blank line between them."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip())


def epoch(value: object) -> float | None:
    """Unix seconds from a number (seconds or milliseconds) or an ISO 8601 string; None if unknown.

    Numbers above 10^11 are taken as milliseconds (10^11 s is the year 5138).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return v / 1000.0 if abs(v) > 1e11 else v
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return epoch(float(text))
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            return None if parsed.year < 1 else parsed.timestamp()
        return parsed.timestamp()
    return None


def text_of(value: object) -> str:
    """A string field as text: None -> "", other non-strings -> "" (never their repr)."""
    return value if isinstance(value, str) else ""


def conversation_label(raw: object, n: int) -> str:
    """How an error names a conversation of an export: its title and id, else its position."""
    if isinstance(raw, dict):
        inner = raw.get("chat") if isinstance(raw.get("chat"), dict) else {}
        title = text_of(raw.get("title")) or text_of(raw.get("name")) or text_of(inner.get("title"))
        ident = next((text_of(raw.get(k)) for k in ("conversation_id", "uuid", "id") if text_of(raw.get(k))), "")
        if title or ident:
            return f"conversation {title!r} (id {ident or '?'})" if title else f"conversation {ident}"
    return f"conversation #{n + 1}"
