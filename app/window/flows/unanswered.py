"""Sending while the branch ends on a question with no answer (a reply stopped before its
first token, an engine crash): the window asks first, never putting two questions in a row
silently.

- "Answer it first" generates the reply to the old message (Retry); the new text stays in
  the message box, to be sent after.
- "Replace it" sends the new text as an edit of the old message: a new branch beside it
  (the old one stays one ‹ › step away).
- Cancel puts the text back in the message box.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from app.window.transcript.composer import Composer
from storage.chats import ChatStore, Message
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

def refuse_while_written(store: ChatStore, conversation_id: int | None, composer: Composer, banner,
                         text: str) -> bool:
    """True (``text`` put back in ``composer``, one sentence on ``banner``) when the branch of
    ``conversation_id`` ends on a reply another process is still streaming (its stream lock
    is held: ``storage.chats.live_streams``): a message sent now would be answered from the
    half-written reply while the tree says the model saw all of it. One row read."""
    from storage.chat_records import MessageStatus

    if conversation_id is None:
        return False
    try:
        leaf_id = store.get_conversation(conversation_id).active_leaf_id
        leaf = store.get_message(leaf_id) if leaf_id is not None else None
    except StorageError:
        return False
    if leaf is None or leaf.role != "assistant" or leaf.status != MessageStatus.STREAMING:
        return False
    if not store.streams.is_live(leaf.id):
        return False
    composer.set_text(text)
    banner.show_message("The last reply of this chat is still being written by another Branchwise (a "
                        "terminal or another window). Wait for it to finish, then send again.", "warning")
    return True


QUOTE_CHARS = 120
"""The longest quote of the unanswered message shown in the question (characters)."""


def ask_unanswered(parent: QWidget, store: ChatStore, composer: Composer, pending: Message, text: str,
                   chat: ChatController) -> QMessageBox:
    """Open (not modal-block) over ``parent`` the question for sending ``text`` under the
    unanswered user message ``pending`` of ``store``; ``chat`` carries out the choice (and
    holds the box as ``unanswered_box`` while it is shown), ``composer`` gets the text back.
    Returns the box (tests click its buttons: ``box.answer``, ``box.replace``)."""
    quote = " ".join(pending.content.split())
    if len(quote) > QUOTE_CHARS:
        quote = quote[: QUOTE_CHARS - 1] + "…"
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setTextFormat(Qt.TextFormat.PlainText)  # the quote is the user's text
    box.setWindowTitle("Your last message has no reply")
    box.setText(f"Your last message has no reply yet:\n“{quote}”")
    box.setInformativeText("Answer it first (your new message stays in the box), or replace it with "
                           "the new message (a new branch; the old message stays one ‹ › step away)?")
    box.answer = box.addButton("Answer it first", QMessageBox.ButtonRole.AcceptRole)
    box.replace = box.addButton("Replace it", QMessageBox.ButtonRole.ActionRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(box.answer)
    leaf_id = store.get_conversation(pending.conversation_id).active_leaf_id

    def chosen(button) -> None:
        chat.unanswered_box = None
        if button is box.replace:
            chat.edit(pending.id, text)
            return
        composer.set_text(text)
        if button is box.answer:
            chat.regenerate(leaf_id)  # the empty stopped reply is replaced, or the question answered

    box.buttonClicked.connect(chosen)
    box.open()
    return box
