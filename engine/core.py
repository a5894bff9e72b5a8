"""One model, one context, one prefix store: serve a request the fast way.

A request (:meth:`Engine.generate`) goes:

1. build the prompt token ids from the messages (:mod:`engine.chat_template`);
2. find the longest prefix already computed: what the live context holds, or what the
   prefix store holds (token-granular), whichever is longer, but never the whole prompt
   (a stored KV state has no logits, so at least the last token must be evaluated to
   sample the next one; in fact the last two, as a one-token batch would not give the
   same KV bit for bit, see ``docs/architecture.md``);
3. restore it: verify the blocks' checksums, join them into a state blob and hand it to
   ``llama_state_seq_set_data``; any failure clears the sequence and falls back to prefill;
4. prefill the rest in batches with progress, decode with streaming;
5. :meth:`Engine.snapshot` recomputes the reply's KV in one batch, then stores only
   the blocks the store does not hold yet.

Exactness. On the CPU, llama.cpp computes a token's KV bit for bit the same in any batch
of two or more tokens, but not in a batch of one (tests/test_engine.py measures it; flash
attention breaks even the former, so it is off by default). Decoding is one token at a
time, so the KV of a reply is recomputed in a batch before anyone reuses it, and no
prefill batch is ever a single token. Then a restored prefix holds exactly the bytes a
from-scratch prefill would compute, and the reply after it is the same.

Where the pieces are: the live llama.cpp context and its exactness bookkeeping are a
:class:`engine.live_context.LiveContext` (``Engine.live``); how the model's state is found
in, restored from and written to the prefix store is its cache strategy
(``Engine.cache``, chosen by cache mode in :mod:`engine.cache_strategy`: ``DenseBlocks``
for dense attention, ``Checkpointed`` for sliding-window, recurrent and hybrid models,
whose state is partly not cut back to a shorter prefix). This module runs one request
through them: position, prefill, decode, snapshot.
"""

from __future__ import annotations

import ctypes
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from engine import cpu, kv_codec, speculative
from engine.cache_strategy import CacheStrategy, strategy_for
from engine.cache_strategy.base import CUT_CHUNK_BYTES, MIN_RESTORE_TOKENS
from engine.chat_engine import ChatEngine, GenerationResult, GenerationStats, ProgressFn, TokenFn
from engine.chat_template import ChatMessage
from engine.decoding import decode_reply
from engine.errors import ContextOverflowError, EngineError
from engine.fingerprint import cached_file_digest, fingerprint, kernels
from engine.live_context import MIN_BATCH, LiveContext, batches
from engine.model import LoadedModel
from engine.reasoning import ReasoningSteer, grammar_from_env
from engine.settings import EngineSettings, SamplingParams
from storage.errors import StorageFullError
from storage.prefix_store import PrefixStore, StoreError

__all__ = [  # the names importers take from here
    "CUT_CHUNK_BYTES", "MIN_BATCH", "MIN_RESTORE_TOKENS", "CacheStrategy", "ChatEngine", "Engine", "GenerationResult",
    "GenerationStats", "ProgressFn", "TokenFn",
]

log = logging.getLogger(__name__)

PREFAULT_BYTES = 64 * 1024 * 1024  # restore buffer paged in at load (model load is not TTFT)


def _prefaulted(size: int) -> np.ndarray:
    """A uint8 buffer of ``size`` bytes with every page touched (mapped now, not on first use)."""
    buf = np.zeros(size, dtype=np.uint8)
    buf[::4096] = 1
    return buf


