"""Delete and forget: drop a deleted conversation's KV blocks from the prefix store.

The prefix store is keyed by token ids and knows nothing of conversations; the chat
database knows messages but not tokens. Only the engine can turn one into the other
(the model's chat template and tokenizer), so the design is:

1. before the conversation is deleted, :func:`conversation_token_paths` renders, for
   every message of it, the token sequence the engine may have stored for it: the
   prompt of the path down to that message (a user message with the assistant header,
   an assistant message with the ids it generated, as ``engine.core`` snapshots them);
2. the same is done for every *other* conversation that could share blocks with it
   (:func:`sharing_token_paths`: only those whose first block of tokens equals one of
   the deleted conversation's, since a chain of blocks starts at its first block);
3. ``PrefixStore.forget(deleted, keep=others)`` deletes, under every fingerprint in the
   store, the first block of each deleted sequence that no kept sequence passes
   through, with everything below it. What is shared stays (it is also another
   conversation's text); what only the deleted conversation reached goes.

Limits: sequences are rendered with the model loaded now. Blocks written by a model
with another tokenizer or chat template are not matched; they stay until evicted or
until ``branchwise cache clear``. The same model under another KV type or flash
attention setting is matched (same tokens, other fingerprint).

Undo: the window keeps a delete undoable by deferring ``ChatStore.delete_conversation``
until the undo time has passed (``app/window/tree/sidebar.py``); forgetting belongs to that same
moment, after the undo window, so Undo never needs a block back.

Nothing here recurses over the message tree: paths are followed through a dict of
parents, iteratively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.chat_template import ChatMessage, conversation_messages

Build = Callable[[Sequence[ChatMessage], bool], list[int]]
"""``build(messages, add_generation_prompt) -> token ids``: ``PromptBuilder.build``."""


def conversation_token_paths(chats, conversation_id: int, build: Build) -> list[list[int]]:
    """Token sequences the engine may have stored for each message of a conversation.

    ``chats`` is a ``storage.chats.ChatStore``; ``build`` renders and tokenizes a list
    of chat messages (``engine.model.prompts.build``). Returns one sequence per user
    message (its prompt, ending with the assistant header) and one per assistant
    message with token ids (the prompt of its parent followed by those ids); each is a
    list of int token ids. Raises NotFoundError for an unknown conversation.
    """
    conversation = chats.get_conversation(conversation_id)
    messages = chats.tree(conversation_id)
    by_id = {m.id: m for m in messages}
    paths: list[list[int]] = []
    for message in messages:
        path = []
        cursor = message
        while cursor is not None:  # up to the root, without recursion
            path.append(cursor)
            cursor = by_id.get(cursor.parent_id) if cursor.parent_id is not None else None
        path.reverse()
        if message.role == "user":
            paths.append(build(conversation_messages(conversation.system_prompt, path), True))
        elif message.role == "assistant" and message.token_ids:
            prompt = build(conversation_messages(conversation.system_prompt, path[:-1]), True)
            paths.append(list(prompt) + list(message.token_ids))
    return paths


def sharing_token_paths(
    chats, conversation_id: int, deleted: list[list[int]], build: Build, block_size: int
) -> list[list[int]]:
    """Token sequences of the other conversations that could share blocks with ``deleted``.

    A conversation can share a block only if the first ``block_size`` tokens of one of
    its root prompts start like one of ``deleted``'s sequences (blocks chain from the
    first). Only those conversations are rendered in full; for the others one short
    prompt per root is rendered. Returns the sequences to keep.
    """
    heads = {tuple(seq[:block_size]) for seq in deleted}
    keep: list[list[int]] = []
    for other in chats.list_conversations():
        if other.id == conversation_id:
            continue
        roots = chats.branches.children(None, other.id)
        starts = [build(conversation_messages(other.system_prompt, [root]), root.role == "user")
                  for root in roots]
        if any(_may_share(tuple(s[:block_size]), heads) for s in starts):
            keep += conversation_token_paths(chats, other.id, build)
    return keep


def _may_share(head: tuple[int, ...], heads: set[tuple[int, ...]]) -> bool:
    return head in heads or any(h[: len(head)] == head or head[: len(h)] == h for h in heads)


def delete_and_forget(chats, store, conversation_id: int, build: Build | None) -> int:
    """Delete a conversation for good: its rows and search words (``chats``), then its
    unshared KV blocks (``store``, a ``PrefixStore`` or None). Returns blocks dropped.

    ``build`` is the loaded model's ``prompts.build`` (None: no model, so no blocks are
    matched). The token sequences are computed before the rows go. Call it off the UI
    thread (``ChatStore.delete_conversation`` merges the search index). Errors of the
    store are the caller's to report: the conversation is deleted by then.

    Raises:
        NotFoundError: unknown conversation (nothing is deleted).
    """
    forget: list[list[int]] = []
    keep: list[list[int]] = []
    if store is not None and build is not None:
        forget = conversation_token_paths(chats, conversation_id, build)
        keep = sharing_token_paths(chats, conversation_id, forget, build, store.block_size)
    chats.delete_conversation(conversation_id)
    return store.forget(forget, keep) if store is not None and forget else 0
