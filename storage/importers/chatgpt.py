"""ChatGPT's data export: ``conversations.json`` (inside the zip ChatGPT emails).

Shape (as written by ChatGPT's export and read by open-source readers such as
the Open WebUI and LibreChat importers): a JSON array of conversations, each

    {"title", "create_time", "update_time" (unix seconds, float),
     "conversation_id" (or "id"), "current_node", "default_model_slug",
     "mapping": {node id: {"id", "parent", "children": [ids], "message": null | {
         "id", "author": {"role": "system|user|assistant|tool", "name"},
         "create_time", "recipient", "content": {"content_type", ...},
         "metadata": {"is_visually_hidden_from_conversation", "model_slug",
                      "attachments": [{"name", "mimeType"}]}}}}}

``mapping`` is the whole tree: every edit and every regenerated answer is a
sibling node, and ``current_node`` is the leaf the person last looked at.
Content types handled: text, multimodal_text (text, images, audio), code
(a tool call), execution_output (code interpreter), thoughts and
reasoning_recap (reasoning), tether_browsing_display / tether_quote (web
browsing), user_editable_context (custom instructions), system_error; any
other type becomes a placeholder naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from storage.importers import jsonio
from storage.importers.parts import (
    code_block,
    epoch,
    join_parts,
    md_escape,
    placeholder,
    reasoning,
    text_of,
)
from storage.importers.records import STRUCTURAL, ImportFileError, SourceConversation, SourceMessage


def read(stream: IO[bytes], kind: str) -> Iterator[SourceConversation]:
    """Yield the conversations of a ``conversations.json`` (``kind`` "[") or of one
    conversation object (``kind`` "{"), one at a time.

    Raises:
        ImportFileError: not JSON, or a conversation without a ``mapping`` object.
    """
    return jsonio.each_conversation(stream, kind, conversation)


def conversation(raw: Any, n: int) -> SourceConversation:
    """One conversation object -> SourceConversation (``n``: its position, for errors)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("mapping"), dict):
        raise ImportFileError(f"conversation #{n + 1} has no \"mapping\" of messages")
    source_id = text_of(raw.get("conversation_id")) or text_of(raw.get("id"))
    if not source_id:
        source_id = f"{raw.get('create_time')}:{text_of(raw.get('title'))}"
    conv = SourceConversation(
        source_id=source_id,
        title=text_of(raw.get("title")),
        created_at=epoch(raw.get("create_time")),
        updated_at=epoch(raw.get("update_time")),
        current=text_of(raw.get("current_node")) or None,
        children={},
    )
    default_model = text_of(raw.get("default_model_slug")) or None
    for key, node in raw["mapping"].items():
        if not isinstance(node, dict):
            raise ImportFileError(f"node {key!r} is not an object")
        node_id = text_of(node.get("id")) or str(key)
        parent = node.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise ImportFileError(f"node {node_id!r} has a parent that is not an id")
        kids = node.get("children") or []
        conv.children[node_id] = [k for k in kids if isinstance(k, str)]
        conv.messages.append(_message(node_id, parent, node.get("message"), default_model))
    return conv


def _message(node_id: str, parent: str | None, msg: Any, default_model: str | None) -> SourceMessage:
    if not isinstance(msg, dict):
        return SourceMessage(node_id, parent, STRUCTURAL)
    author = msg.get("author") if isinstance(msg.get("author"), dict) else {}
    role = text_of(author.get("role"))
    meta = msg.get("metadata") if isinstance(msg.get("metadata"), dict) else {}
    content = msg.get("content") if isinstance(msg.get("content"), dict) else {}
    ctype = text_of(content.get("content_type"))
    hidden = bool(meta.get("is_visually_hidden_from_conversation"))
    created = epoch(msg.get("create_time"))
    model = text_of(meta.get("model_slug")) or (default_model if role == "assistant" else None)

    if ctype == "user_editable_context":  # custom instructions: what ChatGPT adds as a system prompt
        text = join_parts([text_of(content.get("user_profile")), text_of(content.get("user_instructions"))])
        return SourceMessage(node_id, parent, "system", text, created, hidden=True)
    body = _content(ctype, content, role, text_of(msg.get("recipient")), text_of(author.get("name")))
    attachments = meta.get("attachments") if isinstance(meta.get("attachments"), list) else []
    files = [placeholder("File", text_of(a.get("name")) or text_of(a.get("mimeType")))
             for a in attachments if isinstance(a, dict)]
    body = join_parts([body, *files])
    if role == "system":
        return SourceMessage(node_id, parent, "system", body, created, hidden=hidden)
    if role == "user":
        if hidden:
            return SourceMessage(node_id, parent, "system", body, created, hidden=True)
        return SourceMessage(node_id, parent, "user", body, created)
    if role in ("assistant", "tool"):
        if hidden and not body.strip():
            return SourceMessage(node_id, parent, STRUCTURAL)
        return SourceMessage(node_id, parent, "assistant", body, created, model)
    return SourceMessage(node_id, parent, "assistant",
                         join_parts([placeholder("Message", f"from {role or 'an unknown author'}", ""), body]),
                         created, model)


def _content(ctype: str, content: dict, role: str, recipient: str, author_name: str) -> str:
    parts = content.get("parts") if isinstance(content.get("parts"), list) else []
    if ctype in ("text", ""):
        return join_parts([p for p in parts if isinstance(p, str)])
    if ctype == "multimodal_text":
        out = []
        for p in parts:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, dict):
                out.append(_multimodal_part(p))
        return join_parts(out)
    if ctype == "code":
        code = text_of(content.get("text"))
        target = recipient if recipient and recipient != "all" else "code"
        return join_parts([placeholder("Tool call", target, "the call is kept, it was not run here"),
                           code_block(code, text_of(content.get("language")) if
                                      text_of(content.get("language")) != "unknown" else "")])
    if ctype == "execution_output":
        return join_parts([placeholder("Code interpreter output", author_name, ""),
                           code_block(text_of(content.get("text")))])
    if ctype == "thoughts":
        thoughts = content.get("thoughts") if isinstance(content.get("thoughts"), list) else []
        text = join_parts([join_parts([f"**{md_escape(text_of(t.get('summary')))}**"
                                       if text_of(t.get("summary")) else "", text_of(t.get("content"))])
                           for t in thoughts if isinstance(t, dict)])
        return reasoning(text)
    if ctype == "reasoning_recap":
        recap = text_of(content.get("content"))
        return f"*{md_escape(recap)}*" if recap.strip() else ""
    if ctype == "tether_browsing_display":
        return placeholder("Web browsing result", text_of(content.get("summary"))[:200])
    if ctype == "tether_quote":
        return placeholder("Quoted web page", text_of(content.get("title")) or text_of(content.get("domain")))
    if ctype == "system_error":
        return placeholder("Error", text_of(content.get("name")) or text_of(content.get("text")), "")
    return placeholder(f"{ctype} content", "", "not imported")


def _multimodal_part(p: dict) -> str:
    ptype = text_of(p.get("content_type"))
    if ptype == "image_asset_pointer":
        size = f"{p.get('width')}×{p.get('height')}" if p.get("width") and p.get("height") else ""
        return placeholder("Image", size)
    if ptype == "audio_transcription":
        return text_of(p.get("text"))
    if ptype in ("audio_asset_pointer", "real_time_user_audio_video_asset_pointer"):
        return placeholder("Audio")
    return placeholder(ptype or "Attachment")
