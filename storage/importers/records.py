"""What the importers read and what an import reports.

Each format's reader (``storage/importers/<format>.py``) turns one exported
conversation into a ``SourceConversation``: messages with the ids and parent
links of the export, roles already mapped to Branchwise's ("user",
"assistant", "system") or ``STRUCTURAL`` for a node that carries no message
(ChatGPT's root node). ``storage.importers.tree`` checks and orders that tree;
``storage.importers.writer`` stores it.

The summary objects (``ImportSummary``, ``FileReport``, ``Skipped``,
``ImportProgress``) are plain data, so the window can build its progress bar
and summary dialog from them on the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from storage.errors import StorageError

STRUCTURAL: Final = ""
"""Role of a node that holds no message (a root placeholder); its children move up to its parent."""

NO_KV_NOTE: Final = (
    "Imported chats have no KV cache yet: the first turn on each one prefills the whole "
    "conversation, and from then on it is stored and restored as usual."
)


class ImportFormat(StrEnum):
    """The export formats ``branchwise import`` reads (``--format``)."""

    AUTO = "auto"
    BRANCHWISE = "branchwise"  # `branchwise conversations export --format json` and `export --all`
    CHATGPT = "chatgpt"  # conversations.json of ChatGPT's data export
    CLAUDE = "claude"  # conversations.json of Claude's data export
    OPENWEBUI = "openwebui"  # Open WebUI's chat export (JSON)
    LMSTUDIO = "lmstudio"  # one LM Studio conversation file (*.conversation.json)
    SILLYTAVERN = "sillytavern"  # one SillyTavern chat file (*.jsonl)


FORMAT_NAMES: Final = {
    ImportFormat.BRANCHWISE: "Branchwise",
    ImportFormat.CHATGPT: "ChatGPT",
    ImportFormat.CLAUDE: "Claude",
    ImportFormat.OPENWEBUI: "Open WebUI",
    ImportFormat.LMSTUDIO: "LM Studio",
    ImportFormat.SILLYTAVERN: "SillyTavern",
}


class FileStatus(StrEnum):
    """What happened to one file given to the import."""

    IMPORTED = "imported"  # something was added (or would be, with --dry-run)
    UNCHANGED = "unchanged"  # every conversation in it was imported before
    FAILED = "failed"  # nothing from this file was stored; ``FileReport.error`` says why
    CANCELLED = "cancelled"  # stopped by the cancel flag; nothing from this file was stored


class ImportFileError(StorageError):
    """A file cannot be imported: unreadable, not JSON, an unknown shape, or a broken tree.

    The message names the file and, where it applies, the conversation and the
    message (node) at fault; nothing from that file was stored.
    """


class ImportCancelled(StorageError):
    """The cancel flag was raised; the file being read was rolled back."""


@dataclass
class SourceMessage:
    """One node of an exported tree, with the export's own ids.

    ``parent`` is None for a root. ``created_at`` is unix seconds or None when
    the export has no time. ``extra`` holds fields the writer stores when
    present (Branchwise's own ``token_ids``, ``stats``, ``status`` on a round
    trip); a reader may keep other keys there for itself (they are not stored).
    """

    id: str
    parent: str | None
    role: str  # "user", "assistant", "system" or STRUCTURAL
    content: str = ""
    created_at: float | None = None
    model: str | None = None
    hidden: bool = False  # a system message the source app did not show
    extra: dict[str, Any] | None = None


@dataclass
class SourceConversation:
    """One exported conversation before it is checked and stored.

    ``source_id`` is the export's id for it (stable across exports, so a
    re-import finds it); ``current`` is the export's current node (None: the
    latest branch). ``children`` gives the export's sibling order where the
    format has one (ChatGPT's and Open WebUI's children lists); otherwise
    siblings keep the order of ``messages``.
    """

    source_id: str
    title: str
    created_at: float | None = None
    updated_at: float | None = None
    system_prompt: str = ""
    messages: list[SourceMessage] = field(default_factory=list)
    current: str | None = None
    children: dict[str, list[str]] | None = None
    pinned: bool = False
    sampling: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)  # reasons, for the summary


@dataclass(frozen=True)
class Skipped:
    """Something in a file that was not imported, and why (shown in the summary)."""

    where: str  # "conversations.json: conversation 'Trip plan' (id 6f1…)" or a zip member
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason}


@dataclass
class FileReport:
    """The outcome for one file (a zip counts as one file: it imports whole or not at all)."""

    path: str
    format: str | None = None
    status: FileStatus = FileStatus.IMPORTED
    conversations_added: int = 0
    conversations_updated: int = 0  # imported before; new messages or branches were added
    conversations_unchanged: int = 0  # imported before, nothing new
    messages: int = 0  # messages added
    branches: int = 0  # leaves of the added trees (a conversation without edits has one)
    skipped: list[Skipped] = field(default_factory=list)
    error: str | None = None
    conversation_ids: list[int] = field(default_factory=list)  # Branchwise ids added or updated

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "format": self.format, "status": str(self.status),
            "conversations_added": self.conversations_added,
            "conversations_updated": self.conversations_updated,
            "conversations_unchanged": self.conversations_unchanged,
            "messages": self.messages, "branches": self.branches,
            "skipped": [s.to_dict() for s in self.skipped], "error": self.error,
            "conversation_ids": self.conversation_ids,
        }


@dataclass
class ImportSummary:
    """What an import did, file by file, with totals (the window's summary dialog)."""

    files: list[FileReport] = field(default_factory=list)
    dry_run: bool = False
    cancelled: bool = False
    note: str = NO_KV_NOTE

    @property
    def conversations(self) -> int:
        return sum(f.conversations_added for f in self.files)

    @property
    def messages(self) -> int:
        return sum(f.messages for f in self.files)

    @property
    def branches(self) -> int:
        return sum(f.branches for f in self.files)

    @property
    def failed(self) -> list[FileReport]:
        return [f for f in self.files if f.status == FileStatus.FAILED]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run, "cancelled": self.cancelled,
            "conversations": self.conversations,
            "conversations_updated": sum(f.conversations_updated for f in self.files),
            "conversations_unchanged": sum(f.conversations_unchanged for f in self.files),
            "messages": self.messages, "branches": self.branches,
            "failed_files": len(self.failed), "note": self.note,
            "files": [f.to_dict() for f in self.files],
        }


@dataclass(frozen=True)
class ImportProgress:
    """Sent to the progress callback after each conversation (and once per file at the start).

    ``bytes_done``/``bytes_total`` are of the JSON being read (uncompressed
    size for a zip member); ``bytes_total`` is 0 when unknown.
    """

    path: Path
    file_index: int  # 0-based, of ``file_count``
    file_count: int
    bytes_done: int
    bytes_total: int
    conversations: int  # read so far in this file
    messages: int  # added so far in this file
