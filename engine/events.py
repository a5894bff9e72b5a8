"""What the window and the engine process say to each other: typed requests and events.

The window (``app/window/workers/engine_client.py``) and the engine process
(``engine/worker.py``) exchange these dataclasses over a ``multiprocessing`` pipe
(pickled; both processes import this module, so neither builds or parses a dict).
Every request that expects an answer carries an ``id`` (a positive int chosen by the
sender); every event that answers a request carries the same ``id``.

Requests, window -> engine::

    LoadRequest        path, settings (EngineSettings dict), budget_bytes
    GenerateRequest    id, messages [ChatMessage], sampling (SamplingParams dict), use_cache, reply_prefix,
                       path (packed messages before ``messages``)
    CancelRequest      id
    CountRequest       id, messages, per_message, draft -> CountEvent (prompt length[, per message])
    TitleRequest       id, messages, max_tokens        -> TitleEvent (engine/title.py)
    CoverageRequest    id, paths [[ChatMessage]]       -> CoverageEvent
    CacheRequest       id, action (CacheAction), budget_bytes -> CacheEvent
    PrewarmRequest     id, messages, draft, complete  -> PrewarmEvent (engine/prewarm.py)
    ShutdownRequest

Events, engine -> window::

    LoadProgressEvent  done, total (bytes of the model file hashed)
    LoadedEvent        facts (ModelFacts dict)  | LoadFailedEvent message
    ProgressEvent      id, phase (Phase), done, total (tokens)
    TokenEvent         id, text, reasoning (True: a piece of the thinking)
    DoneEvent          id, text, token_ids, stats (GenerationStats dict), reasoning
    SnapshotEvent      id, snapshot_ms, bytes_written (after DoneEvent, when the KV was stored)
    ErrorEvent         id, kind (ErrorKind), message, prompt_tokens, n_ctx
    CountEvent         id, prompt_tokens, n_ctx, message_tokens
    CoverageEvent      id, results [(stored, total)] in tokens, one per path
    CacheEvent         id, stats (PrefixStore.stats() dict), verify {checked, bad, removed} | None
    PrewarmEvent       id, result (PrewarmResult dict)
    TitleEvent         id, text, finished, generated_tokens, attempts

Raises nothing itself: a request the engine cannot serve comes back as an ErrorEvent.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from engine.chat_template import ChatMessage


class FinishReason(StrEnum):
    """Why a reply ended (``GenerationStats.finish_reason``, engine/core.py)."""

    STOP = "stop"            # the model ended its turn
    LENGTH = "length"        # max_tokens reached
    CONTEXT = "context"      # the context window is full
    CANCELLED = "cancelled"  # stopped by the user


class Phase(StrEnum):
    """The part of a request a ProgressEvent counts."""

    RESTORE = "restore"  # KV blocks read from the prefix store
    PREFILL = "prefill"  # prompt tokens evaluated


class ErrorKind(StrEnum):
    """What went wrong in an ErrorEvent."""

    OVERFLOW = "overflow"  # the prompt does not fit the context (prompt_tokens, n_ctx set)
    TEMPLATE = "template"  # the model's chat template failed on these messages
    ENGINE = "engine"      # any other failure (the traceback is in engine.log)
    NO_MODEL = "no_model"  # a request arrived before a model loaded


class CacheAction(StrEnum):
    STATS = "stats"
    CLEAR = "clear"    # remove every block, and the engine's in-memory KV
    VERIFY = "verify"  # check every block's checksum, remove bad ones
    SET_BUDGET = "set_budget"  # new byte budget (``budget_bytes``), evicting down to it
    FORGET = "forget"  # delete conversation ``conversation_id`` of ``chats_path`` and its unshared KV blocks


# -- requests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadRequest:
    path: str
    settings: dict
    budget_bytes: int | None = None
    remote: dict | None = None  # {"url", "key", "model"}: an OpenAI-compatible server instead of ``path``


@dataclass(frozen=True)
class GenerateRequest:
    id: int
    messages: list[ChatMessage]
    sampling: dict
    use_cache: bool = True
    reply_prefix: list[int] | None = None  # Continue: the reply's token ids so far (the prompt goes on from them)
    tools: list[dict] | None = None  # OpenAI function objects for the chat template (the window's tool loop)
    grammar: str | None = None  # GBNF text the reply is sampled with (engine.tool_grammar)
    path: bytes | None = None  # pack_messages bytes of the messages before ``messages`` (the window's shown branch)


@dataclass(frozen=True)
class CancelRequest:
    id: int


@dataclass(frozen=True)
class CountRequest:
    id: int
    messages: list[ChatMessage] | bytes  # bytes: made by pack_messages
    per_message: bool = False  # also each message's tokens (CountEvent.message_tokens)
    draft: str | None = None  # a user message not sent yet: the prompt of messages + it, and its own tokens


@dataclass(frozen=True)
class TitleRequest:
    """A chat title written by the loaded model after ``messages`` (``engine/title.py``), in
    the background: it yields to any other request between decode steps and runs again
    after them; its KV is never stored."""

    id: int
    messages: list[ChatMessage] | bytes  # bytes: made by pack_messages
    max_tokens: int = 16


@dataclass(frozen=True)
class CoverageRequest:
    id: int
    paths: list[list[ChatMessage]]


@dataclass(frozen=True)
class CacheRequest:
    id: int
    action: CacheAction
    budget_bytes: int | None = None
    conversation_id: int | None = None  # FORGET: the conversation (``engine.forget``)
    chats_path: str | None = None  # FORGET: the chats.sqlite3 it is in


@dataclass(frozen=True)
class PrewarmRequest:
    """Background work between requests (``engine.prewarm``): bring the live context up to
    the prompt of ``messages`` plus a user message ``draft`` ("" when nothing is typed yet;
    None: ``messages`` is the whole prompt, a regeneration). ``complete``: the whole prompt of
    ``draft`` sent as it is, else only what every continuation of it shares. It yields to any
    other request between batches; a newer prewarm replaces an older one."""

    id: int
    messages: list[ChatMessage] | bytes  # bytes: made by pack_messages (read with unpack_messages)
    draft: str | None = ""
    complete: bool = False


PACK_CHUNK = 256
"""Messages per pickle call in :func:`pack_messages`."""


def pack_messages(messages: Sequence[ChatMessage]) -> bytes:
    """``messages`` pickled once for many requests (the window sends a path's bytes with
    every keystroke's PrewarmRequest), ``PACK_CHUNK`` messages per pickle call: one call holds
    the GIL throughout, so a thread packing a long path lets the UI thread run between
    chunks."""
    chunks = [pickle.dumps(list(messages[i : i + PACK_CHUNK]), pickle.HIGHEST_PROTOCOL)
              for i in range(0, len(messages), PACK_CHUNK)]
    return pickle.dumps(chunks, pickle.HIGHEST_PROTOCOL)


def pack_after(packed: bytes, messages: Sequence[ChatMessage]) -> bytes:
    """The :func:`pack_messages` bytes of the messages of ``packed`` followed by ``messages``.
    The packed chunks are copied as bytes, not unpickled: a copy of the bytes, no work per
    message."""
    chunks = pickle.loads(packed)
    if messages:
        chunks.append(pickle.dumps(list(messages), pickle.HIGHEST_PROTOCOL))
    return pickle.dumps(chunks, pickle.HIGHEST_PROTOCOL)


def unpack_messages(data: Sequence[ChatMessage] | bytes) -> list[ChatMessage]:
    """The messages of a PrewarmRequest: a list as it is, or the bytes of :func:`pack_messages`."""
    if not isinstance(data, bytes):
        return list(data)
    out: list[ChatMessage] = []
    for chunk in pickle.loads(data):
        out.extend(pickle.loads(chunk))
    return out


@dataclass(frozen=True)
class ShutdownRequest:
    pass


Request = (LoadRequest | GenerateRequest | CancelRequest | CountRequest | CoverageRequest
           | CacheRequest | PrewarmRequest | TitleRequest | ShutdownRequest)


# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadProgressEvent:
    done: int
    total: int


@dataclass(frozen=True)
class LoadedEvent:
    facts: dict


@dataclass(frozen=True)
class LoadFailedEvent:
    message: str


@dataclass(frozen=True)
class ProgressEvent:
    id: int
    phase: str  # a Phase value
    done: int
    total: int


@dataclass(frozen=True)
class TokenEvent:
    id: int
    text: str
    reasoning: bool = False  # a piece of a reasoning model's thinking, not of its answer


@dataclass(frozen=True)
class DoneEvent:
    """A reply ended. ``stats``: ``GenerationStats.to_dict()`` (engine/core.py), plus from the
    engine process ``prepared_tokens`` / ``typed_tokens`` (engine/prewarm.py) and
    ``queued_ms``: milliseconds the request waited there behind the one being served."""

    id: int
    text: str
    token_ids: list[int]
    stats: dict
    reasoning: str | None = None  # the thinking before the answer ``text`` (engine/reasoning.py)
    tool_text: str | None = None  # with tools: the reply's ids as text with control tokens shown (engine.tool_calls)

    @property
    def finish_reason(self) -> FinishReason | None:
        value = self.stats.get("finish_reason")
        return FinishReason(value) if value in FinishReason._value2member_map_ else None


@dataclass(frozen=True)
class SnapshotEvent:
    id: int
    snapshot_ms: float
    bytes_written: int


@dataclass(frozen=True)
class ErrorEvent:
    id: int | None
    kind: ErrorKind
    message: str
    prompt_tokens: int = 0
    n_ctx: int = 0


@dataclass(frozen=True)
class CountEvent:
    id: int
    prompt_tokens: int
    n_ctx: int
    message_tokens: tuple[int, ...] = ()  # with per_message: ``Engine.message_tokens``


@dataclass(frozen=True)
class CoverageEvent:
    id: int
    results: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class CacheEvent:
    id: int
    stats: dict
    verify: dict | None = None
    dropped: int = 0  # FORGET: KV blocks removed


@dataclass(frozen=True)
class PrewarmEvent:
    id: int
    result: dict  # engine.prewarm.PrewarmResult.to_dict()


@dataclass(frozen=True)
class TitleEvent:
    """The title job's answer: ``text`` as the model wrote it (one line, "" when none),
    ``finished`` False when it stopped for a request that supersedes it (a load, a cache
    action, a shutdown); ``attempts``: how many times it ran (each request arriving during
    a run stops it between decode steps, and it runs again after them)."""

    id: int
    text: str
    finished: bool
    generated_tokens: int = 0
    attempts: int = 1


Event = (LoadProgressEvent | LoadedEvent | LoadFailedEvent | ProgressEvent | TokenEvent | DoneEvent
         | SnapshotEvent | ErrorEvent | CountEvent | CoverageEvent | CacheEvent | PrewarmEvent | TitleEvent)

ANSWERS = (DoneEvent, ErrorEvent, CountEvent, CoverageEvent, CacheEvent, PrewarmEvent, TitleEvent)
"""The events that end a request (the window's handle for that request is then finished)."""
