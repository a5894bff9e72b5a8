"""A byte filter between an export file and ijson: linear time however long one string
is, and a cap on how much text one string may hold.

ijson's C backend (yajl2_c) grows a string's buffer in a way that is quadratic in the
length of that one string: a 16 MB message took 3.2 s, 64 MB 36 s, 128 MB 138 s; and a
1.5 GiB string (1.5 MB zipped) would be held whole. So :class:`BoundedReader` copies the
JSON text through, and any string longer than :data:`INLINE_BYTES` is taken out: ijson
sees a short placeholder, the string's escaped bytes are kept aside (up to
:data:`MAX_STRING_BYTES`, 64 MiB; past that only its size is counted) and
:meth:`BoundedReader.resolve` puts the decoded text back into the parsed value (one
``json.loads`` of the string: linear, in C). A string over the cap becomes one line
saying what was there (:func:`too_long_text`), and its size is listed in
``too_long`` for the import report.

The scan is one regular expression at C speed (Python's possessive quantifiers), which
stops only at a long string or at a lone UTF-16 surrogate escape (``"\\ud800"`` without
its pair, which decodes to no character). Such an escape is replaced by ``\\ufffd`` (the
replacement character), the same length, so an export with one broken emoji imports.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import IO, Any

INLINE_BYTES = 64 * 1024
"""Strings up to this many bytes pass through to ijson as they are."""
MAX_STRING_BYTES = 64 * 1024 * 1024
"""The most text one string (one message's text) may hold; more is not imported."""
READ_BYTES = 64 * 1024  # what ijson reads at a time; keeps the buffers small

_HEX = rb"[0-9a-fA-F]"
_ESCAPES = (rb"|\\[^u]|\\u[dD][89abAB]" + _HEX * 2 + rb"\\u[dD][c-fC-F]" + _HEX * 2
            + rb"|\\u(?![dD][89a-fA-F])" + _HEX * 4)
"""A string's escapes but lone surrogates: ``\\n``, a surrogate pair, any other ``\\uXXXX``."""
_FAST = re.compile(rb'(?:[^"]++|"(?:[^"\\]' + _ESCAPES + rb"){0,%d}+\")*+" % INLINE_BYTES)
"""Everything up to the first string that is long or holds a lone surrogate escape."""
_BODY = re.compile(rb'(?:[^"\\]++' + _ESCAPES + rb")*+")
"""A string's body up to its closing quote, a lone surrogate, a broken escape or the buffer's end."""
_LONE = re.compile(rb"\\u[dD][89a-fA-F]" + _HEX * 2)


def too_long_text(size: int) -> str:
    """The line that stands for a string of ``size`` bytes over the cap."""
    return (f"[A text of {size / 2**20:,.0f} MiB was not imported: one message may hold at most "
            f"{MAX_STRING_BYTES // 2**20} MiB]")


class BoundedReader:
    """A binary stream (``read(n)``) giving ``raw``'s JSON text with long strings taken out.

    Attributes:
        too_long: sizes (bytes) of the strings over :data:`MAX_STRING_BYTES` met so far
            (the caller empties it as it reports them).
    """

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.too_long: list[int] = []
        self._buf = b""  # raw bytes not scanned yet
        self._out = bytearray()
        self._eof = False
        self._nonce = secrets.token_hex(6)
        self._marker = re.compile("\ue000" + self._nonce + r"(\d+)\ue001")
        self._aside: dict[int, bytes | int] = {}  # placeholder number -> escaped body, or size over the cap
        self._next = 0

    # -- the stream ijson reads ----------------------------------------------------------

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._out) < n) and not (self._eof and not self._buf):
            self._scan()
        if n < 0:
            n = len(self._out)
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    def _fill(self) -> bool:
        """Append the next raw chunk to ``_buf``; False at the end of the input."""
        if self._eof:
            return False
        chunk = self.raw.read(READ_BYTES)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _scan(self) -> None:
        if not self._buf and not self._fill():
            return
        end = _FAST.match(self._buf).end()
        self._out += self._buf[:end]
        self._buf = self._buf[end:]
        if not self._buf:
            return
        # The scan stopped at a string's opening quote: a long string, a lone surrogate,
        # a broken escape, or one the read cut short (then read on and scan again).
        if len(self._buf) <= INLINE_BYTES * 12 + 16 and self._fill():
            return
        self._slow_string()

    def _slow_string(self) -> None:
        """``_buf`` starts at the opening quote of a string the fast scan stopped at: copy
        it (a lone surrogate replaced), or take it aside when long; consume it."""
        buf, pos = self._buf, 1
        body: bytearray | None = bytearray()
        size = 0  # bytes of the body, also those past the cap

        def take(piece: bytes) -> None:
            nonlocal size, body
            size += len(piece)
            if body is not None and size <= MAX_STRING_BYTES:
                body += piece
            else:
                body = None  # over the cap: only the size is counted from here

        while True:
            end = _BODY.match(buf, pos).end()
            take(buf[pos:end])
            pos = end
            if len(buf) - pos < 12 and not self._eof:  # an escape may be cut by the read
                self._buf, buf, pos = buf[pos:], b"", 0
                self._fill()
                buf = self._buf
                continue
            if pos >= len(buf):
                break  # the input ends inside the string: ijson says the JSON is broken
            if buf[pos] == 0x22:  # the closing quote
                pos += 1
                break
            if _LONE.match(buf, pos):
                take(b"\\ufffd")  # no character: the replacement character, the same length
                pos += 6
            else:
                take(buf[pos:pos + 1])  # a broken escape: ijson reports it
                pos += 1
        self._buf = buf[pos:]
        if body is not None and size <= INLINE_BYTES:
            self._out += b'"' + body + b'"'
            return
        number = self._next
        self._next += 1
        self._aside[number] = bytes(body) if body is not None else size
        self._out += b'"\\ue000' + self._nonce.encode() + str(number).encode() + b'\\ue001"'

    # -- putting the strings back --------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        """``value`` (as parsed from this stream) with each placeholder replaced by its
        string, or by :func:`too_long_text` (its size then added to ``too_long``).

        Raises:
            ValueError: a string taken aside is not valid JSON string text
                (json.JSONDecodeError) or not UTF-8 (UnicodeDecodeError).
        """
        if not self._aside:
            return value
        if isinstance(value, str):
            m = self._marker.fullmatch(value)
            if m is None:
                return value
            kept = self._aside.pop(int(m.group(1)), None)
            if isinstance(kept, int):
                self.too_long.append(kept)
                return too_long_text(kept)
            if kept is None:
                return value
            return json.loads(b'"' + kept + b'"')
        if isinstance(value, dict):
            return {self.resolve(k): self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value
