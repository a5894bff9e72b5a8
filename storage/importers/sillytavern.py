"""SillyTavern chat files (``data/<user>/chats/<character>/<chat>.jsonl``, or Export chat).

Shape (SillyTavern's public/script.js ``saveChat``; JSON Lines): the first line
is the chat's header,

    {"user_name", "character_name", "create_date", "chat_metadata": {...}}

and every further line one message,

    {"name", "is_user", "is_system", "send_date", "mes", "swipe_id",
     "swipes": ["…", "…"], "swipe_info": [{"send_date", "extra": {"reasoning"}}],
     "extra": {"reasoning", "model", "api", "image", "file": {"name"}, "type"}}

``swipes`` are the alternative replies of one message (its regenerations) and
``swipe_id`` the one shown; only the shown swipe continues the chat, so the
others become leaf siblings. ``is_system`` marks a message hidden from the
model (SillyTavern's "hide message" and its system notes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import IO, Any, Final

from storage.importers import jsonio
from storage.importers.parts import epoch, join_parts, md_escape, placeholder, reasoning, text_of
from storage.importers.records import ImportFileError, SourceConversation, SourceMessage
from storage.importers.thinking import split_think

MAX_LINE: Final = 64 * 1024 * 1024
"""Longest line read (64 MiB); a longer one is reported rather than read into memory whole."""


def read(stream: IO[bytes], name: str) -> Iterator[SourceConversation]:
    """Yield the one chat of a SillyTavern ``.jsonl`` file (``name``: the file name, for the title).

    Raises:
        ImportFileError: a line that is not JSON or not a message object.
    """
    header: dict[str, Any] = {}
    conv = SourceConversation(source_id="", title="")
    parent: str | None = None
    digest = hashlib.sha1()
    number = 0
    while True:
        line = stream.readline(MAX_LINE + 1)
        if not line:
            break
        number += 1
        if len(line) > MAX_LINE:
            raise ImportFileError(f"line {number} is longer than {MAX_LINE // 2**20} MiB")
        if not line.strip():
            continue
        raw = jsonio.json_line(line, number)
        if not isinstance(raw, dict):
            raise ImportFileError(f"line {number} is not a JSON object")
        if number == 1 and "mes" not in raw:
            header = raw
            continue
        if number <= 3:
            digest.update(line)
        parent = _message(conv, raw, number, parent)
    conv.current = parent
    character = text_of(header.get("character_name"))
    if character == "unused":  # group chats and note exports write this placeholder
        character = ""
    created = text_of(header.get("create_date"))
    conv.title = f"{character} · {created}" if character and created else (character or name)
    if not character:  # a group chat: name it after its speakers
        speakers = list(dict.fromkeys(s for s in _speakers(conv) if s))[:4]
        conv.title = f"{name} ({', '.join(speakers)})" if speakers else name
    conv.created_at = epoch(created) or (conv.messages[0].created_at if conv.messages else None)
    conv.source_id = (f"{text_of(header.get('user_name'))}/{character}/{created}" if created
                      else "sha1:" + digest.hexdigest())
    yield conv


def _speakers(conv: SourceConversation) -> list[str]:
    return [m.extra.get("speaker", "") for m in conv.messages if m.extra and m.role == "assistant"]


def _message(conv: SourceConversation, raw: dict, number: int, parent: str | None) -> str:
    if "mes" not in raw:
        raise ImportFileError(f"line {number} is not a chat message (it has no \"mes\")")
    is_user = bool(raw.get("is_user"))
    hidden = bool(raw.get("is_system"))
    role = "system" if hidden else ("user" if is_user else "assistant")
    extra = raw.get("extra") if isinstance(raw.get("extra"), dict) else {}
    swipes = raw.get("swipes") if isinstance(raw.get("swipes"), list) else []
    swipes = [s for s in swipes if isinstance(s, str)]
    infos = raw.get("swipe_info") if isinstance(raw.get("swipe_info"), list) else []
    selected = raw.get("swipe_id", 0)
    if len(swipes) < 2 or role != "assistant":
        swipes, infos, selected = [text_of(raw.get("mes"))], [{"extra": extra}], 0
    elif not isinstance(selected, int) or not 0 <= selected < len(swipes):
        raise ImportFileError(f"line {number}: swipe_id {selected!r} is not one of its {len(swipes)} swipes")
    speaker = text_of(raw.get("name"))
    for k, text in enumerate(swipes):
        info = infos[k] if k < len(infos) and isinstance(infos[k], dict) else {}
        sextra = info.get("extra") if isinstance(info.get("extra"), dict) else {}
        if k == selected:
            sextra = {**sextra, **extra}
        when = epoch(info.get("send_date")) if k != selected else None
        when = when or epoch(raw.get("send_date"))
        conv.messages.append(SourceMessage(
            f"{number}.{k}", parent, role, _text(text, sextra, role, speaker, hidden), when,
            text_of(sextra.get("model")) or None if role == "assistant" else None, hidden=hidden,
            extra={"speaker": speaker}))
    return f"{number}.{selected}"


def _text(text: str, extra: dict, role: str, speaker: str, hidden: bool) -> str:
    parts = []
    if hidden and speaker:
        parts.append(f"**{md_escape(speaker)}:**")
    if text_of(extra.get("reasoning")).strip():
        parts.append(reasoning(text_of(extra.get("reasoning"))))
    parts.append(split_think(text) if role == "assistant" else text)
    if extra.get("image"):
        parts.append(placeholder("Image", text_of(extra.get("title")) or text_of(extra.get("inline_image"))))
    file = extra.get("file")
    if isinstance(file, dict):
        parts.append(placeholder("File", text_of(file.get("name"))))
    for tool in extra.get("tool_invocations") or []:
        if isinstance(tool, dict):
            parts.append(placeholder("Tool call", text_of(tool.get("name"))))
    return join_parts(parts)
