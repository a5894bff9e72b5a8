"""Import files into ``chats.sqlite3``: detection, zips, one transaction per file, progress, cancel.

``import_files`` is what the CLI (``branchwise import``) and the window call.
It is safe to run on a worker thread: it opens its own SQLite connection,
reports through ``progress`` (called on that thread; hand it to the UI thread
with a queued signal) and polls ``cancel`` between conversations.

Atomic per file: each file (a zip counts as one file) is read inside one
``BEGIN IMMEDIATE`` transaction; any error rolls it back, so a bad file adds
nothing and the others still import. While a file imports, other writers to
``chats.sqlite3`` wait (SQLite allows one writer); readers are not blocked (WAL).
"""

from __future__ import annotations

import logging
import sqlite3
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import ijson

from storage.chats import ChatStore
from storage.errors import StorageError, disk_full_as_storage_full
from storage.importers import branchwise, chatgpt, claude, jsonio, lmstudio, openwebui, sillytavern
from storage.importers.bounded import MAX_STRING_BYTES
from storage.importers.records import (
    FORMAT_NAMES,
    FileReport,
    FileStatus,
    ImportCancelled,
    ImportFileError,
    ImportFormat,
    ImportProgress,
    ImportSummary,
    Skipped,
    SourceConversation,
)
from storage.importers.tree import plan
from storage.importers.writer import Writer

log = logging.getLogger(__name__)

ProgressCallback = Callable[[ImportProgress], None]
CancelFlag = Callable[[], bool]

ZIP_BOMB_BYTES = 256 * 1024 * 1024
ZIP_BOMB_RATIO = 100
"""A zip member that unpacks to more than ZIP_BOMB_BYTES at more than ZIP_BOMB_RATIO
times its packed size is refused before it is read (a 1.5 MB zip can hold 1.5 GiB)."""
BUSY_TIMEOUT_S = 30.0
"""How long a file's import waits for another writer of ``chats.sqlite3`` to finish."""

_NOT_CHATS = {"users.json", "user.json", "projects.json", "message_feedback.json", "memories.json",
              "shared_conversations.json", "model_comparisons.json", "user_settings.json"}


class _NotAChatFile(ImportFileError):
    """Valid JSON (or empty) but not a chat export: skipped inside a zip, an error on its own."""


@dataclass
class _Source:
    """One JSON document to read: a file, or a member of a zip."""

    name: str  # "export.zip/conversations.json" or the file's path
    size: int
    open: Callable[[], IO[bytes]]
    in_zip: bool = False

    @property
    def prefix(self) -> str:
        """What error messages start with (the file's own path is added by the caller)."""
        return f"{self.name.rsplit('/', 1)[-1]}: " if self.in_zip else ""


def import_files(
    paths: Iterable[Path | str],
    db_path: Path,
    *,
    format: ImportFormat | str = ImportFormat.AUTO,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    cancel: CancelFlag | Any | None = None,
) -> ImportSummary:
    """Import each file of ``paths`` into the chat database at ``db_path``.

    A folder stands for the export files in it (``expand_folders``). ``format`` forces
    one format for every file (``ImportFormat.AUTO``: detect
    each). ``dry_run`` reads and checks everything and counts what would be
    added, then rolls back. ``cancel`` is a callable returning True, or an
    object with ``is_set()`` (a ``threading.Event``); when raised, the file
    being read is rolled back and the remaining files are not read (files
    already finished stay imported).

    Returns an ``ImportSummary``; a file that cannot be imported is reported
    there (status FAILED with the reason), it does not raise.

    Raises:
        StorageError: the chat database cannot be opened, or stayed locked by another
            writer for 30 seconds.
        StorageFullError: the disk is full (the file being imported was rolled back).
    """
    fmt = ImportFormat(format)
    paths = expand_folders(paths)
    summary = ImportSummary(dry_run=dry_run)
    is_cancelled = _cancel_check(cancel)
    ChatStore(db_path).close()  # creates the file if needed and applies pending migrations
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")
        for index, path in enumerate(paths):
            report = FileReport(str(path))
            summary.files.append(report)
            try:
                _import_one(conn, path, fmt, dry_run, report,
                            _Progress(progress, path, index, len(paths)), is_cancelled)
            except ImportCancelled:
                _reset(report, FileStatus.CANCELLED)
                summary.cancelled = True
                break
            except ImportFileError as exc:
                log.info("import of %s failed: %s", path, exc, exc_info=exc.__cause__ is not None)
                _reset(report, FileStatus.FAILED)
                words = str(exc)  # most failures already start with the file's name
                report.error = words if words.startswith(f"{path}: ") else f"{path}: {words}"
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
        raise StorageError(
            f"{db_path} stayed busy for {BUSY_TIMEOUT_S:g} seconds (another Branchwise is writing to it), so the "
            f"import stopped; files reported as imported are saved. Try again. ({exc})") from exc
    finally:
        conn.close()
    return summary


