"""What a sent message shows of its attachments: a chip per file on the user message (name,
pages, tokens; a click opens the extracted text, read-only), and on a reply to a message
whose document was searched, a footer naming the passages used (file, passage, page; a click
shows them).

``AttachmentMarks.decorate`` is the transcript's bubble hook (``TranscriptView.decorate``):
it reads the figures kept in the user message's stats (``engine.documents.attach.STATS_KEY``,
written when it was sent), or, for a message sent without them (an import), the summary of
its links (``AttachmentStore.summaries``: one indexed query, not the text). A document's text
is read on a worker thread over its own connection and shown when it arrives.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from app.window.transcript.attachment_chip import AttachmentChip, ChipRow, ClickLabel, TextViewer, chip_text
from app.window.transcript.message_widget import MessageWidget
from app.window.workers.tasks import Workers
from engine.documents.attach import STATS_KEY
from storage.attachments import AttachmentStore, StoredPassage, for_chats
from storage.chats import ChatStore
from storage.errors import StorageError

log = logging.getLogger(__name__)


def passages_line(files: list[dict]) -> str:
    """The footer of a reply to searched documents, e.g. ``"Passages used: book.pdf #12
    (page 5), #40 (page 17)"``; ``""`` when every file was sent whole."""
    parts = []
    for f in files:
        if f.get("passages") is None:
            continue
        used = ", ".join(f"#{p['number']}" + (f" (page {p['page']})" if p.get("page") else "")
                         for p in f["passages"])
        parts.append(f"{f.get('name', 'attachment')} {used or '(no passage matched)'}")
    return "Passages used: " + "; ".join(parts) if parts else ""


def passages_text(passages: list[StoredPassage], whole: bool) -> str:
    """Passages as the viewer shows them: the whole text with a ``[Page N]`` line where a page
    starts (``whole``), or each passage under ``[Passage N, page P]``."""
    lines: list[str] = []
    page = None
    for p in passages:
        if whole:
            if p.page is not None and p.page != page:
                page = p.page
                lines.append(f"[Page {p.page}]\n")
            lines.append(p.text)
        else:
            where = f", page {p.page}" if p.page is not None else ""
            lines.append(f"[Passage {p.number}{where}]\n{p.text.strip()}\n\n")
    return "".join(lines).strip("\n")


class AttachmentMarks(QObject):
    """Chips and passage footers on the bubbles of ``store``'s messages; texts read with
    ``workers``; viewers over ``parent`` (``viewer``: the last one opened)."""

    def __init__(self, store: ChatStore, workers: Workers, parent: QWidget):
        super().__init__(parent)
        self.store, self.workers, self.parent_widget = store, workers, parent
        self.viewer: TextViewer | None = None

    def files_of(self, message) -> list[dict]:
        """The attachment figures of a user ``message`` (``STATS_KEY``'s dicts; from its
        links when it has no figures kept; ``[]`` without attachments)."""
        files = (message.stats or {}).get(STATS_KEY) if isinstance(message.stats, dict) else None
        if isinstance(files, list) and all(isinstance(f, dict) for f in files):
            return files
        try:
            found = for_chats(self.store).summaries([message.id]).get(message.id, [])
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error: drawn without chips
            log.info("no attachment chips for message %s: %s", message.id, exc)
            return []
        return [{"name": a.name, "sha256": a.sha256, "kind": a.kind, "pages": a.pages, "tokens": None,
                 "passages": None if a.sent is None else [{"number": n, "page": None} for n in a.sent]}
                for a in found]

    def decorate(self, w: MessageWidget) -> None:
        """Add the chips (a user message) or the passages footer (a reply) to ``w``."""
        m = w.message
        if m is None:
            return
        if m.role == "user":
            files = self.files_of(m)
            if files:
                row = ChipRow()
                row.set_chips([self._chip(f, w.colors) for f in files])
                w.layout().insertWidget(1, row)
                w.attachment_row = row
        elif m.role == "assistant" and m.parent_id is not None:
            try:
                parent = self.store.get_message(m.parent_id)
            except StorageError:
                return
            files = self.files_of(parent) if parent.role == "user" else []
            line = passages_line(files)
            if line:
                label = ClickLabel(line)
                label.setObjectName("passages_footer")
                label.setWordWrap(True)
                label.setToolTip("Show the passages the reply was given")
                label.setStyleSheet(f"color:{w.colors.accent}; font-size:small;")
                label.setAccessibleName(line)
                searched = [f for f in files if f.get("passages") is not None]
                label.clicked.connect(lambda: self.open_passages(searched))
                w.layout().addWidget(label)
                w.passages_footer = label

    def _chip(self, f: dict, colors) -> AttachmentChip:
        name = str(f.get("name") or "attachment")
        sent = f.get("passages")
        chip = AttachmentChip(chip_text(name, f.get("pages"), f.get("tokens"), str(f.get("kind") or ""),
                                        counting=False, passages=len(sent) if isinstance(sent, list) else None),
                              name, removable=False, colors=colors)
        sha = f.get("sha256")
        if isinstance(sha, str):
            chip.opened.connect(lambda: self.open_file(sha, name))
        return chip

    def open_file(self, sha256: str, name: str) -> None:
        """Show the whole extracted text of the stored file ``sha256`` (read on a worker)."""
        self._open(name, [(sha256, None)], whole=True)

    def open_passages(self, files: list[dict]) -> None:
        """Show the passages ``files`` (``STATS_KEY``'s dicts) sent, file by file."""
        wanted = [(f["sha256"], [p["number"] for p in f["passages"]]) for f in files if isinstance(f.get("sha256"), str)]
        names = ", ".join(str(f.get("name")) for f in files)
        self._open(f"Passages used: {names}", wanted, whole=False, names=[str(f.get("name")) for f in files])

    def _open(self, title: str, wanted: list, whole: bool, names: list[str] | None = None) -> None:
        db = self.store.path

        def job(_task) -> str:  # a worker thread, its own connection: in proportion to the text
            attachments = AttachmentStore(db)
            try:
                parts = []
                for i, (sha, numbers) in enumerate(wanted):
                    text = passages_text(attachments.passages(sha, numbers), whole)
                    parts.append(f"{names[i]}\n\n{text}" if names else text)
                return "\n\n".join(parts)
            finally:
                attachments.close()

        def shown(text: str) -> None:
            self.viewer = TextViewer(title, text, self.parent_widget)
            self.viewer.open()

        self.workers.start(job, name="attachment text", success=shown)

