"""LM Studio's conversation files (``~/.lmstudio/conversations/<createdAt>.conversation.json``).

Shape (LM Studio 0.3; as read by open-source converters such as
lm-studio-conversation-converter): one JSON object per conversation,

    {"name", "createdAt" (unix ms), "pinned", "systemPrompt",
     "lastUsedModel": {"identifier"},
     "perChatPredictionConfig": {"fields": [{"key": "llm.prediction.systemPrompt", "value"}]},
     "messages": [{"currentlySelected": n, "versions": [
         {"type": "singleStep", "role": "user|system", "content": [{"type": "text", "text"},
                                                                   {"type": "file", "name"}]},
         {"type": "multiStep", "role": "assistant", "senderInfo": {"senderName"},
          "steps": [{"type": "contentBlock", "content": [{"type": "text", "text"}],
                     "style": {"type": "thinking"}?, "genInfo": {"identifier"}},
                    {"type": "toolStatus" | "debugInfoBlock" | …}]}]}]}

Each position holds the versions of one message (regenerations and edits);
only the selected version has the later messages after it, so the others
become leaf siblings and ``currentlySelected`` decides the active branch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import IO, Any

from storage.importers import jsonio
from storage.importers.parts import epoch, join_parts, placeholder, reasoning, text_of
from storage.importers.records import ImportFileError, SourceConversation, SourceMessage
from storage.importers.thinking import split_think


def read(stream: IO[bytes], kind: str) -> Iterator[SourceConversation]:
    """Yield the one conversation of an LM Studio conversation file.

    Raises:
        ImportFileError: not JSON, or no ``messages`` list of ``versions``.
    """
    for raw in jsonio.items(stream, "item" if kind == "[" else ""):
        yield conversation(raw)


def conversation(raw: Any) -> SourceConversation:
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
        raise ImportFileError("the conversation has no \"messages\" list")
    created = epoch(raw.get("createdAt"))
    system = text_of(raw.get("systemPrompt"))
    config = raw.get("perChatPredictionConfig")
    if not system and isinstance(config, dict):
        for f in config.get("fields") or []:
            if isinstance(f, dict) and f.get("key") == "llm.prediction.systemPrompt":
                system = text_of(f.get("value"))
    last_model = raw.get("lastUsedModel") if isinstance(raw.get("lastUsedModel"), dict) else {}
    default_model = text_of(last_model.get("identifier")) or None
    source_id = str(raw.get("createdAt")) if raw.get("createdAt") is not None else _fingerprint(raw)
    conv = SourceConversation(source_id=source_id, title=text_of(raw.get("name")), created_at=created,
                              system_prompt=system, pinned=bool(raw.get("pinned")))
    parent: str | None = None
    for i, position in enumerate(raw["messages"]):
        versions = position.get("versions") if isinstance(position, dict) else None
        if not isinstance(versions, list) or not versions:
            raise ImportFileError(f"message #{i + 1} has no \"versions\"")
        selected = position.get("currentlySelected", 0)
        if not isinstance(selected, int) or not 0 <= selected < len(versions):
            raise ImportFileError(f"message #{i + 1}: currentlySelected {selected!r} is not one of its "
                                  f"{len(versions)} versions")
        for v, version in enumerate(versions):
            if not isinstance(version, dict):
                raise ImportFileError(f"message #{i + 1}, version {v + 1} is not an object")
            role = text_of(version.get("role"))
            if role not in ("user", "assistant", "system"):
                raise ImportFileError(f"message #{i + 1}, version {v + 1} has an unknown role {role!r}")
            text, model = _version_text(version)
            conv.messages.append(SourceMessage(
                f"{i}.{v}", parent, role, text, None,
                (model or default_model) if role == "assistant" else None, hidden=role == "system"))
        parent = f"{i}.{selected}"
    conv.current = parent
    return conv


def _version_text(version: dict) -> tuple[str, str | None]:
    model = None
    if version.get("type") == "multiStep":
        out = []
        for step in version.get("steps") or []:
            if not isinstance(step, dict):
                continue
            stype = text_of(step.get("type"))
            if stype == "contentBlock":
                text = _content(step.get("content"))
                style = step.get("style") if isinstance(step.get("style"), dict) else {}
                if style.get("type") == "thinking":
                    out.append(reasoning(text, text_of(style.get("title")) or "Reasoning"))
                else:
                    out.append(split_think(text))
                gen = step.get("genInfo") if isinstance(step.get("genInfo"), dict) else {}
                model = model or text_of(gen.get("identifier")) or None
            elif stype == "toolStatus":
                out.append(placeholder("Tool call", _tool_name(step)))
            elif stype == "debugInfoBlock":
                continue  # LM Studio's own diagnostics, not part of the reply
            else:
                out.append(placeholder(f"{stype or 'unknown'} step"))
        return join_parts(out), model
    return _content(version.get("content")), model


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        ptype = text_of(part.get("type"))
        if ptype == "text":
            out.append(text_of(part.get("text")))
        elif ptype == "file":
            kind = "Image" if text_of(part.get("fileType")) == "image" else "File"
            out.append(placeholder(kind, text_of(part.get("name")) or text_of(part.get("fileIdentifier"))))
        else:
            out.append(placeholder(f"{ptype or 'unknown'} content"))
    return join_parts(out)


def _tool_name(step: dict) -> str:
    status = step.get("statusState") if isinstance(step.get("statusState"), dict) else {}
    inner = status.get("status") if isinstance(status.get("status"), dict) else {}
    return text_of(inner.get("toolCallRequest", {}).get("name") if isinstance(inner.get("toolCallRequest"), dict)
                   else "") or text_of(step.get("name"))


def _fingerprint(raw: dict) -> str:
    """An id for a file without ``createdAt``: a hash of its name and first message."""
    first = raw["messages"][0] if raw["messages"] else None
    return "sha1:" + hashlib.sha1(repr((raw.get("name"), first)).encode()).hexdigest()