def expand_folders(paths: Iterable[Path | str]) -> list[Path]:
    """Replace each folder by the ``.json``, ``.jsonl`` and ``.zip`` files directly in it, sorted
    by name (LM Studio keeps one file per conversation in ``~/.lmstudio/conversations``).
    A folder with none of them stays, so the import reports it."""
    out: list[Path] = []
    for p in map(Path, paths):
        try:
            found = sorted(x for x in p.iterdir() if x.is_file() and not x.name.startswith(".")
                           and x.suffix.lower() in (".json", ".jsonl", ".zip")) if p.is_dir() else []
        except OSError:  # unreadable folder: reported when it is opened
            found = []
        out.extend(found or [p])
    return out


def detect(path: Path | str) -> ImportFormat:
    """The format of a file (for a zip, of its first chat file), without importing it.

    Raises:
        ImportFileError: unreadable, not JSON, or of no known shape.
    """
    with _sources(Path(path)) as sources:
        for source in sources:
            try:
                return _detect(source)[0]
            except ImportFileError as exc:
                if not source.in_zip:
                    raise ImportFileError(f"{path}: {exc}") from exc
    raise ImportFileError(f"{path}: no chat file found in it")


# -- one file -------------------------------------------------------------------------------


def _import_one(conn: sqlite3.Connection, path: Path, fmt: ImportFormat, dry_run: bool,
                report: FileReport, progress: _Progress, is_cancelled: CancelFlag) -> None:
    with _sources(path) as sources, _transaction(conn, _database_folder(conn), commit=not dry_run):
        progress.start(sum(s.size for s in sources))
        found = False
        for source in sources:
            if is_cancelled():
                raise ImportCancelled(f"{path}: cancelled")
            try:
                detected, kind, keys = (_forced(source, fmt) if fmt != ImportFormat.AUTO else _detect(source))
            except _NotAChatFile as exc:
                if source.in_zip:  # a zip also holds account data, settings, feedback…
                    report.skipped.append(Skipped(source.name, f"not a chat file ({exc})"))
                    continue
                raise ImportFileError(f"{source.prefix}{exc}") from exc
            except ImportFileError as exc:
                raise ImportFileError(f"{source.prefix}{exc}") from exc
            found = True
            report.format = detected.value if report.format in (None, detected.value) else "mixed"
            writer = Writer(conn, detected, report)
            with source.open() as raw:
                stream = jsonio.CountingReader(raw)
                for conv in _conversations(detected, stream, kind, keys, source):
                    _add(writer, detected, conv, source, report, stream.too_long)
                    stream.too_long.clear()
                    progress.conversation(stream.done, report.messages)
                    if is_cancelled():
                        raise ImportCancelled(f"{path}: cancelled")
            writer.flush()
            progress.advance(source.size)
        if not found:
            raise ImportFileError("no chat file found in it (expected a conversations.json, an Open "
                                  "WebUI, LM Studio or Branchwise .json, or a SillyTavern .jsonl)")
    if report.conversations_added or report.conversations_updated:
        report.status = FileStatus.IMPORTED
    else:
        report.status = FileStatus.UNCHANGED


def _add(writer: Writer, fmt: ImportFormat, conv: SourceConversation, source: _Source,
         report: FileReport, too_long: list[int] = ()) -> None:
    label = f"conversation {conv.title!r} (id {conv.source_id})" if conv.title else f"conversation {conv.source_id}"
    try:
        checked = plan(conv, lift_system_prompt=fmt != ImportFormat.BRANCHWISE,
                       merge_assistant_runs=fmt == ImportFormat.CHATGPT)
        writer.add(conv, checked)
    except ImportFileError as exc:
        raise ImportFileError(f"{source.prefix}{label}: {exc}") from exc
    for reason in conv.skipped + checked.skipped:
        report.skipped.append(Skipped(f"{source.name}: {label}", reason))
    for size in too_long:  # storage/importers/bounded.py: kept as a line saying what was there
        report.skipped.append(Skipped(f"{source.name}: {label}",
                                      f"a message text of {size / 2**20:,.0f} MiB, over the "
                                      f"{MAX_STRING_BYTES // 2**20} MiB limit (kept as a line saying so)"))


