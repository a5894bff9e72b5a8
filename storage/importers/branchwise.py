"""Branchwise's own JSON, both ways: the writer (``conversations export ID --format json``,
``export --all``, ``conversations show --json``) and the reader ``branchwise import`` uses.

One conversation is the object :func:`conversation_json` writes:

    {"id", "title", "system_prompt", "sampling", "pinned", "created_at", "updated_at",
     "active_leaf_id", "active_path", "messages": [{"id", "parent_id", "role", "content",
      "reasoning", "status", "model", "created_at", "stats", "token_ids", "attachments" (user
      messages with files: ``storage.attachments.exported``), "tool" (a tool step's fields:
      an assistant's ``tool_calls``, a ``role: "tool"`` result's call id, name, server,
      arguments, duration and error; only on those messages)}]}

with messages in creation order (parents first). ``export --all``
(:func:`write_export_all`) writes ``{"branchwise_export": 1, "conversations": [...]}``.
Everything is kept (token ids, stats, status, pinned, sampling), so export → import →
export gives the same JSON apart from ids (:func:`read`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any, Final

from storage.importers import jsonio
from storage.importers.parts import text_of
from storage.importers.records import ImportFileError, SourceConversation, SourceMessage

EXPORT_VERSION: Final = 1
"""Value of ``"branchwise_export"`` in an ``export --all`` file."""


# -- writing ---------------------------------------------------------------------------------


def conversation_json(chats, conversation_id: int) -> dict:
    """The whole conversation: settings, every message (tree via parent_id), the active path.

    Raises NotFoundError for an unknown id.
    """
    c = chats.get_conversation(conversation_id)
    active = [m.id for m in chats.active_path(c.id)]
    data = {
        "id": c.id, "title": c.title, "system_prompt": c.system_prompt, "sampling": c.sampling,
        "pinned": c.pinned, "created_at": c.created_at, "updated_at": c.updated_at,
        "active_leaf_id": c.active_leaf_id, "active_path": active,
        "messages": [
            {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
             "reasoning": m.reasoning, **({"tool": m.tool} if m.tool else {}),
             "status": m.status, "model": m.model, "created_at": m.created_at, "stats": m.stats,
             "token_ids": list(m.token_ids) if m.token_ids is not None else None}
            for m in chats.tree(c.id)
        ],
    }
    _add_attachments(chats, data["messages"])
    return data


def _add_attachments(chats, messages: list[dict]) -> None:
    """Give each message with attached files an ``"attachments"`` list (their extracted
    text as passages; ``storage.attachments.exported``), which the Branchwise import restores."""
    from storage.attachments import exported, for_chats

    found = for_chats(chats).of_messages([m["id"] for m in messages if m["role"] == "user"])
    for m in messages:
        if m["id"] in found:
            m["attachments"] = [exported(a) for a in found[m["id"]]]


def write_export_all(chats: Any, out: IO[str]) -> int:
    """Write ``{"branchwise_export": 1, "conversations": [...]}``, one conversation at a time.

    Each element is :func:`conversation_json` of one conversation, oldest
    first (by id). Returns how many were written.
    """
    ids = sorted(c.id for c in chats.list_conversations())
    out.write(f'{{"branchwise_export": {EXPORT_VERSION}, "conversations": [')
    for n, conversation_id in enumerate(ids):
        out.write(",\n" if n else "\n")
        out.write(json.dumps(conversation_json(chats, conversation_id), ensure_ascii=False, indent=2))
    out.write("\n]}\n")
    return len(ids)


# -- reading ---------------------------------------------------------------------------------


def read(stream: IO[bytes], kind: str, keys: set[str]) -> Iterator[SourceConversation]:
    """Yield the conversations of a Branchwise export (``keys``: the top-level keys seen).

    Raises:
        ImportFileError: not JSON, a newer export version, or a malformed conversation.
    """
    if kind == "{" and "branchwise_export" in keys:
        prefix = "conversations.item"
    elif kind == "[":
        prefix = "item"
    else:
        prefix = ""
    for n, raw in enumerate(jsonio.items(stream, prefix)):
        yield conversation(raw, n)


def check_version(value: Any) -> None:
    """Raise ImportFileError for an ``export --all`` written by a newer Branchwise."""
    if value != EXPORT_VERSION:
        raise ImportFileError(
            f"it is a Branchwise export of version {value!r}; this Branchwise reads version "
            f"{EXPORT_VERSION}. Update Branchwise to import it.")


def conversation(raw: Any, n: int) -> SourceConversation:
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
        raise ImportFileError(f"conversation #{n + 1} has no \"messages\" list")
    created = raw.get("created_at")
    if not isinstance(created, (int, float)) or isinstance(created, bool):
        raise ImportFileError(f"conversation #{n + 1} has no created_at time")
    sampling = raw.get("sampling")
    conv = SourceConversation(
        source_id=f"{raw.get('id')}@{created!r}",
        title=text_of(raw.get("title")),
        created_at=float(created),
        updated_at=_number(raw.get("updated_at")),
        system_prompt=text_of(raw.get("system_prompt")),
        current=None if raw.get("active_leaf_id") is None else str(raw.get("active_leaf_id")),
        pinned=bool(raw.get("pinned")),
        sampling=sampling if isinstance(sampling, dict) else None,
    )
    for i, m in enumerate(raw["messages"]):
        if not isinstance(m, dict) or m.get("id") is None:
            raise ImportFileError(f"message #{i + 1} has no id")
        token_ids = m.get("token_ids")
        if token_ids is not None and not (isinstance(token_ids, list)
                                          and all(isinstance(t, int) for t in token_ids)):
            raise ImportFileError(f"message {m['id']!r}: token_ids is not a list of integers")
        stats = m.get("stats")
        conv.messages.append(SourceMessage(
            id=str(m["id"]),
            parent=None if m.get("parent_id") is None else str(m["parent_id"]),
            role=text_of(m.get("role")),
            content=text_of(m.get("content")),
            created_at=_number(m.get("created_at")),
            model=text_of(m.get("model")) or None,
            extra={"token_ids": token_ids, "stats": stats if isinstance(stats, dict) else None,
                   "status": text_of(m.get("status")) or "complete",
                   "reasoning": m["reasoning"] if isinstance(m.get("reasoning"), str) else None,
                   "tool": m["tool"] if isinstance(m.get("tool"), dict) else None,  # a tool step's fields
                   "attachments": m.get("attachments")},  # storage.attachments.import_exported
        ))
    return conv


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