def _keep_large_allocations_mapped() -> None:
    """Make glibc serve megabyte-sized buffers (checkpoint payloads, grown state buffers)
    from the heap and keep freed memory mapped. By default each gets fresh mmap'd pages
    and pays a page fault per 4 KiB on first touch: when block payloads were still read
    into memory from SQLite, restoring 48 MB ran at ~1.1 GB/s instead of ~2.1 GB/s
    (`branchwise bench`). Other platforms' allocators already reuse such memory."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum
    libc.mallopt(m_trim_threshold, 512 * 1024 * 1024)


class Engine:
    """A loaded model with its prefix store (a :class:`engine.chat_engine.ChatEngine`).

    Args:
        model_path: a GGUF file.
        settings: context and KV settings.
        store: the prefix store, or None to run without one.
        progress: ``progress(done_bytes, total_bytes)`` while the model file is hashed.
        crash_verdict: keep weight repacking off (see engine/model.py ``LoadedModel``).

    Raises:
        ModelLoadError: the model cannot be loaded (the message says why, in words).
    """

    is_remote = False

    def __init__(
        self,
        model_path: str | Path,
        settings: EngineSettings | None = None,
        store: PrefixStore | None = None,
        progress: Callable[[int, int], None] | None = None,
        crash_verdict: bool = False,
    ):
        self.settings = settings or EngineSettings()
        _keep_large_allocations_mapped()
        self.model = LoadedModel(model_path, self.settings, crash_verdict=crash_verdict)
        self.llama = self.model.llama
        self.store = store if self.model.cache_supported else None
        self.fingerprint = b""
        self.layout: kv_codec.KvLayout | None = None
        if self.store is not None:
            try:
                digest = cached_file_digest(self.model.path, self.store, progress)
                self.fingerprint = fingerprint(
                    digest, llama_cpp.__version__, self.settings.type_k, self.settings.type_v,
                    self.settings.flash_attn, self.store.block_size,
                    kernels(self.model.repack.repack, cpu.system_info()),
                )
                text = self.store.layout(self.fingerprint)
                self.layout = kv_codec.KvLayout.from_json(json.loads(text)) if text else None
            except (StoreError, StorageFullError) as exc:
                log.warning("running without the prefix store: %s", exc)
                self.store = None
            except (ValueError, TypeError) as exc:  # a damaged layout row: relearn it
                log.warning("ignoring a damaged KV layout in the store: %s", exc)
                self.layout = None
        buffer = np.empty(0, dtype=np.uint8)
        cut_buffer = np.empty(0, dtype=np.uint8)
        if self.store is not None:  # page the state buffer in now, not during a TTFT or snapshot
            per_token = self.layout.bytes_per_token if self.layout else self.model.facts.kv_bytes_per_token
            size = min(self.llama.n_ctx() * per_token, PREFAULT_BYTES)
            buffer = _prefaulted(size)
            # ... and the buffer the snapshot cuts block payloads into
            cut_buffer = _prefaulted(min(size, CUT_CHUNK_BYTES))
        self.lock = threading.RLock()  # generate() holds it while calling snapshot()
        self.live = LiveContext(self.llama, buffer, self.model.min_batch)
        self.mode = self.model.cache_mode
        self.kind = self.mode.state_kind
        self.cache = strategy_for(self.mode)(self, cut_buffer)
        self.grammar = grammar_from_env()  # internal: a GBNF every reply is sampled with (tests)
        self.steer: ReasoningSteer | None = None
        # Speculative decoding cuts rejected drafts off the live context: only for models
        # whose state can be cut back (dense attention).
        setting = self.settings.speculative  # parsed by EngineSettings
        self.speculation: speculative.Speculation | None = None
        if setting != speculative.NONE and self.cache.cuts_back:
            try:
                self.speculation = speculative.Speculation(setting, self.llama, self.settings.threads)
            except EngineError:
                self.model.close()
                raise

    # -- prompts ---------------------------------------------------------------------

    def model_name(self) -> str:
        """The GGUF's ``general.name`` (its file name when it has none)."""
        return self.model.facts.name

    def prompt_tokens(self, messages: Sequence[ChatMessage], thinking: str = "") -> list[int]:
        """The prompt token ids for ``messages`` (ends with the assistant header);
        ``thinking`` a chat's thinking setting (``SamplingParams.thinking``)."""
        return self.model.prompts.build(messages, thinking=thinking)

    def message_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Tokens each message takes in the prompt of ``messages`` (same order): its content
        (an assistant reply's saved ids, else its text tokenized) plus an equal share of the
        chat template's tokens (role markers, BOS, the assistant header). The sum is the
        prompt length up to token merges across message boundaries."""
        if not messages:
            return []
        contents = [len(m.token_ids) if m.role == "assistant" and m.token_ids is not None
                    else len(self.model.tokenize(m.content, False)) for m in messages]
        template = self.model.prompts.template_tokens([m.role for m in messages])
        share, extra = divmod(template, len(messages))
        return [c + share + (1 if i < extra else 0) for i, c in enumerate(contents)]

    def cached_tokens(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = False) -> tuple[int, int]:
        """``(stored, total)``: how many leading prompt tokens of ``messages`` the prefix
        store could restore, out of how many (for the tree panel)."""
        ids = self.model.prompts.build(messages, add_generation_prompt)
        if self.store is None or not ids:
            return 0, len(ids)
        try:
            return self.cache.coverage(ids), len(ids)
        except StoreError:
            return 0, len(ids)

    # -- one request -------------------------------------------------------------------

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
        on_reasoning: TokenFn | None = None,
        thinking_budget: int | None = None,
        tools: list[dict] | None = None,
        grammar: str | None = None,
        reply_prefix: Sequence[int] | None = None,
        record: bool = True,
    ) -> GenerationResult:
        """Generate the assistant's reply to ``messages``.

        ``use_cache=False`` neither reads nor writes the prefix store nor reuses the live
        context: every prompt token is prefilled. With ``snapshot`` the new KV blocks are
        stored before returning (their cost is in ``stats.snapshot_ms``). ``tools`` (OpenAI
        function objects) go to the chat template (``PromptBuilder.build``); ``grammar``
        (GBNF text, e.g. ``engine.tool_grammar.tool_call_grammar``) constrains sampling.

        A reasoning model's thinking (``engine/reasoning.py``) streams to ``on_reasoning``
        and its answer to ``on_token``; ``thinking_budget`` (tokens) closes the thinking
        when that many were generated and lets the model answer (None: no limit, or
        ``sampling.thinking_budget``); ``sampling.thinking`` goes to the chat template.

        ``reply_prefix``: token ids the assistant's reply already holds (Continue a reply
        that was stopped or hit max tokens): the prompt is the messages' prompt plus these
        ids, and the result holds only the tokens generated after them. ``record`` False
        leaves the store's statistics and LRU marks alone (a background job, such as the
        chat title of ``engine/title.py``).

        Raises:
            ContextOverflowError: the prompt does not fit n_ctx.
            TemplateError: the chat template cannot render these messages.
        """
        sampling = sampling or SamplingParams()
        with self.lock:
            t0 = time.perf_counter()
            stats = GenerationStats()
            prompt = (self.model.prompts.build(messages, True, tools, sampling.thinking) if tools
                      else self.prompt_tokens(messages, sampling.thinking))
            if thinking_budget is None:
                thinking_budget = sampling.thinking_budget
            if reply_prefix:
                prompt = prompt + [int(t) for t in reply_prefix]
            n_ctx = self.llama.n_ctx()
            stats.prompt_tokens = len(prompt)
            if len(prompt) + 1 > n_ctx:
                raise ContextOverflowError(len(prompt), n_ctx)
            if not prompt:
                raise EngineError("There is nothing to answer: the conversation is empty.")

            self.cache.position(prompt, use_cache, stats, on_progress, record)
            if not self._prefill(prompt, stats, on_progress, cancel, use_cache):
                stats.finish_reason = "cancelled"  # stopped while reading the prompt
                return GenerationResult("", [], stats, prompt)
            model = self.model
            closing = (model.tokenize(model.reasoning.closing_text, True)
                       if thinking_budget is not None and model.reasoning.closing_text else [])
            steer = self.steer = ReasoningSteer(model.reasoning, model.reasoning_specials, thinking_budget, closing)
            try:
                text, ids = self._decode(sampling, stats, t0, steer.wrap(on_token, on_reasoning), cancel, grammar)
                steer.finish()
            finally:
                self.steer = None
            split = steer.splitter
            reasoning = split.reasoning
            if reasoning is not None:  # else the answer is the whole reply, unchanged
                text = split.answer
                stats.reasoning_tokens, stats.reasoning_ms = split.reasoning_tokens, split.reasoning_ms
            if snapshot and use_cache:
                self.snapshot(stats)
            return GenerationResult(text, ids, stats, prompt, reasoning)

    def position(self, prompt: list[int], stats: GenerationStats, *, use_cache: bool = True,
                 on_progress: ProgressFn | None = None, record: bool = True) -> None:
        """Bring the live context to the longest known prefix of ``prompt`` (all but its last
        ``min_batch`` tokens): the live context or the prefix store, whichever is longer, by
        the model's cache strategy; ``stats`` gets what was restored. ``record`` False
        leaves the store's statistics and LRU marks alone (a background prewarm,
        ``engine/prewarm.py``: only a sent turn counts). Never raises for cache problems."""
        with self.lock:
            self.cache.position(prompt, use_cache, stats, on_progress, record)

    def _prefill(self, prompt: list[int], stats: GenerationStats, on_progress, cancel,
                 use_cache: bool = True) -> bool:
        """Evaluate the prompt tokens after the restored prefix, a batch at a time.
        Returns False when ``cancel`` was set between batches (the prompt is unfinished).

        The cache strategy may stop it once to hold a partial state in memory
        (``Checkpointed.hold_at``: for the store, and for recomputing the reply)."""
        t = time.perf_counter()
        start = self.llama.n_tokens
        rest = prompt[start:]
        stats.prefilled_tokens = len(rest)
        hold_at = self.cache.hold_at(prompt, start, use_cache)
        k = len(rest) if hold_at is None else hold_at - start
        segments = [rest[:k], rest[k:]]
        done = 0
        for i, segment in enumerate(segments):
            if i == 1 and hold_at is not None:
                self.cache.hold()
            for chunk in batches(segment, self.llama.n_batch, self.live.min_batch):
                if cancel is not None and cancel.is_set():
                    self.live.exact_upto = self.llama.n_tokens
                    stats.prefilled_tokens = done
                    stats.prefill_ms = (time.perf_counter() - t) * 1000
                    return False
                if on_progress:
                    on_progress("prefill", done, len(rest))
                self.live.evaluate(chunk)
                done += len(chunk)
        if on_progress and rest:
            on_progress("prefill", len(rest), len(rest))
        self.live.exact_upto = self.llama.n_tokens if len(prompt) >= self.live.min_batch else 0
        stats.prefill_ms = (time.perf_counter() - t) * 1000
        return True

    def _decode(self, sp: SamplingParams, stats: GenerationStats, t0: float, on_token, cancel,
                grammar: str | None = None) -> tuple[str, list[int]]:
        """Sample the reply (``engine.decoding.decode_reply``: one token a step, or verified
        drafts with speculative decoding on; ``grammar`` GBNF text constrains it)."""
        return decode_reply(self, sp, stats, t0, on_token, cancel, grammar)

    # -- snapshot --------------------------------------------------------------------

    def snapshot(self, stats: GenerationStats | None = None) -> int:
        """Store the blocks of the live context the prefix store lacks; returns bytes written.

        Never raises for cache problems (a full disk or a damaged store only means the
        next resume prefills more); they are logged.
        """
        if self.store is None:
            return 0
        with self.lock:
            return self.cache.snapshot(stats)


    # -- the live context ----------------------------------------------------------------

    def reset_context(self) -> None:
        """Forget the live context (the next request restores from the store or prefills)."""
        with self.lock:
            self.live.clear()

    def close(self) -> None:
        """Free the model, its context and a draft model."""
        if self.speculation is not None:
            self.speculation.close()
            self.speculation = None
        self.model.close()

