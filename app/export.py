"""Conversations as JSON (the whole tree) and Markdown (the active path)."""

from __future__ import annotations


def conversation_json(chats, conversation_id: int) -> dict:
    """The whole conversation: settings, every message (tree via parent_id), the active path.

    Raises NotFoundError for an unknown id.
    """
    c = chats.get_conversation(conversation_id)
    active = [m.id for m in chats.active_path(c.id)]
    return {
        "id": c.id, "title": c.title, "system_prompt": c.system_prompt, "sampling": c.sampling,
        "pinned": c.pinned, "created_at": c.created_at, "updated_at": c.updated_at,
        "active_leaf_id": c.active_leaf_id, "active_path": active,
        "messages": [
            {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
             "status": m.status, "model": m.model, "created_at": m.created_at, "stats": m.stats,
             "token_ids": list(m.token_ids) if m.token_ids is not None else None}
            for m in chats.tree(c.id)
        ],
    }


def conversation_markdown(data: dict, active_only: bool = True) -> str:
    """Markdown of the active path of :func:`conversation_json` output."""
    by_id = {m["id"]: m for m in data["messages"]}
    ids = data["active_path"] if active_only else [m["id"] for m in data["messages"]]
    out = [f"# {data['title']}", ""]
    if data["system_prompt"]:
        out += [f"> **System:** {data['system_prompt']}", ""]
    for mid in ids:
        m = by_id[mid]
        siblings = [x for x in data["messages"] if x["parent_id"] == m["parent_id"]]
        branch = f" (branch {siblings.index(m) + 1}/{len(siblings)})" if len(siblings) > 1 else ""
        label = "User" if m["role"] == "user" else "Assistant"
        stopped = " *(stopped)*" if m["status"] == "stopped" else ""
        out += [f"## {label}{branch} · message {m['id']}", "", m["content"] + stopped, ""]
    return "\n".join(out)
