"""Streaming JSON reading (ijson) with errors a person can act on.

Exports can be hundreds of MB (ChatGPT's ``conversations.json`` holds every
conversation ever had), so the readers never load a whole file: ``items``
yields one top-level element (one conversation) at a time, so memory is
bounded by the largest conversation, not the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

import ijson

from storage.importers.bounded import BoundedReader
from storage.importers.records import ImportFileError


class CountingReader:
    """A binary stream that counts the bytes read through it (for progress)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.done = 0
        self.too_long: list[int] = []  # sizes of strings over the cap read so far (storage/importers/bounded.py)

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.done += len(data)
        return data

    def readline(self, limit: int = -1) -> bytes:
        data = self.raw.readline(limit)
        self.done += len(data)
        return data


def first_char(head: bytes) -> str:
    """The first non-blank character of a JSON text ("" if none); a UTF-8 BOM is skipped."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    return text[:1].decode("ascii", "replace")


def items(stream: IO[bytes], prefix: str) -> Iterator[Any]:
    """Yield the JSON values at ``prefix`` ("item": elements of a top-level array; "": the document).

    Numbers come back as int or float (never Decimal). The text goes through
    :class:`storage.importers.bounded.BoundedReader`: linear in the length of any one
    string, a string over 64 MiB replaced by a line saying so (its size is added to
    ``stream.too_long`` when the stream has that list), a lone surrogate escape
    (``"\\ud800"``) read as U+FFFD.

    Raises:
        ImportFileError: the text is not valid JSON (with ijson's description).
    """
    bounded = BoundedReader(stream)
    try:
        for value in ijson.items(bounded, prefix, use_float=True):
            value = bounded.resolve(value)
            if bounded.too_long and isinstance(getattr(stream, "too_long", None), list):
                stream.too_long.extend(bounded.too_long)
            bounded.too_long.clear()
            yield value
    except (ijson.JSONError, json.JSONDecodeError) as exc:
        raise ImportFileError(f"it is not valid JSON ({_short(exc)})") from exc
    except UnicodeDecodeError as exc:
        raise ImportFileError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def top_keys(stream: IO[bytes], limit: int = 200_000) -> tuple[str, set[str], str]:
    """Peek at a JSON text: "{" or "[" (or "" for anything else), the keys of the
    top-level object, or of the first element of a top-level array, and what that first
    element is ("object", "number", "string", "array", "boolean", "null"; "" for an
    empty array or an object). Stops at the end of that object or after ``limit`` parse
    events.

    Raises:
        ImportFileError: not valid JSON within what was read.
    """
    keys: set[str] = set()
    kind = first = ""
    try:
        for n, (prefix, event, value) in enumerate(ijson.parse(BoundedReader(stream), use_float=True)):
            if n == 1 and kind == "[" and prefix == "item":
                first = _KINDS.get(event, "")
            if n == 0:
                kind = {"start_map": "{", "start_array": "["}.get(event, "")
                if not kind:
                    break
            elif event == "map_key" and prefix == ("" if kind == "{" else "item"):
                keys.add(value)
            elif event == "end_map" and prefix == ("" if kind == "{" else "item"):
                break
            elif kind == "[" and prefix == "item" and event not in ("start_map", "map_key"):
                break  # the array's first element is not an object
            if n >= limit:
                break
    except ijson.JSONError as exc:
        raise ImportFileError(f"it is not valid JSON ({_short(exc)})") from exc
    except UnicodeDecodeError as exc:
        raise ImportFileError(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return kind, keys, first


_KINDS = {"start_map": "object", "start_array": "array", "number": "number", "string": "string",
          "boolean": "boolean", "null": "null"}


def json_line(line: bytes, number: int) -> Any:
    """Parse one line of a JSON Lines file; ``number`` (1-based) goes into the error.

    Raises:
        ImportFileError: the line is not valid JSON.
    """
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ImportFileError(f"line {number} is not valid JSON ({exc})") from exc


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "…"


def each_conversation(stream: IO[bytes], kind: str, parse: Callable[[Any, int], Any]) -> Iterator[Any]:
    """Parse the conversations of a JSON array (``kind`` "[") or of one conversation object
    (``kind`` "{") one at a time with ``parse(raw, index)``; an ImportFileError it raises is
    prefixed with the conversation's title or position (``parts.conversation_label``)."""
    from storage.importers.parts import conversation_label

    for n, raw in enumerate(items(stream, "item" if kind == "[" else "")):
        try:
            conv = parse(raw, n)
        except ImportFileError as exc:
            raise ImportFileError(f"{conversation_label(raw, n)}: {exc}") from exc
        yield conv
