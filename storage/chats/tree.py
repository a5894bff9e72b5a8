"""The tree and its paths: a message's children and siblings, the path from the root down to
a message (the messages or only their ids), the newest leaf under a message, and the
newest user message left without a reply.

Every walk is iterative: a recursive CTE that SQLite evaluates as a queue, or a loop of
one query per level (``deepest_leaf``); never a Python recursion, so a branch of any
depth is read in bounded stack."""

from __future__ import annotations

from storage.chat_records import Message
from storage.chats import queries
from storage.chats.connection import Part


class Branches(Part):
    """The branches of every conversation (``ChatStore.branches``); thread-safe like the store.

    Raises (from any method): NotFoundError for an unknown message or conversation."""

    def children(self, parent_id: int | None, conversation_id: int) -> list[Message]:
        """Children of ``parent_id`` (None: the roots) in creation order (by id).

        Raises:
            NotFoundError: unknown conversation or parent message.
            ValueError: the parent belongs to another conversation.
        """
        with self._lock:
            queries.conversation(self._conn, conversation_id)
            if parent_id is not None:
                queries.check_in_conversation(self._conn, parent_id, conversation_id)
            return queries.children(self._conn, conversation_id, parent_id)

    def siblings(self, message_id: int) -> list[Message]:
        """The message and its siblings (same parent), in creation order.

        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            message = queries.message(self._conn, message_id)
            return queries.children(self._conn, message.conversation_id, message.parent_id)

    def path_to(self, message_id: int) -> list[Message]:
        """Messages from the root down to ``message_id`` (both included).

        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            return queries.path_to(self._conn, message_id)

    def path_ids(self, message_id: int) -> list[int]:
        """The ids of the messages from the root down to ``message_id`` (both included), without
        reading the messages themselves (a few milliseconds for a 10,000-message branch, where
        ``path_to`` takes a tenth of a second). Raises NotFoundError for an unknown message."""
        with self._lock:
            rows = self._conn.execute(
                "WITH RECURSIVE up(id, parent_id, depth) AS ("
                "  SELECT id, parent_id, 0 FROM messages WHERE id = ?"
                "  UNION ALL"
                "  SELECT m.id, m.parent_id, up.depth + 1 FROM messages AS m JOIN up"
                "  ON m.id = up.parent_id"
                ") SELECT id FROM up ORDER BY depth DESC",
                (message_id,),
            ).fetchall()
        if not rows:
            raise queries.no_message(message_id)
        return [row[0] for row in rows]

    def path_tail(self, message_id: int, count: int) -> tuple[list[int], bool]:
        """The ids of the last ``count`` (at least 1) messages of the path from the root down to
        ``message_id`` (root first, ``message_id`` last), and whether they reach the root: a
        walk of at most ``count`` steps, however deep the message is (``path_ids`` walks it all).
        Raises NotFoundError for an unknown message."""
        with self._lock:
            rows = self._conn.execute(
                "WITH RECURSIVE up(id, parent_id, depth) AS ("
                "  SELECT id, parent_id, 1 FROM messages WHERE id = ?"
                "  UNION ALL"
                "  SELECT m.id, m.parent_id, up.depth + 1 FROM messages AS m JOIN up"
                "  ON m.id = up.parent_id WHERE up.depth < ?"
                ") SELECT id, parent_id FROM up ORDER BY depth DESC",
                (message_id, max(1, count)),
            ).fetchall()
        if not rows:
            raise queries.no_message(message_id)
        return [row[0] for row in rows], rows[0][1] is None

    def deepest_leaf(self, message_id: int) -> Message:
        """Follow the most recently created child from ``message_id`` down to a leaf.

        Used when switching to a sibling: the path shown continues to that
        branch's latest leaf. Returns the message itself if it has no children.
        Raises NotFoundError for an unknown message.
        """
        with self._lock:
            message = queries.message(self._conn, message_id)
            while True:
                row = self._conn.execute(
                    "SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1",
                    (message.id,),
                ).fetchone()
                if row is None:
                    return message
                message = queries.message(self._conn, row[0])

    def newest_unanswered_user_message(self, since: float) -> int | None:
        """The id of the newest user message created at or after ``since`` (Unix seconds)
        that has no reply, or None. Used to tell the user which message a crashed command
        kept."""
        with self._lock:
            row = self._conn.execute(
                "SELECT m.id FROM messages m WHERE m.role = 'user' AND m.created_at >= ? "
                "AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = m.id) "
                "ORDER BY m.created_at DESC, m.id DESC LIMIT 1", (since,)).fetchone()
        return row[0] if row else None
