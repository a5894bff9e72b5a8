"""What a front end may ask of an engine: :class:`ChatEngine`, and what a request returns.

Two engines implement it: :class:`engine.core.Engine` (llama.cpp in this process, with the
prefix store) and :class:`engine.remote.RemoteEngine` (an OpenAI-compatible server). A
caller that needs more than the protocol (the store, token counts) asks ``is_remote``
first: a remote engine has no local KV, no store and no tokenizer.

This module imports neither llama.cpp nor httpx, so importing the types is cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from engine.chat_template import ChatMessage
from engine.settings import SamplingParams

ProgressFn = Callable[[str, int, int], None]  # (phase, done, total); phase "restore" | "prefill"
TokenFn = Callable[[str, int], None]  # (text delta, token id)


@dataclass
class GenerationStats:
    """What one request did. Token counts in tokens, times in milliseconds.

    ``restored_tokens + prefilled_tokens == prompt_tokens`` unless the request was
    cancelled while reading the prompt. ``ttft_ms`` runs from the
    request to the first generated token (model load excluded). ``restore_source`` is
    "store" (prefix store), "context" (the live KV of the previous request) or "none".
    """

    prompt_tokens: int = 0
    restored_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_tokens_per_s: float = 0.0
    snapshot_ms: float = 0.0
    snapshot_bytes_written: int = 0
    recompute_ms: float = 0.0  # re-prefilling the reply in one batch before it is reused
    restore_source: str = "none"
    cache_blocks_dropped: int = 0
    checkpoint_tokens: int = 0  # position of the checkpoint restored (models with checkpoints)
    cache_note: str = ""  # why the store could not be used for this request, in words
    finish_reason: str = ""  # "stop" (end of turn), "length" (max tokens), "context", "cancelled"
    reasoning_tokens: int = 0  # generated tokens of the reply's thinking (engine/reasoning.py)
    reasoning_ms: float = 0.0  # from the first generated token to the end of the thinking
    speculative: str = "none"  # the speculative decoding used: "none", "lookup", "draft:PATH"
    drafted_tokens: int = 0  # tokens drafted for verification (engine/speculative.py)
    accepted_tokens: int = 0  # of those, accepted: emitted without a step of their own

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("restore_ms", "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "recompute_ms",
                  "reasoning_ms"):
            d[k] = round(d[k], 2)
        return d


@dataclass
class GenerationResult:
    """``text`` is the answer; ``reasoning`` the thinking before it (None: the model wrote
    none, and ``text`` is the whole reply); ``token_ids`` every generated id, both parts;
    ``tool_calls`` the calls a remote server returned (OpenAI's objects; None: none)."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)
    reasoning: str | None = None
    tool_calls: list[dict] | None = None


@runtime_checkable
class ChatEngine(Protocol):
    """An engine a front end (the CLI, the engine process) generates replies with."""

    is_remote: bool
    """True when an OpenAI-compatible server answers: no local KV cache, prefix store,
    token counts or context check (the server does its own)."""

    def model_name(self) -> str:
        """The model's name: the GGUF's ``general.name`` (the file name when it has
        none), or the server's model id.

        Raises:
            EngineError: a remote server cannot be asked (``RemoteEngineError``).
        """
        ...

    def generate(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams | None = None,
        *,
        use_cache: bool = True,
        on_token: TokenFn | None = None,
        on_progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        snapshot: bool = True,
    ) -> GenerationResult:
        """The assistant's reply to ``messages``, streamed through ``on_token(delta, id)``.

        Raises:
            EngineError: the reply cannot be generated (the message says why, in words).
        """
        ...

    def snapshot(self, stats: GenerationStats | None = None) -> int:
        """Store the live context's new KV; returns bytes written (0 for a remote engine)."""
        ...

    def reset_context(self) -> None:
        """Forget the live context."""
        ...

    def close(self) -> None:
        """Free the model or the connection."""
        ...
