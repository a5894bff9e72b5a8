"""Attaching files to the composer's message (README, "Chat with your documents").

``AttachFlow`` holds the files attached to the message being written, in order. A file comes
from the paperclip's file dialog, a drop on the composer or a paste of copied files
(``attach_input.AttachInput``). Each is read on a worker thread (``Workers``): the bytes are
read and checked there, the text is extracted in the spawned sandbox child with its time and
memory limits (``engine.documents.attach_file``), and the document is stored once in
``chats.sqlite3`` over the worker's own connection (``engine.documents.attach.put``), so
linking it when the message is sent is one small write. Meanwhile its chip says
"reading…"; then it shows pages and tokens (counted by the engine, the request pickled on the
worker thread) and the draft is prewarmed with the rendered file at once (zero-wait).

A file that cannot be attached gives its one sentence under the composer (an encrypted PDF
asks for its password and is read again); nothing of it is stored and the draft stays. A
file removed with × before sending is deleted again unless a message holds it.

Sending goes through ``AttachingSession``, the ``ConversationSession`` of the window's
``ChatController``: the request's user message is ``render_message(question, files)``, the
stored message is the question, and the files are linked to it with their figures
(``engine.documents.attach.link_message``, as ``branchwise chat --attach`` does), so every
later prompt renders the same text from the store, and the same tokens.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QInputDialog, QLabel, QLineEdit, QWidget

from app.session import ConversationSession
from app.window.flows.model_controller import ModelController, ModelState
from app.window.shell.lifetime import Lifetime
from app.window.transcript.attachment_chip import AttachmentBar, AttachmentChip, TextViewer, chip_text
from app.window.workers.tasks import Workers
from engine.chat_template import ChatMessage
from engine.documents import Document, DocumentError, attach_file
from engine.documents.attach import STATS_KEY, attached_text, figures, link_message, put
from engine.documents.render import Passage, render_block, render_message
from storage.attachments import AttachmentStore, for_chats
from storage.chats import ChatStore
from storage.errors import StorageError

log = logging.getLogger(__name__)

COUNT_QUESTION = "?"
"""The question a file's tokens are counted with: its block before it, less the question alone."""


class AttachState(enum.Enum):
    """An attached file's lifecycle: READING (read and extracted on a worker), READY."""

    READING = "reading"
    READY = "ready"


@dataclass(eq=False)
class Attachment:
    """One file attached to the composer's message: the ``path`` it came from, its
    ``state``, the ``doc`` once read, its ``tokens`` once counted (what its block adds to the
    prompt), and ``passages`` (the passages a document search chose for this send; None: the
    whole text)."""

    path: Path
    state: AttachState = AttachState.READING
    doc: Document | None = None
    tokens: int | None = None
    passages: list[Passage] | None = None
    counts: list = field(default_factory=list)  # the two count requests in flight

    @property
    def name(self) -> str:
        return self.doc.name if self.doc is not None else self.path.name


UNSENT_KEPT_S = 3600.0
"""A file read for the composer but linked to no message is dropped at the next start once
it is this old (seconds); a younger one may be on another window's composer."""


