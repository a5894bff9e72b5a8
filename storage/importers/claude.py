"""Claude's data export: ``conversations.json`` (inside the zip Claude emails).

Shape (Claude's export, as read by open-source readers such as polylogue and
claude-export viewers): a JSON array of conversations, each

    {"uuid", "name", "summary", "created_at", "updated_at" (ISO 8601),
     "current_leaf_message_uuid" (when present),
     "chat_messages": [{"uuid", "sender": "human|assistant", "text",
         "content": [{"type": "text", "text"} | {"type": "thinking", "thinking"}
                     | {"type": "tool_use", "name", "input"}
                     | {"type": "tool_result", "name", "content"} | {"type": "image"}],
         "attachments": [{"file_name", "file_type", "extracted_content"}],
         "files": [{"file_name"}], "created_at",
         "parent_message_uuid"}]}

Messages are linked by ``parent_message_uuid``; the first message's parent is
the all-zero root uuid ``00000000-0000-4000-8000-000000000000``. Edits and
retries are siblings. Older exports have no parent links: their messages
form one chain in file order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any, Final

from storage.importers import jsonio
from storage.importers.parts import (
    code_block,
    epoch,
    join_parts,
    placeholder,
    reasoning,
    text_of,
)
from storage.importers.records import ImportFileError, SourceConversation, SourceMessage
from storage.importers.thinking import split_think

ROOT_UUID: Final = "00000000-0000-4000-8000-000000000000"


def read(stream: IO[bytes], kind: str) -> Iterator[SourceConversation]:
    """Yield the conversations of Claude's ``conversations.json`` one at a time.

    Raises:
        ImportFileError: not JSON, or a conversation without ``chat_messages``.
    """
    return jsonio.each_conversation(stream, kind, conversation)


def conversation(raw: Any, n: int) -> SourceConversation:
    if not isinstance(raw, dict) or not isinstance(raw.get("chat_messages"), list):
        raise ImportFileError(f"conversation #{n + 1} has no \"chat_messages\" list")
    conv = SourceConversation(
        source_id=text_of(raw.get("uuid")) or f"{raw.get('created_at')}:{text_of(raw.get('name'))}",
        title=text_of(raw.get("name")),
        created_at=epoch(raw.get("created_at")),
        updated_at=epoch(raw.get("updated_at")),
        current=text_of(raw.get("current_leaf_message_uuid")) or None,
    )
    linked = any(isinstance(m, dict) and "parent_message_uuid" in m for m in raw["chat_messages"])
    previous: str | None = None
    for i, m in enumerate(raw["chat_messages"]):
        if not isinstance(m, dict):
            raise ImportFileError(f"message #{i + 1} is not an object")
        uuid = text_of(m.get("uuid")) or f"#{i + 1}"
        if linked:
            parent = text_of(m.get("parent_message_uuid")) or None
            if parent == ROOT_UUID:
                parent = None
        else:
            parent = previous
        previous = uuid
        sender = text_of(m.get("sender"))
        role = {"human": "user", "user": "user", "assistant": "assistant", "system": "system"}.get(sender)
        if role is None:
            raise ImportFileError(f"message {uuid!r} has an unknown sender {sender!r}")
        body = _content(m, role)
        conv.messages.append(SourceMessage(uuid, parent, role, body, epoch(m.get("created_at")),
                                           hidden=role == "system"))
    return conv


def _content(m: dict, role: str) -> str:
    blocks = m.get("content") if isinstance(m.get("content"), list) else None
    out: list[str] = []
    if blocks:
        for b in blocks:
            if not isinstance(b, dict):
                continue
            btype = text_of(b.get("type"))
            if btype == "text":
                out.append(split_think(text_of(b.get("text"))) if role == "assistant" else text_of(b.get("text")))
            elif btype == "thinking":
                out.append(reasoning(text_of(b.get("thinking"))))
            elif btype == "tool_use":
                args = b.get("input")
                shown = json.dumps(args, ensure_ascii=False, indent=2) if args is not None else ""
                out.append(join_parts([placeholder("Tool call", text_of(b.get("name")),
                                                   "the call is kept, it was not run here"),
                                       code_block(shown, "json") if shown else ""]))
            elif btype == "tool_result":
                out.append(placeholder("Tool result", text_of(b.get("name"))))
            elif btype in ("image", "document"):
                out.append(placeholder(btype.capitalize()))
            else:
                out.append(placeholder(f"{btype or 'unknown'} content"))
    else:
        out.append(text_of(m.get("text")))
    for a in m.get("attachments") or []:
        if isinstance(a, dict):
            extracted = text_of(a.get("extracted_content"))
            name = text_of(a.get("file_name")) or text_of(a.get("file_type"))
            if extracted.strip():
                out.append(join_parts([placeholder("Attached file", name, "its text follows"),
                                       code_block(extracted)]))
            else:
                out.append(placeholder("Attached file", name))
    for f in m.get("files") or []:
        if isinstance(f, dict):
            out.append(placeholder("File", text_of(f.get("file_name"))))
    return join_parts(out)
