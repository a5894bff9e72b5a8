"""A prompt far over the context window, found without tokenizing all of it.

Tokenizing one message of 6 MB takes the llama.cpp tokenizer 10-26 s (one call that
nothing can interrupt, not even a client that went away), and the queue waits that long
for a request that can only be refused. :func:`tokens_at_least` tokenizes a bounded head
of each long message instead: when that head alone is over the window, the whole prompt
is too (the rest of the text and the chat template only add tokens).
"""

from __future__ import annotations

from engine.errors import ContextOverflowError

CHARS_PER_TOKEN = 16
"""Characters of head tokenized per token of the window (English text is 3-5 characters a
token; a head that is mostly long runs tokenizes under the window and falls through)."""
SLACK = 16
"""Tokens the head's count must exceed the window by: a cut inside a word can split one
token in two."""


def tokens_at_least(model, messages, n_ctx: int) -> int:
    """A count of tokens the prompt of ``messages`` (``ChatMessage``) surely holds when it
    is over ``n_ctx`` (tokens), else 0 (the prompt may fit: tokenize it in full).

    Only messages longer than ``CHARS_PER_TOKEN * n_ctx`` characters are looked at (their
    first that many characters are tokenized with ``model.tokenize``), so the cost is
    bounded by the window, not the request; a reply standing as its saved ids is skipped.
    """
    head = CHARS_PER_TOKEN * (n_ctx + SLACK)
    for m in messages:
        if getattr(m, "token_ids", None) is None and len(m.content) > head:
            n = len(model.tokenize(m.content[:head], False))
            if n > n_ctx + SLACK:
                return n - SLACK
    return 0


def refuse_far_over(engine, messages) -> None:
    """Raise when :func:`tokens_at_least` finds the prompt of ``messages`` over the window of
    a local ``engine`` (one with ``llama``; a remote engine is left to its server).

    Raises:
        ContextOverflowError: with ``at_least`` True (its ``prompt_tokens`` a lower bound).
    """
    llama = getattr(engine, "llama", None)
    if llama is None:
        return
    least = tokens_at_least(engine.model, messages, llama.n_ctx())
    if least:
        exc = ContextOverflowError(least, llama.n_ctx())
        exc.at_least = True
        raise exc