class AttachFlow(QObject):
    """The composer's attachments, shown as chips on ``bar`` (with × to remove) and read with
    ``workers``; ``store`` is the window's chat store, ``model`` the engine (its client
    counts the tokens), ``parent`` the dialogs' parent. ``items`` are the files in order.

    Signals: ``changed()`` (a file was added, read, counted or removed), ``failed(sentence)``
    (a file could not be attached), ``prewarm_wanted()`` (the rendered draft changed: the
    prewarm controller prepares it)."""

    changed = Signal()
    failed = Signal(str)
    prewarm_wanted = Signal()

    def __init__(self, *, store: ChatStore, workers: Workers, model: ModelController, bar: AttachmentBar,
                 lifetime: Lifetime, parent: QWidget):
        super().__init__(parent)
        self.store, self.workers, self.model, self.bar, self.lifetime = store, workers, model, bar, lifetime
        self.parent_widget = parent
        self.items: list[Attachment] = []
        self.password_box: QInputDialog | None = None  # asking for an encrypted PDF's password
        self.viewer: TextViewer | None = None  # the text of a chip, while shown
        model.ready.connect(lambda _facts: self._count_all())
        self._sweep()

    def _sweep(self) -> None:
        """Drop what an earlier window read but never sent (it ended without closing: a
        crash, kill -9, power loss), so no file stays that no chat holds or can delete."""
        db = self.store.path

        def job(_task) -> int:
            attachments = AttachmentStore(db)
            try:
                return attachments.sweep_unlinked(UNSENT_KEPT_S)
            finally:
                attachments.close()

        self.workers.start(job, name="drop unsent attachments",
                           success=lambda n: n and log.info("dropped %d attachments no message holds", n),
                           failure=lambda exc: log.info("could not drop unsent attachments: %s", exc))

    # -- attaching -----------------------------------------------------------------------

    def attach_paths(self, paths: list[Path]) -> None:
        """Attach each of ``paths`` (read on a worker; a chip each meanwhile)."""
        for path in paths:
            self._read(Attachment(Path(path)))

    def _read(self, item: Attachment, password: str | None = None) -> None:
        db = self.store.path

        def job(_task) -> Document:  # a worker thread: read, extract (in the sandbox child), store
            doc = attach_file(item.path, password=password)
            attachments = AttachmentStore(db)
            try:
                put(attachments, doc)
            finally:
                attachments.close()
            return doc

        if item not in self.items:
            self.items.append(item)
        self.bar.clear_note()
        task = self.workers.start(job, name=f"attach {item.path.name}",
                                  success=lambda doc: self._read_done(item, doc),
                                  failure=lambda exc: self._read_failed(item, exc, password))
        if task is None:
            self.items.remove(item)
        self._show()

    def _read_done(self, item: Attachment, doc: Document) -> None:
        if item not in self.items:  # removed while it was read: it was stored, so it goes again
            self._forget(doc.sha256)
            return
        if any(i.doc is not None and i.doc.sha256 == doc.sha256 and i.doc.name == doc.name for i in self.items):
            self.items.remove(item)  # the same file twice: one block is enough
            self._show()
            return
        item.doc, item.state = doc, AttachState.READY
        self._count(item)
        self._show()
        self.prewarm_wanted.emit()

    def _read_failed(self, item: Attachment, exc: Exception, password: str | None) -> None:
        if item not in self.items:
            return
        if isinstance(exc, DocumentError) and exc.needs_password and not self.lifetime.closed:
            self._ask_password(item, str(exc))
            return
        self.items.remove(item)
        self._show()
        if isinstance(exc, DocumentError):
            sentence = str(exc)
        elif isinstance(exc, StorageError) or exc.__class__.__module__.startswith("sqlite3"):
            sentence = f"{item.path.name} could not be stored in chats.sqlite3: {exc}."
        else:
            log.warning("attaching %s failed", item.path, exc_info=exc)
            sentence = f"{item.path.name} could not be attached ({type(exc).__name__}); see the log in logs/."
        self.bar.show_note(sentence)
        self.failed.emit(sentence)

    def _ask_password(self, item: Attachment, sentence: str) -> None:
        box = QInputDialog(self.parent_widget)
        box.setWindowTitle("Password")
        box.setLabelText(sentence)
        for label in box.findChildren(QLabel):  # its label guesses rich text: the file name is hostile
            label.setTextFormat(Qt.TextFormat.PlainText)
        box.setTextEchoMode(QLineEdit.EchoMode.Password)
        box.setOkButtonText("Attach")

        def answered(password: str) -> None:
            self.password_box = None
            self._read(item, password)

        def cancelled() -> None:
            if self.password_box is box:
                self.password_box = None
                if item in self.items:
                    self.items.remove(item)
                    self._show()
                self.bar.show_note(sentence)
                self.failed.emit(sentence)

        box.textValueSelected.connect(answered)
        box.rejected.connect(cancelled)
        self.password_box = box
        box.open()

    def remove(self, item: Attachment) -> None:
        """Take ``item`` off the message (its × button); the stored file goes unless a message holds it."""
        if item in self.items:
            self.items.remove(item)
            if item.doc is not None:
                self._forget(item.doc.sha256)
            self._show()
            self.prewarm_wanted.emit()

    def _forget(self, sha256: str) -> None:
        try:
            for_chats(self.store).drop_if_unlinked(sha256)
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error: an unlinked file is dropped at the next store
            log.info("could not drop the unsent attachment %s: %s", sha256[:12], exc)

    # -- counting ------------------------------------------------------------------------

    def _count_all(self) -> None:
        for item in self.items:
            if item.state == AttachState.READY and item.tokens is None and not item.counts:
                self._count(item)

    def _count(self, item: Attachment) -> None:
        """Count what ``item``'s block adds to a prompt: two counts, the messages pickled on a worker."""
        if self.model.state != ModelState.READY:
            return  # counted once the model is ready (``model.ready``)
        client, doc = self.model.client, item.doc

        def job(_task):
            with_block = [ChatMessage("user", render_message(COUNT_QUESTION, [attached_text(doc)]))]
            return client.pack_count(with_block), client.pack_count([ChatMessage("user", COUNT_QUESTION)])

        def packed(blobs) -> None:
            if item not in self.items:
                return
            handles = [client.send_packed(b) for b in blobs]
            if None in handles:
                return  # the engine is gone: counted when it is ready again
            item.counts = [None, None]
            for i, h in enumerate(handles):
                h.done.connect(lambda event, i=i: self._counted(item, i, event.prompt_tokens))
                h.failed.connect(lambda _e: setattr(item, "counts", []))

        self.workers.start(job, name=f"count {item.name}", success=packed)

    def _counted(self, item: Attachment, index: int, tokens: int) -> None:
        if len(item.counts) != 2:
            return
        item.counts[index] = tokens
        if None not in item.counts:
            item.tokens, item.counts = max(0, item.counts[0] - item.counts[1]), []
            self._show()
            self.prewarm_wanted.emit()  # a count interrupts a prewarm between batches: ask again

    # -- what a send takes ---------------------------------------------------------------

    @property
    def ready(self) -> list[Attachment]:
        """The files read and ready to send, in order."""
        return [i for i in self.items if i.state == AttachState.READY]

    def reading(self) -> list[Attachment]:
        return [i for i in self.items if i.state == AttachState.READING]

    def rendered(self, text: str) -> str:
        """The user message the model reads for ``text``: the ready files' blocks (whole, or
        the passages a search chose), then ``text`` (``engine.documents.render``)."""
        items = self.ready
        if not items:
            return text
        return render_message(text, [attached_text(i.doc, None if i.passages is None else
                                                   sorted(i.passages, key=lambda p: p.number)) for i in items])

    def blocks_chars(self) -> int:
        """Characters of the ready files' blocks (whole text), for estimates."""
        return sum(len(render_block(attached_text(i.doc))) for i in self.ready)

    def document_tokens(self) -> int | None:
        """Tokens the ready files' whole blocks add (None while one is not counted)."""
        counts = [i.tokens for i in self.ready]
        return None if None in counts else sum(counts)

    def ready_to_send(self) -> bool:
        """False (and the note says why) while a file is still being read."""
        waiting = self.reading()
        if waiting:
            self.bar.show_note(f"{waiting[0].path.name} is still being read; send again when its chip shows "
                               "its pages.", error=False)
        return not waiting

    def stored(self, message_id: int) -> None:
        """The message was stored as ``message_id``: link the ready files to it with their
        figures (``STATS_KEY``), and empty the composer's row. A note left from an earlier
        file (one that could not be attached) goes: it was about a message now sent."""
        items = self.ready
        if not items:
            self.bar.clear_note()
            return
        docs = [i.doc for i in items]
        sent = [None if i.passages is None else sorted(p.number for p in i.passages) for i in items]
        info = [figures(i.doc, i.tokens, None if i.passages is None else sorted(i.passages, key=lambda p: p.number))
                for i in items]
        try:
            link_message(self.store, message_id, docs, sent, info)
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or StorageError: said, the message stays
            log.error("could not link the attachments of message %s: %s", message_id, exc)
            self.bar.show_note(f"The attached files could not be saved with your message (chats.sqlite3): {exc}.")
            return
        self.items = [i for i in self.items if i not in items]
        self.bar.clear_note()
        self._show()

    # -- showing -------------------------------------------------------------------------

    def _show(self) -> None:
        chips = []
        for item in self.items:
            doc = item.doc
            if doc is None:
                text = chip_text(item.path.name, None, None, reading=True)
            else:
                text = chip_text(doc.name, doc.pages, item.tokens, doc.extracted.kind)
            chip = AttachmentChip(text, item.name, removable=True, colors=self.bar.colors)
            chip.removed.connect(lambda item=item: self.remove(item))
            chip.opened.connect(lambda item=item: self.open_text(item))
            chips.append(chip)
        self.bar.set_chips(chips)
        self.changed.emit()

    def open_text(self, item: Attachment) -> None:
        """Show ``item``'s extracted text, read-only (nothing while it is still read)."""
        if item.doc is None:
            return
        self.viewer = TextViewer(item.doc.name, render_block(attached_text(item.doc)), self.parent_widget)
        self.viewer.open()

    def shutdown(self) -> None:
        """The window closes: files attached but never sent are not kept."""
        for item in self.items:
            if item.doc is not None:
                self._forget(item.doc.sha256)
        self.items = []