def _conversations(fmt: ImportFormat, stream: IO[bytes], kind: str, keys: set[str],
                   source: _Source) -> Iterator[SourceConversation]:
    """The reader for ``fmt``, with a reader's surprise (a value of an unexpected type
    deep inside a hostile file) turned into an ImportFileError naming the file."""
    if fmt == ImportFormat.CHATGPT:
        reader = chatgpt.read(stream, kind)
    elif fmt == ImportFormat.CLAUDE:
        reader = claude.read(stream, kind)
    elif fmt == ImportFormat.OPENWEBUI:
        reader = openwebui.read(stream, kind)
    elif fmt == ImportFormat.LMSTUDIO:
        reader = lmstudio.read(stream, kind)
    elif fmt == ImportFormat.SILLYTAVERN:
        reader = sillytavern.read(stream, PurePosixPath(source.name).stem)
    else:
        reader = branchwise.read(stream, kind, keys)
    try:
        yield from reader
    except ImportFileError as exc:
        raise ImportFileError(f"{source.prefix}{exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        log.debug("reader failed on %s", source.name, exc_info=True)
        raise ImportFileError(f"{source.prefix}it does not have the shape of a {FORMAT_NAMES[fmt]} export "
                              f"({type(exc).__name__}: {exc})") from exc


# -- finding and recognising the JSON documents --------------------------------------------


@contextmanager
def _sources(path: Path) -> Iterator[list[_Source]]:
    """The JSON documents in ``path`` (itself, or the chat files of a zip), open while in use."""
    try:
        if not path.is_file():
            raise ImportFileError(f"{path}: there is no such file" if not path.exists() else
                                  f"{path}: it is a folder with no .json, .jsonl or .zip file in it")
        is_zip = zipfile.is_zipfile(path)
        size = path.stat().st_size
    except OSError as exc:
        raise ImportFileError(f"{path}: it cannot be read ({exc.strerror or exc})") from exc
    if not is_zip:
        yield [_Source(str(path), size, lambda: open(path, "rb"))]
        return
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ImportFileError(f"{path}: it is not a readable zip file ({exc})") from exc
    with zf:
        yield _zip_sources(path, zf)


def _zip_sources(path: Path, zf: zipfile.ZipFile) -> list[_Source]:
    sources = []
    for info in zf.infolist():
        name = PurePosixPath(info.filename)
        if info.is_dir() or name.name.startswith((".", "._")) or "__MACOSX" in name.parts:
            continue
        if name.suffix.lower() not in (".json", ".jsonl") or name.name.lower() in _NOT_CHATS:
            continue
        if info.file_size > ZIP_BOMB_BYTES and info.file_size > ZIP_BOMB_RATIO * max(info.compress_size, 1):
            raise ImportFileError(
                f"{path}: {info.filename} unpacks to {info.file_size / 2**30:,.1f} GiB from "
                f"{info.compress_size / 2**20:,.1f} MiB ({info.file_size // max(info.compress_size, 1):,} to 1), "
                f"which no chat export does (they pack at most about 20 to 1); it was not read")
        sources.append(_Source(f"{path}/{info.filename}", info.file_size,
                               lambda info=info: zf.open(info), in_zip=True))
    return sources


def _detect(source: _Source) -> tuple[ImportFormat, str, set[str]]:
    """Recognise a document by its first line (``.jsonl``) or its top-level keys.

    Raises:
        ImportFileError: not JSON or of no known shape.
    """
    if source.name.lower().endswith(".jsonl"):
        return ImportFormat.SILLYTAVERN, "", set()
    if source.size == 0:
        raise _NotAChatFile("it is empty")
    with source.open() as raw:
        kind, keys, first = jsonio.top_keys(raw)
    if not kind:
        raise _NotAChatFile("it is not a JSON object or array")
    fmt = _format_of(keys)
    if fmt is None:
        if kind == "[" and not keys and not first:
            raise _NotAChatFile("it holds no conversations (an empty list)")
        if kind == "[" and first != "object":
            raise _NotAChatFile(f"it is a list whose first item is {'an' if first[0] in 'aeiou' else 'a'} "
                                f"{first}, not a conversation object; it is not a chat export Branchwise knows")
        shown = ", ".join(sorted(keys)[:8]) or "none"
        raise _NotAChatFile(
            f"its shape is not one Branchwise knows (top-level keys: {shown}). If you know which app "
            "wrote it, pass --format.")
    if fmt == ImportFormat.BRANCHWISE and "branchwise_export" in keys:
        with source.open() as raw:
            version = next(iter(jsonio.items(raw, "branchwise_export")), None)
        branchwise.check_version(version)
    return fmt, kind, keys


def _format_of(keys: set[str]) -> ImportFormat | None:
    if "branchwise_export" in keys or ({"messages", "active_leaf_id"} <= keys):
        return ImportFormat.BRANCHWISE
    if "mapping" in keys:
        return ImportFormat.CHATGPT
    if "chat_messages" in keys:
        return ImportFormat.CLAUDE
    if "chat" in keys or "history" in keys:
        return ImportFormat.OPENWEBUI
    if "messages" in keys and ("createdAt" in keys or "tokenCount" in keys or "lastUsedModel" in keys):
        return ImportFormat.LMSTUDIO
    if {"user_name", "character_name", "chat_metadata"} & keys or "mes" in keys:
        return ImportFormat.SILLYTAVERN
    return None


def _forced(source: _Source, fmt: ImportFormat) -> tuple[ImportFormat, str, set[str]]:
    """``--format`` given: only find out whether the document is an object or an array."""
    if fmt == ImportFormat.SILLYTAVERN:
        return fmt, "", set()
    with source.open() as raw:
        kind, keys, _first = jsonio.top_keys(raw)
    if not kind:
        raise ImportFileError("it is not a JSON object or array")
    if fmt == ImportFormat.BRANCHWISE and "branchwise_export" in keys:
        with source.open() as raw:
            branchwise.check_version(next(iter(jsonio.items(raw, "branchwise_export")), None))
    return fmt, kind, keys


# -- transaction, progress, cancel ----------------------------------------------------------


def _database_folder(conn: sqlite3.Connection) -> str:
    """The folder of the chat database ``conn`` writes to: what a full disk is about (the
    file being imported is only read)."""
    file = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
    return str(Path(file).parent) if file else "the chat database"


@contextmanager
def _transaction(conn: sqlite3.Connection, where: str, commit: bool) -> Iterator[None]:
    """One write transaction: committed (or rolled back for a dry run) on success, rolled back on error."""
    with disk_full_as_storage_full(where):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.IntegrityError as exc:  # deferred foreign keys fail at COMMIT
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ImportFileError(f"its messages do not form a consistent tree ({exc})") from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


class _Progress:
    def __init__(self, callback: ProgressCallback | None, path: Path, index: int, count: int) -> None:
        self.callback, self.path, self.index, self.count = callback, path, index, count
        self.total = 0
        self.base = 0  # bytes of the zip members already read
        self.conversations = 0

    def start(self, total: int) -> None:
        self.total = total
        self._send(0, 0)

    def conversation(self, done: int, messages: int) -> None:
        self.conversations += 1
        self._send(self.base + done, messages)

    def advance(self, size: int) -> None:
        self.base += size

    def _send(self, done: int, messages: int) -> None:
        if self.callback is not None:
            self.callback(ImportProgress(self.path, self.index, self.count, min(done, self.total or done),
                                         self.total, self.conversations, messages))


def _cancel_check(cancel: Any) -> CancelFlag:
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    if callable(cancel):
        return cancel
    raise TypeError("cancel must be a callable or have is_set()")


def _reset(report: FileReport, status: FileStatus) -> None:
    """Nothing from the file was stored: zero the counts, keep the format and skipped list."""
    report.status = status
    report.conversations_added = report.conversations_updated = report.conversations_unchanged = 0
    report.messages = report.branches = 0
    report.conversation_ids = []


# ijson is imported here so a missing C backend shows up at import time, not mid-file.
_ = ijson.backend
