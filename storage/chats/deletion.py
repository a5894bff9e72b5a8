"""Deletion: a conversation, a message with the replies under it (and Undo's way back),
and clearing what deleted rows leave in the search index and the WAL.

Rows go leaves first (children before parents), so SQLite's ``ON DELETE CASCADE`` never
chains into its trigger depth limit (1,000 levels); the subtree is found by a recursive
CTE and the new active leaf by a loop of one query per level, never a Python recursion."""

from __future__ import annotations

from storage.chat_records import MESSAGE_FIELDS, Message, message_from_row
from storage.chat_schema import SEARCHED_COLUMNS
from storage.chats import queries
from storage.chats.connection import Part, disk_full_raises


class Deletion(Part):
    """Deleting conversations and messages (``ChatStore.deletion``)."""

    def delete_conversation(self, conversation_id: int, *, forget: bool = True) -> None:
        """Delete the conversation and all its messages, leaving nothing readable behind.

        The rows go in one transaction (the search index follows through its
        triggers). Then the search index is merged (FTS5 ``optimize``) so its old
        segments, which still hold the deleted words, are dropped; with ``PRAGMA
        secure_delete`` every freed page is overwritten with zeros; and the WAL is
        checkpointed and truncated so no old copy of a page stays in
        ``chats.sqlite3-wal``. The merge and checkpoint take time in proportion to
        the size of the search index and of the WAL (not of this conversation):
        measured 1.6-2.3 s for a 30 MB file of 10,000 messages (on 2 shared cores
        under load), against 17 ms for the row delete alone. Call this off the UI
        thread, or pass ``forget=False`` there and call ``forget_deleted()`` from a
        worker thread afterwards. If another connection is reading at that
        moment the checkpoint cannot finish; the WAL is then cleared by the next
        delete or when the last connection closes.

        Undo: this method is final. The window makes a delete undoable by hiding
        the conversation and calling this only when the undo time has passed
        (``app/window/tree/sidebar.py``), so Undo never needs anything back from here. The KV
        blocks of the conversation live in the other database: see
        ``engine.forget`` (``branchwise conversations delete`` does both).

        Raises NotFoundError if unknown; StorageFullError on a full disk (nothing
        is deleted then).
        """
        with self._tx() as conn:
            queries.conversation(conn, conversation_id)
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM messages WHERE conversation_id = ? ORDER BY id DESC", (conversation_id,))]
            queries.delete_leaves_first(conn, ids)
            conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        if forget:
            self.forget_deleted()

    def forget_deleted(self) -> None:
        """Merge the search index and truncate the WAL, so that the text of deleted
        rows is nowhere in the files (see ``delete_conversation``)."""
        with self._tx() as conn:
            for table in SEARCHED_COLUMNS:
                conn.execute(f"INSERT INTO {table}_fts({table}_fts) VALUES ('optimize')")
        with self._lock, disk_full_raises(self.path, "the WAL could not be cleared"):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def delete_subtree(self, message_id: int) -> list[Message]:
        """Delete ``message_id`` and every message under it, in one transaction; returns
        the deleted messages, parents before children (what ``restore_messages`` takes back).

        The subtree is found with a recursive CTE and deleted leaves first, so SQLite's
        ``ON DELETE CASCADE`` never chains (a chain of cascades stops at SQLite's trigger
        depth, 1,000 levels). When the active leaf was inside the subtree, the branch moves to
        the newest leaf under the nearest remaining sibling of ``message_id``, else to its
        parent (None when it was a lone root). Like
        ``delete_conversation(forget=False)``, the deleted text may stay in the search
        index's old segments until ``forget_deleted`` runs.

        Raises NotFoundError for an unknown message.
        """
        with self._tx() as conn:
            top = queries.message(conn, message_id)
            rows = conn.execute(
                "WITH RECURSIVE down(id, depth) AS ("
                "  SELECT ?, 0 UNION ALL"
                "  SELECT m.id, down.depth + 1 FROM messages AS m JOIN down ON m.parent_id = down.id"
                f") SELECT {', '.join('m.' + name for name in MESSAGE_FIELDS)}"
                " FROM down JOIN messages AS m ON m.id = down.id ORDER BY down.depth, m.id",
                (message_id,),
            ).fetchall()
            removed = [message_from_row(row) for row in rows]
            conv = queries.conversation(conn, top.conversation_id)
            gone = {m.id for m in removed}
            queries.delete_leaves_first(conn, [m.id for m in reversed(removed)])
            if conv.active_leaf_id is None or conv.active_leaf_id in gone:
                conn.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                             (self._leaf_after_delete(conn, top), top.conversation_id))
            return removed

    @staticmethod
    def _leaf_after_delete(conn, top: Message) -> int | None:
        """The active leaf once ``top``'s subtree is gone: the newest leaf under its nearest
        remaining sibling (the one before it, else the one after), else its parent."""
        row = conn.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? AND id != ?"
            " ORDER BY (id > ?), abs(id - ?) LIMIT 1",
            (top.conversation_id, top.parent_id, top.id, top.id, top.id),
        ).fetchone()
        if row is None:
            return top.parent_id
        leaf = row[0]
        while (child := conn.execute("SELECT id FROM messages WHERE parent_id = ? ORDER BY id DESC LIMIT 1",
                                     (leaf,)).fetchone()) is not None:
            leaf = child[0]
        return leaf

    def restore_messages(self, messages: list[Message], active_leaf_id: int | None = None) -> dict[int, int]:
        """Put back messages that ``delete_subtree`` returned (parents before children),
        under their old parent, with new ids; returns old id -> new id. When
        ``active_leaf_id`` (an old id) is among them, its copy becomes the active leaf.

        Raises:
            NotFoundError: the conversation or the parent of the first message is gone.
            ValueError: ``messages`` is empty.
        """
        if not messages:
            raise ValueError("There are no messages to restore.")
        first = messages[0]
        with self._tx() as conn:
            queries.conversation(conn, first.conversation_id)
            if first.parent_id is not None:
                queries.check_in_conversation(conn, first.parent_id, first.conversation_id)
            new_ids = queries.copy_messages(conn, messages, first.conversation_id,
                                          keep={first.parent_id: first.parent_id})
            if active_leaf_id in new_ids:
                conn.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?",
                             (new_ids[active_leaf_id], first.conversation_id))
            return new_ids