class AttachingSession(ConversationSession):
    """The window's ``ConversationSession``: a message sent from the composer carries
    ``flow``'s files (``AttachFlow.rendered`` in the request, ``AttachFlow.stored`` once the
    message is stored), and an edited message keeps its files. Every other rule is
    ``ConversationSession``'s."""

    def __init__(self, chats: ChatStore, flow: AttachFlow):
        super().__init__(chats)
        self.flow = flow

    def send_plan(self, conversation_id: int, text: str, packed=None):
        """``ConversationSession.send_plan`` with the attached files rendered into ``text``."""
        return super().send_plan(conversation_id, self.flow.rendered(text), packed)

    def prompt_for_send(self, conversation_id: int | None, text: str, system_prompt: str = "", packed=None):
        """``ConversationSession.prompt_for_send`` with the attached files rendered into ``text``."""
        return super().prompt_for_send(conversation_id, self.flow.rendered(text), system_prompt, packed)

    def edit(self, message_id: int, text: str):
        """``ConversationSession.edit``, the new sibling holding the edited message's files
        (the same links and figures): a branch from a question about a document still asks
        about it, and the document's KV is restored for it."""
        message = super().edit(message_id, text)
        old = self.chats.get_message(message_id)
        files = for_chats(self.chats).summaries([message_id]).get(message_id, [])
        if files:
            for_chats(self.chats).link(message.id, [(f.sha256, f.name, f.sent) for f in files])
            if isinstance(old.stats, dict) and STATS_KEY in old.stats:
                self.chats.update_message(message.id, stats={STATS_KEY: old.stats[STATS_KEY]})
        return message

    def send(self, conversation_id: int | None, text: str, parent_id: int | None = None,
             new_chat: tuple[str, dict] | None = None):
        """Store ``text`` (``ConversationSession.send``), then link the attached files to it."""
        message = super().send(conversation_id, text, parent_id, new_chat)
        self.flow.stored(message.id)
        return message
