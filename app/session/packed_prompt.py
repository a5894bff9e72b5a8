"""A conversation's prompt up to its active leaf, read and pickled once: ``PackedPrompt``.

Reading a branch and rendering its messages (attached documents included) takes time in
proportion to the conversation: 146 ms for a 10,000-message branch on a 2-core machine.
The window reads it on its reader thread whenever the shown branch changes
(``app.window.workers.shown_prompt``); the draft count, the zero-wait prewarm and the
send itself then use the same bytes, and pressing Enter reads only the conversation's
row to check that they are still current (its active leaf and its system prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.documents.attach import prompt_messages
from engine.events import pack_messages


@dataclass(frozen=True)
class PackedPrompt:
    """The engine's messages for ``conversation_id`` up to ``leaf_id`` (None: an empty chat)
    under ``system_prompt``: ``data`` is their ``engine.events.pack_messages`` bytes,
    ``count`` how many messages they are (the system prompt counts as one when set),
    ``ids`` the message id of each (``prompt_ids``)."""

    conversation_id: int
    leaf_id: int | None
    system_prompt: str
    data: bytes
    count: int
    ids: tuple[int | None, ...]

    def current_for(self, conversation) -> bool:
        """Whether these are still the messages of ``conversation`` (a ``storage.chats``
        Conversation row, read just now): same chat, same active leaf, same system prompt.
        Messages are never changed in place (an edit is a new sibling), so that suffices."""
        return (conversation.id == self.conversation_id and conversation.active_leaf_id == self.leaf_id
                and conversation.system_prompt == self.system_prompt)


def read_packed_prompt(chats, conversation_id: int) -> PackedPrompt:
    """Read and pack the active path of ``conversation_id`` from ``chats`` (a ``ChatStore``;
    any thread with its own connection). The leaf recorded is the one the path was read
    from, so a leaf moved meanwhile makes the result stale, never wrong.

    Raises:
        NotFoundError: the conversation is gone.
        StorageError: the database cannot be read.
    """
    conv = chats.get_conversation(conversation_id)
    leaf = conv.active_leaf_id
    path = chats.branches.path_to(leaf) if leaf is not None else []
    messages = prompt_messages(chats, conv.system_prompt, path)
    return PackedPrompt(conversation_id, leaf, conv.system_prompt, pack_messages(messages), len(messages),
                        tuple(prompt_ids(messages, path)))


def prompt_ids(messages: list, path) -> list[int | None]:
    """The message id of each of ``messages`` (the engine's messages of ``path``, a list of
    ``Message`` rows): None for the system prompt."""
    turns = [m.id for m in path if m.role in ("user", "assistant")]
    return [None] * (len(messages) - len(turns)) + turns
