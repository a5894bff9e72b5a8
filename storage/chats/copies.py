"""Fork and copy: a conversation copied whole, or a new conversation from one path of it.

Copies keep each message's content, token ids, stats, times and attached files (links to the
same stored file), so the KV blocks of the copy are found again; a message still marked
"streaming" is copied as "stopped"."""

from __future__ import annotations

import time

from storage.chat_records import Conversation
from storage.chats import queries
from storage.chats.connection import Part


class Copies(Part):
    """Copies of conversations (``ChatStore.copies``); each copy is one transaction."""

    def duplicate_conversation(self, conversation_id: int) -> Conversation:
        """Copy a conversation with its whole tree and active leaf; the copy is not pinned.

        The copy is titled "<title> (copy)". Messages keep their content, token
        ids, stats and times; a message still marked "streaming" is copied as
        "stopped". Raises NotFoundError for an unknown conversation.
        """
        with self._tx() as conn:
            source = queries.conversation(conn, conversation_id)
            messages = queries.messages_where(conn, "conversation_id = ?", (conversation_id,))
            copy_id = queries.insert_copy(conn, source, f"{source.title} (copy)")
            new_ids = queries.copy_messages(conn, messages, copy_id)
            leaf = None if source.active_leaf_id is None else new_ids[source.active_leaf_id]
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, copy_id)
            )
            return queries.conversation(conn, copy_id)

    def fork(self, message_id: int) -> Conversation:
        """Start a new conversation from the path root..``message_id``.

        Only that path is copied (not the other branches); the copy of the
        message becomes the active leaf. The new conversation is titled
        "Fork of <title>" and keeps the system prompt and sampling settings.
        Raises NotFoundError for an unknown message.
        """
        with self._tx() as conn:
            path = queries.path_to(conn, message_id)
            source = queries.conversation(conn, path[-1].conversation_id)
            fork_id = queries.insert_copy(conn, source, f"Fork of {source.title}")
            new_ids = queries.copy_messages(conn, path, fork_id)
            conn.execute(
                "UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                (new_ids[message_id], fork_id),
            )
            return queries.conversation(conn, fork_id)

    def branch_from_path(self, message_ids: list[int]) -> int:
        """Copy ``message_ids`` (messages of one path, parent first; the ones left out are
        skipped, each copy goes under the copy before it) into a new root branch of their
        conversation and make the last copy the active leaf (what "Continue on a new branch"
        keeps). Returns the id of the last copy.

        Raises:
            ValueError: ``message_ids`` is empty or not on one path, parent first.
            NotFoundError: a message is unknown.
        """
        if not message_ids:
            raise ValueError("There are no messages to copy onto a new branch.")
        with self._tx() as conn:
            by_id = {m.id: m for m in queries.path_to(conn, message_ids[-1])}
            order = list(by_id)
            if any(i not in by_id for i in message_ids) or \
                    [order.index(i) for i in message_ids] != sorted(order.index(i) for i in set(message_ids)):
                raise ValueError("The messages to copy onto a new branch are not on one path, parent first.")
            conversation_id = by_id[message_ids[-1]].conversation_id
            parent = None
            for i in message_ids:
                m = by_id[i]
                parent = queries.copy_messages(conn, [m], conversation_id, keep={m.parent_id: parent})[m.id]
            conn.execute("UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                         (parent, time.time(), conversation_id))
            return parent
