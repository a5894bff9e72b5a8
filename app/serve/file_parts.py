"""OpenAI ``file`` content parts in ``branchwise serve``: ``{"type": "file", "file":
{"filename": "report.pdf", "file_data": "data:application/pdf;base64,…"}}`` (``file_data``
a data: URL or bare base64).

The file is extracted in a child process with limits (``engine.documents.sandbox``) and goes
into the message in the fixed form of ``engine.documents.render``, before the message's text,
so a client that sends the same file again with its next question makes the same tokens and
the prefix store restores them. Extractions are remembered by the SHA-256 of the file's bytes
(the last ``CACHE_FILES``), so a follow-up does not extract the file again. ``file_id``
(OpenAI's Files API) is not supported: this server stores no files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict

CACHE_FILES = 16
"""Extracted files remembered, newest first (the text only; the bytes are not kept)."""

_cache: OrderedDict[tuple[str, str], object] = OrderedDict()
_lock = threading.Lock()


def decode_file_data(value: str) -> bytes:
    """The bytes of a ``file_data`` value: a ``data:<type>;base64,<data>`` URL or bare base64.
    Raises ValueError when it is neither."""
    data = value
    if value.startswith("data:"):
        head, sep, data = value.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ValueError("file_data must be a base64 data: URL (data:<type>;base64,<data>) or base64")
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("file_data is not valid base64") from None


def file_part(part: dict, where: str):
    """The ``engine.documents.render.AttachedText`` of one ``file`` part.

    Raises:
        ValueError: a malformed part (the text names the field).
        engine.documents.DocumentError: the file cannot be attached (one sentence).
    """
    from engine.documents import attach_bytes
    from engine.documents.attach import attached_text

    f = part.get("file")
    if not isinstance(f, dict):
        raise ValueError(f"{where}.file must be an object with filename and file_data")
    if f.get("file_id") is not None:
        raise ValueError(f"{where}.file.file_id is not supported (this server stores no files); send file_data")
    name, data = f.get("filename"), f.get("file_data")
    if not isinstance(data, str):
        raise ValueError(f"{where}.file.file_data must be a string (a base64 data: URL)")
    name = name if isinstance(name, str) and name.strip() else "attachment"
    raw = decode_file_data(data)
    key = (hashlib.sha256(raw).hexdigest(), name)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    text = attached_text(attach_bytes(raw, name))
    with _lock:
        _cache[key] = text
        while len(_cache) > CACHE_FILES:
            _cache.popitem(last=False)
    return text
