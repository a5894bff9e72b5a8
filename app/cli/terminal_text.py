"""Text from chats, made safe to print on a terminal.

A title, a message or a model's reply can hold terminal control sequences: ``ESC ] 52``
(OSC 52) writes to the clipboard, ``ESC [ 8 m`` hides the text after it, ``CR`` and
backspaces overwrite what was printed, and bidirectional overrides (U+202A–U+202E,
U+2066–U+2069) reorder it ("Trojan Source", CVE-2021-42574). When output goes to a
terminal, every such character is shown as a visible escape (``\\x1b``, ``\\r``,
``\\u202e``) instead of being sent; newlines and tabs are kept. Output to a pipe or a file,
and ``--json``, stay byte-for-byte what was stored: only a terminal interprets them.

The control characters are Unicode's general category Cc (C0: U+0000–U+001F, DEL U+007F,
C1: U+0080–U+009F; C1 includes the 8-bit CSI U+009B and OSC U+009D that some terminals obey).
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

_KEEP = "\n\t"
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"  # Cc, less \t and \n
    "\u202a-\u202e\u2066-\u2069"  # bidirectional embeddings, overrides and isolates
    "\u200e\u200f\u061c]"  # bidirectional marks
)


def _escape(match: re.Match) -> str:
    c = match.group(0)
    if c == "\r":
        return "\\r"
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control and bidi-override character replaced by a visible
    escape (``"\\x1b"``, ``"\\r"``, ``"\\u202e"``); newlines and tabs are kept."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """``text`` on one line (for a list entry): control characters escaped, line breaks
    shown as spaces."""
    return escape_controls(" ".join(text.splitlines()))


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def for_stream(text: str, stream: TextIO | None = None) -> str:
    """``text`` as it should be written to ``stream`` (default stdout): escaped when the
    stream is a terminal, unchanged otherwise."""
    return escape_controls(text) if is_terminal(stream or sys.stdout) else text


def echo(text: str = "", stream: TextIO | None = None, end: str = "\n") -> None:
    """``print`` for text that came from a chat or a model (see the module docstring)."""
    stream = stream or sys.stdout
    stream.write(for_stream(text, stream) + end)
