"""Zero-wait turns: bring the live context up to the next prompt while the user reads and types.

Between requests the engine is idle. A prewarm uses that time, on the same engine and by the
same rules as a request (``Engine.position``: the live context or the prefix store, whichever
holds the longer prefix; then prefill in batches of >= 2 tokens), so that when the user
sends, only the tokens past the prepared part are evaluated:

* **open** (``draft=""``, not ``complete``): a conversation or branch was opened: restore its
  path, and prefill it up to the next user message's header;
* **draft** (``draft=text``): the composer holds ``text``: prefill the prompt it would make,
  up to the draft's last whitespace (the tokens at the edge of a word change as the user
  types), or, with ``complete``, the whole prompt of ``text`` sent now (the window asks for
  that once the user pauses);
* **regenerate** (``draft=None``): the whole prompt of the path as it is (its last message
  is the user message a regeneration answers).

What the prompt of an unfinished draft shares with every prompt the user may still send is
found by rendering the draft with two different continuations and taking the longest common
prefix of the token ids, so no tokenizer or chat template is assumed.

Guarantees (``tests/test_prewarm.py`` checks them on the real default model):

* exactness: a prewarm evaluates only batches of >= 2 tokens and keeps ``Engine.live.exact_upto``, so
  what a request later reuses from the live context is what a from-scratch prefill
  computes; a later request cuts the live context back to the longest common prefix of
  token ids, as for any other request;
* it never writes KV to the prefix store (only a sent turn is stored), nor counts in its
  statistics or LRU marks;
* it stops between batches as soon as ``cancel`` is set (the worker sets it when any other
  request arrives), keeping what it computed;
* models whose state cannot be cut back to an arbitrary prefix (sliding window, recurrent,
  hybrid: their cache strategy does not ``cuts_back``) are not prewarmed: a draft that changes would leave a
  state no request can use exactly. Remote engines neither.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from engine.chat_template import ChatMessage
from engine.core import Engine, GenerationStats
from engine.live_context import batches, common_prefix
from engine.errors import EngineError

log = logging.getLogger(__name__)

PREWARM_BATCH = 32
"""Tokens per prefill batch of a prewarm: small, so a real request waits at most one such
batch (any batch of >= 2 tokens gives the same KV, see ``engine/core.py``)."""

# Two continuations of an unfinished draft that share no first character: the prompt
# tokens every continuation shares are the common prefix of both renders.
_PROBES = ("Q", "7")

Build = Callable[[Sequence[ChatMessage], bool], list[int]]  # (messages, add_generation_prompt) -> ids


def stable_prefix(draft: str) -> tuple[str, str]:
    """``(stable, gap)``: the draft up to its last run of whitespace, and that whitespace
    (``("", "")`` when the draft has none). The word after it is still being typed."""
    end = len(draft.rstrip())
    cut = end
    while cut > 0 and not draft[cut - 1].isspace():
        cut -= 1
    if cut == 0:
        return "", ""
    start = cut
    while start > 0 and draft[start - 1].isspace():
        start -= 1
    return draft[:start], draft[start:cut]


def prewarm_target(build: Build, messages: Sequence[ChatMessage], draft: str | None,
                   complete: bool) -> list[int]:
    """The prompt token ids a prewarm brings into the live context.

    Args:
        build: the model's prompt builder (``PromptBuilder.build``).
        messages: the path before the new user message (system prompt first, as for a request).
        draft: the composer's text (``""``: nothing typed yet), or None: ``messages`` is the
            whole conversation to answer (a regeneration).
        complete: ``draft`` is the message as it would be sent now (stripped): the whole prompt.

    Raises:
        TemplateError: the chat template cannot render these messages.
    """
    msgs = list(messages)
    if draft is None:
        return build(msgs, True)
    if complete:
        return build(msgs + [ChatMessage("user", draft)], True)
    stable, gap = stable_prefix(draft)
    ids = build(msgs + [ChatMessage("user", draft)], False) if draft.strip() else None
    for probe in _PROBES:
        other = build(msgs + [ChatMessage("user", stable + gap + probe)], False)
        ids = other if ids is None else ids[: common_prefix(ids, other)]
    return ids


@dataclass
class PrewarmResult:
    """What one prewarm did. Tokens; ``ms`` in milliseconds.

    ``kind``: "open" (a path, up to the next user header), "draft" (what every continuation
    of a draft shares) or "prompt" (a whole prompt: a draft as sent now, or a regeneration);
    ``target_tokens``: the prompt tokens asked for; ``ready_tokens``: how many of them the
    live context now holds; ``restored_tokens`` / ``prefilled_tokens``: what this call
    restored from the store and evaluated; ``finished``: False when it stopped early
    (``cancel`` was set); ``skipped``: why nothing was done ("" when it ran).
    """

    kind: str = ""
    target_tokens: int = 0
    ready_tokens: int = 0
    restored_tokens: int = 0
    prefilled_tokens: int = 0
    ms: float = 0.0
    finished: bool = True
    skipped: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ms"] = round(d["ms"], 2)
        return d


class Prewarmer:
    """Prewarms for one :class:`engine.core.Engine`, and what they left ready for the next
    request (for its stats: ``prepared_tokens``, ``typed_tokens``)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._ran = False  # a prewarm ran since the last request
        self._typed_from: int | None = None  # live positions >= this were prefilled from a draft

    @property
    def prepared(self) -> bool:
        """A prewarm ran since the last request: the live context holds what it prepared."""
        return self._ran

    def supported(self) -> str:
        """"" when this engine can be prewarmed, else why not (in words)."""
        if not self.engine.cache.cuts_back:
            return "this model's state cannot be cut back to a prefix"
        return ""

    def run(self, messages: Sequence[ChatMessage], draft: str | None, complete: bool = False,
            cancel: threading.Event | None = None, thinking: str = "") -> PrewarmResult:
        """Bring the live context to the target of ``(messages, draft, complete)`` (see
        :func:`prewarm_target`), stopping between batches once ``cancel`` is set.
        ``thinking``: the chat's thinking setting (``SamplingParams.thinking``), rendered as
        the reply will render it. Never raises for a template or context-size problem: the
        result says it was skipped."""
        t = time.perf_counter()
        res = PrewarmResult(kind="prompt" if draft is None or complete else "draft" if draft else "open")
        if why := self.supported():
            res.skipped = why
            return res
        e = self.engine
        try:
            target = prewarm_target(functools.partial(e.model.prompts.build, thinking=thinking), messages, draft, complete)
        except EngineError as exc:  # a template error: the request will say it in words
            res.skipped = f"the prompt cannot be built: {exc}"
            return res
        res.target_tokens = len(target)
        if len(target) + 1 > e.llama.n_ctx():
            res.skipped = "the prompt does not fit the context"
            return res
        with e.lock:
            self._ran = True
            ready = e.live.reusable(target)
            if ready >= len(target) or len(target) < e.live.min_batch:
                res.ready_tokens = min(ready, len(target))
                res.ms = (time.perf_counter() - t) * 1000
                return res
            if cancel is not None and cancel.is_set():
                res.ready_tokens, res.finished = ready, False
                return res
            stats = GenerationStats()
            e.position(target, stats, record=False)
            if stats.restore_source == "store":
                res.restored_tokens = stats.restored_tokens
            start = e.llama.n_tokens
            if self._typed_from is not None and start <= self._typed_from:
                self._typed_from = None  # the draft's tokens were cut away
            res.finished = self._prefill(target, cancel)
            done = e.llama.n_tokens - start
            res.prefilled_tokens = done
            if draft is not None and draft.strip() and done and self._typed_from is None:
                self._typed_from = start
            res.ready_tokens = e.llama.n_tokens
        res.ms = (time.perf_counter() - t) * 1000
        return res

    def _prefill(self, target: list[int], cancel: threading.Event | None) -> bool:
        e = self.engine
        # Engine.position left at least min_batch tokens, and no batch here is smaller
        for chunk in batches(target[e.llama.n_tokens:], PREWARM_BATCH, e.live.min_batch):
            if cancel is not None and cancel.is_set():
                return False
            e.live.evaluate(chunk)
            e.live.exact_upto = e.live.n_tokens
        return True

    def account(self, stats: GenerationStats) -> dict:
        """After a request: ``{"prepared_tokens", "typed_tokens"}``, the prompt tokens that
        were live before it thanks to prewarms (restored or prefilled in the background),
        and of those the ones prefilled from the draft while the user typed. Resets."""
        prepared = typed = 0
        if self._ran and stats.restore_source == "context":
            prepared = stats.restored_tokens
            if self._typed_from is not None:
                typed = max(0, prepared - self._typed_from)
        self.forget()
        return {"prepared_tokens": prepared, "typed_tokens": typed}

    def forget(self) -> None:
        """The live context changed under us (a request, a cleared cache)."""
        self._ran = False
        self._typed_from = None
