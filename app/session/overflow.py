"""What to offer when a prompt does not fit the context, from token counts.

Every figure is in tokens, counted by the engine's tokenizer (``CountEvent``: the prompt,
and each message's share of it). Only the choices that can work are offered:

* "Continue on a new branch" (keep the system prompt and the newest turns) when the
  newest message with the system prompt fits the context with room for a reply, and there
  is an older turn to drop;
* "Raise context to N" when a context that fits the whole prompt and a reply is within
  the largest one this model and this machine's memory allow (``largest_context``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.session.conversation import suggested_context_size

MEMORY_SHARE = 0.8
"""Share of the memory available (plus the KV cache in use, freed by a reload) the KV
cache may take: the rest is for the weights' pages, compute buffers and everything else."""
CONTEXT_STEP = 1024


def largest_context(trained: int, kv_bytes_per_token: int, n_ctx: int, available_bytes: int) -> int:
    """The largest context (tokens, a multiple of 1,024) for a model trained for ``trained``
    tokens (0: unknown) whose KV cache takes ``kv_bytes_per_token``, now loaded with
    ``n_ctx``, with ``available_bytes`` of memory free. 0 when neither limit is known."""
    limits = [trained] if trained > 0 else []
    if kv_bytes_per_token > 0 and available_bytes > 0:
        usable = MEMORY_SHARE * (available_bytes + n_ctx * kv_bytes_per_token)
        limits.append(int(usable // kv_bytes_per_token) // CONTEXT_STEP * CONTEXT_STEP)
    return min(limits) if limits else 0


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the reply when judging whether a prompt fits ``n_ctx``."""
    return max(1, min(max_tokens, n_ctx // 8))


@dataclass(frozen=True)
class OverflowChoices:
    """A prompt of ``prompt_tokens`` that does not fit ``n_ctx``; ``newest_tokens``: the
    system prompt and the newest message alone; ``largest_n_ctx``: the largest context
    allowed (0: unknown); ``raise_to``: the context to offer (0: none can fit it);
    ``can_branch``: whether "Continue on a new branch" can work."""

    prompt_tokens: int
    n_ctx: int
    newest_tokens: int
    largest_n_ctx: int
    raise_to: int
    can_branch: bool


def overflow_choices(message_tokens: list[int], has_system: bool, n_ctx: int, max_tokens: int,
                     largest_n_ctx: int) -> OverflowChoices:
    """The choices for a prompt whose messages take ``message_tokens`` (prompt order; the
    first is the system prompt when ``has_system``; the last is the newest message)."""
    prompt = sum(message_tokens)
    newest = message_tokens[-1] + (message_tokens[0] if has_system and len(message_tokens) > 1 else 0)
    turns = len(message_tokens) - (1 if has_system else 0)
    can_branch = turns > 1 and newest + reply_room(n_ctx, max_tokens) <= n_ctx
    need = prompt + reply_room(max(n_ctx, prompt), max_tokens)
    size = suggested_context_size(prompt, n_ctx, max_tokens)
    if largest_n_ctx:
        size = min(size, largest_n_ctx)
    raise_to = size if size > n_ctx and size >= need else 0
    return OverflowChoices(prompt, n_ctx, newest, largest_n_ctx, raise_to, can_branch)
