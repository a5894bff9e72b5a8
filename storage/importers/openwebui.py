"""Open WebUI's chat export (Settings → Chats → Export chats, a ``chat-export-*.json``).

Shape (backend/open_webui/models/chats.py ``ChatModel`` in Open WebUI; its own
importer reads the same): a JSON array of chats, each

    {"id", "title", "created_at", "updated_at" (unix seconds), "pinned",
     "chat": {"title", "models": [...], "params": {"system"}, "system",
              "history": {"currentId", "messages": {id: {
                  "id", "parentId", "childrenIds", "role", "content",
                  "timestamp", "model", "files": [{"type", "name", "url"}]}}},
              "messages": [...the current branch only...]}}

``history.messages`` is the whole tree (``parentId``/``childrenIds``) and
``currentId`` the leaf shown; the flat ``messages`` list is only the current
branch and is not needed. A single chat object (or its inner ``chat``) is
accepted too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from storage.importers import jsonio
from storage.importers.parts import epoch, join_parts, placeholder, text_of
from storage.importers.records import ImportFileError, SourceConversation, SourceMessage
from storage.importers.thinking import open_webui_details


def read(stream: IO[bytes], kind: str) -> Iterator[SourceConversation]:
    """Yield the chats of an Open WebUI export one at a time.

    Raises:
        ImportFileError: not JSON, or a chat without ``history.messages``.
    """
    return jsonio.each_conversation(stream, kind, conversation)


def conversation(raw: Any, n: int) -> SourceConversation:
    if not isinstance(raw, dict):
        raise ImportFileError(f"chat #{n + 1} is not an object")
    chat = raw.get("chat") if isinstance(raw.get("chat"), dict) else raw
    history = chat.get("history")
    if not isinstance(history, dict) or not isinstance(history.get("messages"), dict):
        raise ImportFileError(f"chat #{n + 1} has no \"history.messages\"")
    params = chat.get("params") if isinstance(chat.get("params"), dict) else {}
    models = chat.get("models") if isinstance(chat.get("models"), list) else []
    conv = SourceConversation(
        source_id=text_of(raw.get("id")) or text_of(chat.get("id"))
        or f"{chat.get('timestamp')}:{text_of(chat.get('title'))}",
        title=text_of(raw.get("title")) or text_of(chat.get("title")),
        created_at=epoch(raw.get("created_at")) or epoch(chat.get("timestamp")),
        updated_at=epoch(raw.get("updated_at")),
        system_prompt=text_of(params.get("system")) or text_of(chat.get("system")),
        current=text_of(history.get("currentId")) or None,
        pinned=bool(raw.get("pinned")),
        children={},
    )
    default_model = next((m for m in models if isinstance(m, str)), None)
    for key, m in history["messages"].items():
        if not isinstance(m, dict):
            raise ImportFileError(f"message {key!r} is not an object")
        mid = text_of(m.get("id")) or str(key)
        parent = m.get("parentId")
        if parent is not None and not isinstance(parent, str):
            raise ImportFileError(f"message {mid!r} has a parentId that is not an id")
        kids = m.get("childrenIds") if isinstance(m.get("childrenIds"), list) else []
        conv.children[mid] = [k for k in kids if isinstance(k, str)]
        role = text_of(m.get("role"))
        if role not in ("user", "assistant", "system"):
            raise ImportFileError(f"message {mid!r} has an unknown role {role!r}")
        content = m.get("content")
        text = content if isinstance(content, str) else _list_content(content)
        if role == "assistant":
            text = open_webui_details(text)
        files = [_file(f) for f in (m.get("files") or []) if isinstance(f, dict)]
        model = text_of(m.get("model")) or (default_model if role == "assistant" else None)
        conv.messages.append(SourceMessage(mid, parent or None, role, join_parts([text, *files]),
                                           epoch(m.get("timestamp")), model if role == "assistant" else None,
                                           hidden=role == "system"))
    return conv


def _list_content(content: Any) -> str:
    """OpenAI-style content parts ([{"type": "text", "text"}, {"type": "image_url"}])."""
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            out.append(text_of(part.get("text")))
        elif isinstance(part, dict):
            out.append(placeholder("Image" if part.get("type") == "image_url" else "Attachment"))
    return join_parts(out)


def _file(f: dict) -> str:
    kind = text_of(f.get("type"))
    name = text_of(f.get("name")) or (text_of((f.get("file") or {}).get("filename"))
                                      if isinstance(f.get("file"), dict) else "")
    return placeholder("Image" if kind == "image" else "File", name)
