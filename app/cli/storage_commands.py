"""CLI pieces about what is stored: reading a message from a file or stdin, deleting a
conversation for good, the cache statistics in human units, the Markdown export's
branch note, and saying what a turn did and did not save.

The command modules (app/cli/commands/) and app/cli/reply.py call these; they hold no state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field

from app.cli import arguments
from storage.errors import NotFoundError, StorageError
from storage.paths import human_bytes

MAX_MESSAGE_BYTES = 64 * 1024**2
"""Largest message read from a file or stdin (64 MB): far beyond any context window,
small enough that a mistaken ``--file /dev/zero`` ends with an error, not a full memory."""


def add_message_arguments(chat: argparse.ArgumentParser) -> None:
    """``chat TEXT``, ``chat -`` (stdin) and ``chat --file PATH``."""
    chat.add_argument("text", nargs="?", help="the message; '-' reads it from stdin (for messages "
                      "longer than a command line allows)")
    chat.add_argument("--file", metavar="PATH", help="read the message from this UTF-8 text file")


def message_text(args, stdin=None) -> str:
    """The message of ``chat``: the TEXT argument, stdin for ``-``, or ``--file PATH``.

    Raises:
        ValueError: both or neither given, the file cannot be read (the message names
            it and why), it is not UTF-8 text, or it is larger than MAX_MESSAGE_BYTES.
    """
    if args.file is not None and args.text is not None:
        raise ValueError("Give the message either as TEXT or with --file, not both.")
    if args.file is None and args.text is None:
        raise ValueError("No message: give TEXT, '-' to read stdin, or --file PATH.")
    if args.file is None and args.text != "-":
        return args.text
    if args.file is not None:
        where = args.file
        try:
            with open(args.file, "rb") as f:
                data = f.read(MAX_MESSAGE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"Cannot read the message file {where}: "
                             f"{(exc.strerror or str(exc)).lower()}.") from exc
    else:
        where = "standard input"
        stream = stdin if stdin is not None else sys.stdin.buffer
        data = stream.read(MAX_MESSAGE_BYTES + 1)
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"The message in {where} is larger than {human_bytes(MAX_MESSAGE_BYTES)}.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"The message in {where} is not UTF-8 text (byte {exc.start} is not "
                         "valid UTF-8); save it as UTF-8 and try again.") from exc


def clear_on_full_disk(path, open_store):
    """``cache clear`` when the prefix store at ``path`` cannot even be opened because the
    disk is full: its block files (most of its bytes, and disposable) are zeroed and
    removed without the index, which frees the room to open it; as a last resort the
    index files themselves are removed. Only the store's own files are touched
    (``storage.block_files``). Returns ``open_store()``'s store, ready for ``clear()``.

    Raises:
        StoreFull: even an empty store cannot be created (something else fills the disk).
    """
    import contextlib
    import os

    from storage.block_files import BlockFiles
    from storage.prefix_store import StoreFull

    BlockFiles(f"{path}-blocks").reclaim(set())
    try:
        return open_store()
    except StoreFull:
        pass
    for suffix in ("-journal", "-wal", "-shm", ""):  # unlinked: a symbolic link is not followed
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(f"{path}{suffix}")
    return open_store()


class ConversationDeleted(StorageError):
    """The conversation was deleted (by another process or the window) while its reply
    was being written: nothing of the reply was stored, nor its KV blocks."""

    def __init__(self, conversation_id: int):
        super().__init__(f"Conversation {conversation_id} was deleted while the reply was being "
                         "written; nothing was kept.")


class DeletionWatch:
    """Notices that the conversation a reply is being written for was deleted meanwhile
    (``conversations delete`` in another process): the user message the reply answers
    is gone, or is another conversation's now (an id used again).

    Args:
        chats: the ``storage.chats.ChatStore``.
        conversation_id, user_id: the conversation and the message the reply answers.
        every_s: least seconds between two checks of :meth:`poll` (one indexed SELECT).
    """

    def __init__(self, chats, conversation_id: int, user_id: int, every_s: float = 0.5,
                 clock=time.monotonic):
        self.chats, self.conversation_id, self.user_id = chats, conversation_id, user_id
        self.every_s, self.clock = every_s, clock
        self.deleted = False
        self._checked = clock()

    def gone(self) -> bool:
        """True when the conversation was deleted (checked now; once True, stays True)."""
        if not self.deleted:
            try:
                self.deleted = self.chats.get_message(self.user_id).conversation_id != self.conversation_id
            except NotFoundError:
                self.deleted = True
        return self.deleted

    def poll(self) -> bool:
        """:meth:`gone`, checked at most every ``every_s`` seconds (call it between tokens)."""
        if self.deleted or self.clock() - self._checked >= self.every_s:
            self._checked = self.clock()
            return self.gone()
        return False

    def forget_written(self, engine, sequence: list[int]) -> int:
        """Drop the KV blocks of ``sequence`` (the prompt and the reply's ids) that the
        engine stored after the delete had forgotten the conversation, keeping what
        another conversation shares (``engine.forget``). Returns blocks dropped."""
        from engine.forget import sharing_token_paths

        build = engine.model.prompts.build
        keep = sharing_token_paths(self.chats, self.conversation_id, [sequence], build, engine.store.block_size)
        return engine.store.forget([sequence], keep)


def check_model_path(path: str | None) -> None:
    """Refuse a model path that is not valid UTF-8 with a message naming the cause.

    llama.cpp opens models by a UTF-8 path; on Linux a folder or file name with a
    byte that is not UTF-8 reaches Python as a lone surrogate and cannot be passed on.

    Raises:
        ValueError: the path has such a byte.
    """
    if path is None:
        return
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ValueError(
            f"The model path {shown} has a byte that is not UTF-8 in its name (at character "
            f"{exc.start + 1}), and llama.cpp can only open UTF-8 paths. The file is not the "
            "problem: rename the folder or file, or move the model to a folder with a plain name."
        ) from exc


@dataclass
class Saved:
    """What one ``chat`` or ``regenerate`` turn saved; ``--json`` prints it as ``saved``."""

    user_message: bool = False
    reply: bool = False
    stats: bool = False
    kv_cache: bool = False
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def error_json(exc: BaseException) -> str:
    """The one JSON object ``--json`` prints on stdout when a command fails:
    ``{"error": message, "saved": {...} or null}``, and after a reply that failed to save
    (a full disk) its ``conversation_id`` and ``assistant_message_id`` (the row holding the
    part that was kept, or null)."""
    saved = getattr(exc, "saved", None)
    return json.dumps({"error": str(exc), **(getattr(exc, "turn", None) or {}),
                       "saved": saved.to_dict() if saved else None}, ensure_ascii=False)


def stats_text(s: dict) -> str:
    """``cache stats`` for a person: sizes in KB/MB/GB (powers of 1024, as ``--cache-budget``)."""
    hit_rate = f"{100 * s['hits'] / s['lookups']:.0f}%" if s["lookups"] else "n/a"
    return "\n".join([
        f"blocks           {s['blocks']:,} ({s['tail_blocks']:,} tails, {s['block_size']} tokens per full block)",
        f"tokens stored    {s['tokens']:,}",
        f"checkpoints      {s.get('checkpoints', 0):,} ({human_bytes(s.get('checkpoint_bytes', 0))} of "
        "sliding-window or recurrent state)",
        f"size on disk     {human_bytes(s['file_bytes'])} (KV {human_bytes(s['bytes'])}; "
        f"budget {human_bytes(s['budget_bytes'])} plus {human_bytes(s.get('overhead_bytes', 0))} "
        "for an empty cache file)",
        f"lookups          {s['lookups']:,} ({s['hits']:,} hits, {s['misses']:,} misses, hit rate {hit_rate})",
        f"tokens restored  {s['tokens_restored']:,}; prefilled {s['tokens_prefilled']:,}",
        f"evicted          {s['evicted_blocks']:,} blocks, {s.get('evicted_checkpoints', 0):,} checkpoints, "
        f"{human_bytes(s['evicted_bytes'])}",
    ])


def branch_note(data: dict, all_branches: bool) -> str:
    """The line the Markdown export starts with: which branch it shows and what it leaves out."""
    total = len(data["messages"])
    if all_branches:
        return f"*Every branch: all {total} messages, in the order they were written.*"
    shown = len(data["active_path"])
    hidden = total - shown
    if not hidden:
        return f"*The only branch: {shown} message{'s' * (shown != 1)}.*"
    ends = f"ending at message {data['active_path'][-1]}" if shown else "empty"
    return (f"*The active branch ({ends}): {shown} of {total} messages. {hidden} messages on other "
            "branches are not shown; export with --all-branches or --format json to see them.*")


def add_delete_parser(conv_sub, common: argparse.ArgumentParser) -> None:
    """``conversations delete ID``."""
    delete = conv_sub.add_parser(
        "delete", parents=[common],
        help="delete a conversation and forget it: its messages, its words in the search index, "
             "and the KV cache blocks no other conversation shares")
    delete.add_argument("id", type=arguments.row_id)
    delete.add_argument("--model", help="the GGUF model whose tokenizer matches the cached blocks "
                        "(default: the embedded one)")


def cmd_delete(args, chats, open_store) -> int:
    """Delete conversation ``args.id`` and forget its KV blocks (``engine.forget``).

    ``open_store()`` opens the prefix store. The model is loaded only when the cache
    holds blocks. Prints what was removed; exit code 0 when the conversation is gone,
    even if the optional cache could not be cleaned (that is then said).
    """
    from engine.forget import delete_and_forget

    chats.get_conversation(args.id)  # NotFoundError before anything is loaded
    store, build, note = None, None, ""
    try:
        store = open_store()
        if store.stats()["blocks"]:
            from engine.model import LoadedModel
            from engine.model_file import default_model_path
            from engine.settings import EngineSettings

            check_model_path(args.model)
            build = LoadedModel(args.model or default_model_path(), EngineSettings(n_ctx=512)).prompts.build
    except Exception as exc:  # noqa: BLE001 - the cache is optional: delete the conversation anyway
        note, store = f"the KV cache was not cleaned: {exc}", None
    from storage.prefix_store import StoreError

    try:
        dropped = delete_and_forget(chats, store, args.id, build)
    except StoreError as exc:  # the conversation is gone; only cleaning the cache failed
        dropped, note = 0, f"the KV cache was not cleaned: {exc}"
    if args.json:
        print(json.dumps({"deleted": args.id, "kv_blocks_dropped": dropped, "problem": note or None}))
    else:
        print(f"deleted conversation {args.id}; dropped {dropped} KV cache blocks it did not share")
        if note:
            print(f"branchwise: {note}", file=sys.stderr)
    return 0


__all__ = ["MAX_MESSAGE_BYTES", "ConversationDeleted", "DeletionWatch", "Saved", "add_delete_parser", "add_message_arguments",
           "branch_note", "check_model_path", "clear_on_full_disk", "cmd_delete", "error_json", "message_text",
           "stats_text"]
