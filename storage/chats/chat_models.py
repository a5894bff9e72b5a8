"""The model each conversation last ran on (``ChatStore.models``): the model file's path
and its name (``app.session.model_label``: the file name without ``.gguf``), written when
a reply is saved, read when the chat is opened so the window can offer that model again.

Nothing here touches the messages: a chat whose model file is gone keeps its whole history.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.chats import queries
from storage.chats.connection import Part


@dataclass(frozen=True)
class ChatModel:
    """The model a conversation last ran on: ``path`` (a GGUF file, or "" for the embedded
    default / a remote server) and ``name`` (as shown and stored on replies)."""

    path: str
    name: str


class ChatModels(Part):
    """Read and write ``conversations.model_path`` / ``model_name`` (``ChatStore.models``)."""

    def remember(self, conversation_id: int, path: str | None, name: str) -> None:
        """Record that ``conversation_id`` last ran on the model at ``path`` (None or "": the
        embedded default or a server) called ``name``. Does not move ``updated_at``.

        Raises:
            NotFoundError: no such conversation.
            StorageFullError: the disk is full (nothing changed).
        """
        with self._tx() as conn:
            cur = conn.execute("UPDATE conversations SET model_path = ?, model_name = ? WHERE id = ?",
                               (path or "", name, conversation_id))
            if cur.rowcount == 0:
                raise queries.no_conversation(conversation_id)

    def of(self, conversation_id: int) -> ChatModel | None:
        """The model ``conversation_id`` last ran on, or None when none was recorded (a chat
        from before schema 6 with no reply since, or an unknown id)."""
        with self._lock:
            row = self._conn.execute("SELECT model_path, model_name FROM conversations WHERE id = ?",
                                     (conversation_id,)).fetchone()
        if row is None or row[1] is None:
            return None
        return ChatModel(path=row[0] or "", name=row[1])
