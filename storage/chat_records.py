"""The records of the conversation tree and how they are stored in SQLite.

``Conversation`` and ``Message`` are what ``storage.chats.ChatStore`` returns.
Token ids are stored as a little-endian int32 array, 4 bytes per token (the
same layout as ``storage.block_hash.tokens_to_bytes``).
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

DEFAULT_TITLE: Final = "New chat"
ROLES: Final = ("system", "user", "assistant", "tool")


class MessageStatus(StrEnum):
    """A message's lifecycle (the ``status`` column). A reply is STREAMING while it is being
    generated (its text saved every half second), then COMPLETE, STOPPED (by the user, by a
    quit or a crash: the partial text is kept) or ERROR (the engine failed mid-reply)."""

    COMPLETE = "complete"
    STOPPED = "stopped"
    ERROR = "error"
    STREAMING = "streaming"


STATUSES: Final = tuple(MessageStatus)
DEFAULT_SAMPLING: Final[Mapping[str, Any]] = MappingProxyType({
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 40,  # 0: off
    "min_p": 0.05,
    "repeat_penalty": 1.1,  # 1.0: off
    "seed": None,  # None: a different random seed for every generation
    "max_tokens": 1024,  # most tokens generated for one reply
    "thinking": "",  # a reasoning model's thinking: "" the template's default, "off", "low"/"medium"/"high"
    "thinking_budget": None,  # tokens of thinking before it is closed (None: no limit)
})
"""Sampling settings of a new conversation (read-only); its keys are the only ones accepted.
The one source of sampling defaults: ``engine.settings.SamplingParams`` takes its defaults from here.

The names follow llama-cpp-python's ``Llama.create_completion`` arguments.
"""

# Column orders expected by conversation_from_row and message_from_row.
CONVERSATION_COLUMNS = (
    "id, title, system_prompt, sampling_json, active_leaf_id, pinned, created_at, updated_at"
)
MESSAGE_FIELDS = (
    "id", "conversation_id", "parent_id", "role", "content", "token_ids", "stats_json", "status",
    "model", "created_at", "reasoning", "tool_json",
)
MESSAGE_COLUMNS = ", ".join(MESSAGE_FIELDS)


@dataclass(frozen=True)
class Conversation:
    """One conversation. Times are unix seconds; ``sampling`` has the keys of DEFAULT_SAMPLING.

    ``updated_at`` moves when a message is added, not on rename, pin or settings changes,
    so the conversation list is ordered by activity.
    """

    id: int
    title: str
    system_prompt: str
    sampling: dict[str, Any]
    active_leaf_id: int | None
    pinned: bool
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Message:
    """One message of the tree.

    ``token_ids`` are the exact ids the model generated (None if not generated,
    for example a user message); ``stats`` are generation statistics (tokens,
    milliseconds; the engine decides the keys); ``model`` names the model that
    wrote it. ``created_at`` is in unix seconds. ``reasoning`` is the thinking a
    reasoning model wrote before its answer (``content``), None when it wrote none.
    ``tool`` is a tool step's fields (``storage.chat_schema._migration_tools``): an
    assistant's ``{"tool_calls": [..]}`` or a ``role: "tool"`` result's call id, name,
    server, arguments, duration and error; None for other messages.
    """

    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    token_ids: tuple[int, ...] | None
    stats: dict[str, Any] | None
    status: str
    model: str | None
    created_at: float
    reasoning: str | None = None
    tool: dict[str, Any] | None = None


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Pack token ids as a little-endian int32 array (4 bytes per token).

    Raises:
        ValueError: an id does not fit in a signed 32-bit integer.
    """
    packed = array("i")
    if packed.itemsize != 4:  # pragma: no cover - C int is 32-bit on every supported platform
        raise RuntimeError("array('i') is not 32-bit on this platform")
    try:
        packed.extend(token_ids)
    except OverflowError as exc:
        raise ValueError("token ids must fit in a signed 32-bit integer") from exc
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def decode_token_ids(blob: bytes) -> tuple[int, ...]:
    """Inverse of ``encode_token_ids``."""
    packed = array("i")
    packed.frombytes(blob)
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    return tuple(packed)


def conversation_from_row(row: Sequence[Any]) -> Conversation:
    """Build a Conversation from a row of CONVERSATION_COLUMNS."""
    cid, title, system_prompt, sampling_json, leaf, pinned, created, updated = row
    return Conversation(
        id=cid,
        title=title,
        system_prompt=system_prompt,
        sampling=json.loads(sampling_json),
        active_leaf_id=leaf,
        pinned=bool(pinned),
        created_at=created,
        updated_at=updated,
    )


def message_from_row(row: Sequence[Any]) -> Message:
    """Build a Message from a row of MESSAGE_COLUMNS."""
    mid, cid, parent, role, content, blob, stats_json, status, model, created, *rest = row
    return Message(
        id=mid,
        conversation_id=cid,
        parent_id=parent,
        role=role,
        content=content,
        token_ids=None if blob is None else decode_token_ids(blob),
        stats=None if stats_json is None else json.loads(stats_json),
        status=status,
        model=model,
        created_at=created,
        reasoning=rest[0] if rest else None,
        tool=json.loads(rest[1]) if len(rest) > 1 and rest[1] else None,
    )


def checked_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Return DEFAULT_SAMPLING overridden by ``sampling``.

    Raises:
        ValueError: ``sampling`` has a key that DEFAULT_SAMPLING does not have.
    """
    unknown = sorted(set(sampling) - set(DEFAULT_SAMPLING))
    if unknown:
        raise ValueError(
            f"Unknown sampling setting(s): {', '.join(unknown)}. "
            f"Known settings: {', '.join(DEFAULT_SAMPLING)}."
        )
    return {**DEFAULT_SAMPLING, **sampling}
