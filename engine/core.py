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

Sliding-window, recurrent and hybrid models (:class:`engine.model.CacheMode`) keep a part
of their state that cannot be cut back to a shorter prefix. The engine holds that part in
memory at ``len(prompt) - MIN_BATCH`` while prefilling (so a regenerate restores there and
the reply's KV can be recomputed in one batch from a state before the reply: a recurrent
state cannot be rewound), and stores it as a checkpoint there and after the recomputed
reply. A restored sliding window is padded with zero cells from position 0, so every cell
sits at the index a from-scratch prefill gives it (see ``kv_codec.assemble``).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np

from engine import cpu, kv_codec
from engine.chat_template import ChatMessage
from engine.errors import ContextOverflowError, EngineError
from engine.fingerprint import cached_file_digest, fingerprint
from engine.model import LoadedModel
from engine.reasoning import ReasoningSteer, grammar_from_env
from engine.settings import EngineSettings, SamplingParams
from storage.errors import StorageFullError
from storage.prefix_store import CheckpointRef, NewBlock, PrefixMatch, PrefixStore, StoreError

log = logging.getLogger(__name__)

PREFAULT_BYTES = 64 * 1024 * 1024  # restore buffer paged in at load (model load is not TTFT)
MIN_BATCH = 2  # never evaluate a prompt batch of one token (see the module docstring)

# Below this many tokens a restore is not worth its fixed cost (a SQLite query, a state
# blob, a llama_state_seq_set_data call: about 2 ms, while prefilling a handful of tokens
# costs one batched forward pass of similar length). Measured with `branchwise bench`.
MIN_RESTORE_TOKENS = 16

ProgressFn = Callable[[str, int, int], None]  # (phase, done, total); phase "restore" | "prefill"
TokenFn = Callable[[str, int], None]  # (text delta, token id)
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (include/llama.h)


@dataclass
class _Checkpoint:
    """A partial state held in memory: after the first ``n`` tokens of the live context."""

    n: int
    tokens: list[int]
    data: bytes


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

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("restore_ms", "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "recompute_ms",
                  "reasoning_ms"):
            d[k] = round(d[k], 2)
        return d


@dataclass
class GenerationResult:
    """``text`` is the answer; ``reasoning`` the thinking before it (None: the model wrote
    none, and ``text`` is the whole reply); ``token_ids`` every generated id, both parts."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)
    reasoning: str | None = None


class Engine:
    """A loaded model with its prefix store.

    Args:
        model_path: a GGUF file.
        settings: context and KV settings.
        store: the prefix store, or None to run without one.
        progress: ``progress(done_bytes, total_bytes)`` while the model file is hashed.
        crash_verdict: keep weight repacking off (see engine/model.py ``LoadedModel``).

    Raises:
        ModelLoadError: the model cannot be loaded (the message says why, in words).
    """

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
                )
                text = self.store.layout(self.fingerprint)
                self.layout = kv_codec.KvLayout.from_json(json.loads(text)) if text else None
            except (StoreError, StorageFullError) as exc:
                log.warning("running without the prefix store: %s", exc)
                self.store = None
            except (ValueError, TypeError) as exc:  # a damaged layout row: relearn it
                log.warning("ignoring a damaged KV layout in the store: %s", exc)
                self.layout = None
        self._buffer = np.empty(0, dtype=np.uint8)
        self._cut_buffer = np.empty(0, dtype=np.uint8)
        if self.store is not None:  # page the state buffer in now, not during a TTFT or snapshot
            per_token = self.layout.bytes_per_token if self.layout else self.model.facts.kv_bytes_per_token
            size = min(self.llama.n_ctx() * per_token, PREFAULT_BYTES)
            self._buffer = np.zeros(size, dtype=np.uint8)
            self._buffer[::4096] = 1
            # ... and the buffer the snapshot cuts block payloads into
            self._cut_buffer = np.zeros(min(size, CUT_CHUNK_BYTES), dtype=np.uint8)
            self._cut_buffer[::4096] = 1
        self._lock = threading.RLock()  # generate() holds it while calling snapshot()
        # Leading live-context tokens whose KV was computed in batches of >= 2 tokens
        # (and so may be reused or stored); decoded tokens are not, until recomputed.
        self._exact_upto = 0
        self._logits_at = -1  # live position whose logits the context holds (_eval), or -1
        self.mode = self.model.cache_mode
        self.kind = self.mode.state_kind
        self._pending: _Checkpoint | None = None  # the checkpoint the reply's recompute starts from
        self._swa_valid_from = 0  # sliding-window KV below this position is zero padding
        self.cache_note = ""  # set when the model's state turned out not to be storable
        self._want_checkpoints = True
        self.grammar = grammar_from_env()  # internal: a GBNF every reply is sampled with (tests)
        self._steer: ReasoningSteer | None = None

    # -- prompts ---------------------------------------------------------------------

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt token ids for ``messages`` (ends with the assistant header)."""
        return self.model.prompts.build(messages)

    def message_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Tokens each message takes in the prompt of ``messages`` (same order): its content
        (an assistant reply's saved ids, else its text tokenized) plus an equal share of the
        chat template's tokens (role markers, BOS, the assistant header). The sum is the
        prompt length up to token merges across message boundaries."""
        if not messages:
            return []
        contents = [len(m.token_ids) if m.role == "assistant" and m.token_ids is not None
                    else len(self.model.tokenize(m.content, False)) for m in messages]
        template = len(self.prompt_tokens([ChatMessage(m.role, "") for m in messages]))
        share, extra = divmod(template, len(messages))
        return [c + share + (1 if i < extra else 0) for i, c in enumerate(contents)]

    def cached_tokens(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = False) -> tuple[int, int]:
        """``(stored, total)``: how many leading prompt tokens of ``messages`` the prefix
        store could restore, out of how many (for the tree panel)."""
        ids = self.model.prompts.build(messages, add_generation_prompt)
        if self.store is None or not ids:
            return 0, len(ids)
        try:
            if not self.mode.checkpoints:
                return self.store.coverage(self.fingerprint, ids), len(ids)
            bound = len(ids) if self.kind == kv_codec.StateKind.RECURRENT else self.store.coverage(self.fingerprint, ids)
            ref = self.store.lookup_checkpoint(self.fingerprint, ids, bound, count=False)
            return (ref.n_tokens if ref else 0), len(ids)
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
    ) -> GenerationResult:
        """Generate the assistant's reply to ``messages``.

        ``use_cache=False`` neither reads nor writes the prefix store nor reuses the live
        context: every prompt token is prefilled. With ``snapshot`` the new KV blocks are
        stored before returning (their cost is in ``stats.snapshot_ms``).

        A reasoning model's thinking (``engine/reasoning.py``) streams to ``on_reasoning``
        and its answer to ``on_token``; ``thinking_budget`` (tokens) closes the thinking
        when that many were generated and lets the model answer (None: no limit).

        Raises:
            ContextOverflowError: the prompt does not fit n_ctx.
            TemplateError: the chat template cannot render these messages.
        """
        sampling = sampling or SamplingParams()
        with self._lock:
            t0 = time.perf_counter()
            stats = GenerationStats()
            prompt = self.prompt_tokens(messages)
            n_ctx = self.llama.n_ctx()
            stats.prompt_tokens = len(prompt)
            if len(prompt) + 1 > n_ctx:
                raise ContextOverflowError(len(prompt), n_ctx)
            if not prompt:
                raise EngineError("There is nothing to answer: the conversation is empty.")

            self._want_checkpoints = use_cache
            self._position(prompt, use_cache, stats, on_progress)
            if not self._prefill(prompt, stats, on_progress, cancel):
                stats.finish_reason = "cancelled"  # stopped while reading the prompt
                return GenerationResult("", [], stats, prompt)
            model = self.model
            closing = (model.tokenize(model.reasoning.closing_text, True)
                       if thinking_budget is not None and model.reasoning.closing_text else [])
            steer = self._steer = ReasoningSteer(model.reasoning, model.reasoning_specials, thinking_budget, closing)
            try:
                text, ids = self._decode(sampling, stats, t0, steer.wrap(on_token, on_reasoning), cancel)
                steer.finish()
            finally:
                self._steer = None
            split = steer.splitter
            reasoning = split.reasoning
            if reasoning is not None:  # else the answer is the whole reply, unchanged
                text = split.answer
                stats.reasoning_tokens, stats.reasoning_ms = split.reasoning_tokens, split.reasoning_ms
            if snapshot and use_cache:
                self.snapshot(stats)
            return GenerationResult(text, ids, stats, prompt, reasoning)

    def _position(self, prompt: list[int], use_cache: bool, stats: GenerationStats, on_progress,
                  record: bool = True) -> None:
        """Bring the context to the longest known prefix of ``prompt`` (all but its last
        ``MIN_BATCH`` tokens): the live context or the prefix store, whichever is longer.
        ``record`` False leaves the store's statistics and LRU marks alone (a background
        prewarm, ``engine/prewarm.py``: only a sent turn counts)."""
        if self.mode.checkpoints:
            return self._position_checkpointed(prompt, use_cache, stats, on_progress)
        t = time.perf_counter()
        n = len(prompt)
        if (use_cache and self._logits_at == n == self.llama.n_tokens and self._exact_upto >= n
                and _common_prefix(self.llama.input_ids[:n], prompt) == n):
            # The live context is this very prompt, ending in a batch of >= MIN_BATCH tokens
            # (a prewarm of the message as sent): its logits are the prompt's, nothing is
            # prefilled, and the first token is sampled at once.
            stats.restore_source = "context"
            return self._positioned(stats, t, n, n, record)
        # A snapshot has no logits, and no batch may be a single token: leave at least
        # MIN_BATCH prompt tokens to prefill.
        limit = max(len(prompt) - MIN_BATCH, 0)
        live = 0
        if use_cache:
            held = self.llama.input_ids[: self.llama.n_tokens]
            live = min(_common_prefix(held, prompt), limit, self._exact_upto)
        match = PrefixMatch()
        if use_cache and self.store is not None and self.layout is not None:
            try:
                match = self.store.lookup(self.fingerprint, prompt[:limit], count=record)
            except StoreError:
                match = PrefixMatch()
        restored = 0
        if match.n_tokens >= max(live + 1, MIN_RESTORE_TOKENS):
            if on_progress:
                on_progress("restore", 0, match.n_tokens)
            restored, dropped = self._restore(match)
            stats.cache_blocks_dropped = dropped
            if not restored and self.llama.n_tokens == 0:
                live = 0  # a failed restore cleared the live context
        if restored > live:
            stats.restore_source = "store"
            self._set_tokens(prompt[:restored])
            self._exact_upto = restored
        elif live > 0 and self._truncate(live):
            restored = live
            stats.restore_source = "context"
            self.llama.n_tokens = live
            self._exact_upto = live
        else:
            restored = 0
            self._clear()
        self._positioned(stats, t, restored, len(prompt), use_cache and record)

    def _positioned(self, stats: GenerationStats, t: float, restored: int, n_prompt: int, count: bool) -> None:
        """After positioning for a prompt of ``n_prompt`` tokens that began at
        ``perf_counter()`` ``t``: the stats (``restored`` tokens, ms), and with ``count`` the
        store's restored/prefilled statistics (best effort)."""
        stats.restored_tokens = restored
        stats.restore_ms = (time.perf_counter() - t) * 1000
        if self.store is not None and count:
            with contextlib.suppress(StoreError, StorageFullError):
                self.store.record_restore(restored, n_prompt - restored)

    def _restore(self, match: PrefixMatch, ref: CheckpointRef | None = None) -> tuple[int, int]:
        """Restore the blocks of ``match`` (and, for a model with checkpoints, the
        checkpoint ``ref`` after them) into sequence 0. Returns ``(tokens restored, blocks
        dropped)``; ``(0, n)`` when anything fails (the sequence is then empty).

        The byte path: each block file is mapped and its checksum verified in place
        (``PrefixStore.read``), ``kv_codec.assemble`` copies the bytes once into the
        reusable state buffer, and ``llama_state_seq_set_data`` copies them into the KV
        cache."""
        assert self.store is not None
        recurrent = self.kind == kv_codec.StateKind.RECURRENT
        try:
            data = self.store.read_checkpoint(ref) if ref is not None else None
            payloads, dropped = ([], 0) if recurrent else self.store.read(match)
        except StoreError:
            return 0, 0
        if ref is not None and data is None:
            return 0, dropped
        n = sum(use for _, _, use in payloads)
        try:
            if ref is not None:
                if not recurrent and n != ref.n_tokens:
                    return 0, dropped
                n = ref.n_tokens
                if kv_codec.partial_tokens(self.kind, data) != n:
                    raise kv_codec.UnsupportedStateError("the checkpoint is not at the position it is stored under")
            if n < MIN_RESTORE_TOKENS:
                return 0, dropped
            kind = self.kind if ref is not None else kv_codec.StateKind.DENSE
            blob = kv_codec.assemble(kind, self.layout, payloads, data, buffer=self._buffer)
        except (ValueError, kv_codec.UnsupportedStateError) as exc:
            log.warning("stored KV does not fit (%s); prefilling instead", exc)
            return 0, dropped
        del payloads  # unmaps the block files
        if blob.base is not self._buffer and blob is not self._buffer:
            self._buffer = blob  # grown: keep the larger buffer for the next restore
        if not self._apply(blob):
            return 0, dropped
        if ref is not None:
            self._pending = _Checkpoint(n, [], data)
            if self.kind == kv_codec.StateKind.ISWA:
                self._swa_valid_from = kv_codec.partial_start(self.kind, data)
        return n, dropped

    def _apply(self, blob: np.ndarray) -> bool:
        """Replace sequence 0 with the state ``blob``; on refusal the sequence is left empty.
        The buffers are not zeroed first (a 94 MB memset at 4,096 cells of the default
        model, measured as 8 ms of a 20 ms set_data by `branchwise bench`): the state
        overwrites every cell it uses."""
        self._clear(data=False)
        ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data(self.llama.ctx, ptr, blob.nbytes, 0) == blob.nbytes:
            return True
        log.warning("llama_state_seq_set_data rejected a %d-byte state; prefilling instead", blob.nbytes)
        self._clear()
        return False

    def _prefill(self, prompt: list[int], stats: GenerationStats, on_progress, cancel) -> bool:
        """Evaluate the prompt tokens after the restored prefix, a batch at a time.
        Returns False when ``cancel`` was set between batches (the prompt is unfinished).

        For a model with checkpoints the partial state is held in memory (for the store,
        and for recomputing the reply) at ``len(prompt) - MIN_BATCH``, where a regenerate
        restores, or at ``len(prompt)`` when stopping there would need a one-token batch."""
        t = time.perf_counter()
        start = self.llama.n_tokens
        rest = prompt[start:]
        stats.prefilled_tokens = len(rest)
        hold_at = None
        if self.mode.checkpoints and self.store is not None and self._want_checkpoints and not self.cache_note:
            at = max(len(prompt) - MIN_BATCH, 0)
            hold_at = at if (at - start >= MIN_BATCH or at == start) else len(prompt)
        k = len(rest) if hold_at is None else hold_at - start
        segments = [rest[:k], rest[k:]]
        done = 0
        for i, segment in enumerate(segments):
            if i == 1 and hold_at is not None:
                self._hold_checkpoint()
            for chunk in _batches(segment, self.llama.n_batch):
                if cancel is not None and cancel.is_set():
                    self._exact_upto = self.llama.n_tokens
                    stats.prefilled_tokens = done
                    stats.prefill_ms = (time.perf_counter() - t) * 1000
                    return False
                if on_progress:
                    on_progress("prefill", done, len(rest))
                self._eval(chunk)
                done += len(chunk)
        if on_progress and rest:
            on_progress("prefill", len(rest), len(rest))
        self._exact_upto = self.llama.n_tokens if len(prompt) >= MIN_BATCH else 0
        stats.prefill_ms = (time.perf_counter() - t) * 1000
        return True

    def _decode(self, sp: SamplingParams, stats: GenerationStats, t0: float, on_token, cancel) -> tuple[str, list[int]]:
        llama = self.llama
        cpu.debug_crash("before-first-token")
        llama.set_seed(sp.seed if sp.seed is not None else random.getrandbits(31))
        sampler = llama._init_sampler(
            top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, temp=sp.temperature,
            repeat_penalty=sp.repeat_penalty, grammar=self.grammar,
        )
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        stop = self.model.prompts.stop_matcher()  # None unless the prompt format needs stop strings
        ids: list[int] = []
        parts: list[str] = []
        n_ctx = llama.n_ctx()
        t_first = None
        stats.finish_reason = "length"
        while len(ids) < sp.max_tokens:
            if cancel is not None and cancel.is_set():
                stats.finish_reason = "cancelled"
                break
            forced = self._steer.forced() if self._steer is not None else None  # a thinking budget ran out
            token = sampler.sample(llama._ctx, -1) if forced is None else forced
            if forced is not None:
                sampler.accept(forced)
            if t_first is None:
                t_first = time.perf_counter()
                stats.ttft_ms = (t_first - t0) * 1000
            if self.model.is_end_of_turn(token):
                stats.finish_reason = "stop"
                break
            ids.append(token)
            delta = decoder.decode(self.model.token_bytes(token))
            if stop is not None:  # hold back what may be a stop string's start
                delta = stop.feed(delta)
            parts.append(delta)
            if on_token:
                on_token(delta, token)
            if stop is not None and stop.hit:
                ids = self._end_at_stop(stop, ids)
                stats.finish_reason = "stop"
                break
            if len(ids) >= sp.max_tokens:
                break
            if llama.n_tokens + 1 >= n_ctx:
                stats.finish_reason = "context"
                break
            self._eval([token])
        # An incomplete UTF-8 sequence at the end (a reply cut by max_tokens) is dropped,
        # not shown as U+FFFD; the token ids keep it.
        if stop is not None and not stop.hit and (tail := stop.flush()):
            parts.append(tail)
            if on_token:
                on_token(tail, ids[-1])
        sampler.close()
        stats.generated_tokens = len(ids)
        if t_first is not None and len(ids) > 1:
            stats.decode_tokens_per_s = (len(ids) - 1) / max(time.perf_counter() - t_first, 1e-9)
        return "".join(parts), ids

    def _end_at_stop(self, stop, ids: list[int]) -> list[int]:
        """The reply's ids once ``stop`` met a stop string: those that spell the text before
        it (``StopMatcher.cut_ids``); the live context drops the KV of the rest."""
        kept, n_evaluated = stop.cut_ids(ids, self.model.tokenize)
        n = self.llama.n_tokens - (len(ids) - 1) + n_evaluated  # every id but the last was evaluated
        if self._truncate(n):
            self.llama.n_tokens = n
        else:
            self._clear()
        return kept

    # -- snapshot --------------------------------------------------------------------

    def snapshot(self, stats: GenerationStats | None = None) -> int:
        """Store the blocks of the live context the prefix store lacks; returns bytes written.

        Never raises for cache problems (a full disk or a damaged store only means the
        next resume prefills more); they are logged.
        """
        if self.store is None:
            return 0
        with self._lock:
            return self._snapshot(stats)

    def _snapshot(self, stats: GenerationStats | None) -> int:
        if self.mode.checkpoints:
            return self._snapshot_checkpointed(stats)
        t = time.perf_counter()
        self._recompute_decoded()
        if stats is not None:
            stats.recompute_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        written = 0
        tokens = np.asarray(self.llama.input_ids[: self._exact_upto], dtype=np.int32)
        try:
            missing, chain = self.store.plan(self.fingerprint, tokens)
            if missing or (self.layout is None and len(tokens)):
                state = kv_codec.parse(self._state_blob())
                if state.n_tokens != self.llama.n_tokens or len(tokens) > state.n_tokens:
                    raise kv_codec.UnsupportedStateError(
                        f"state holds {state.n_tokens} tokens, expected {len(tokens)}"
                    )
                if self.layout != state.layout:
                    self.layout = state.layout
                    self.store.register_model(
                        self.fingerprint, json.dumps(state.layout.to_json()), self.model.facts.name
                    )
                written = self._store_blocks(state, missing, chain)
            else:
                self.store.put(self.fingerprint, [], active_path=chain)
        except kv_codec.UnsupportedStateError as exc:
            log.warning("KV state not stored: %s", exc)
        except (StorageFullError, StoreError) as exc:
            log.warning("KV state not stored: %s", exc)
        if stats is not None:
            stats.snapshot_ms = (time.perf_counter() - t) * 1000
            stats.snapshot_bytes_written = written
        return written

    def _store_blocks(self, state: kv_codec.ParsedState, missing: list[NewBlock], chain: list[bytes]) -> int:
        """Cut the ``missing`` blocks out of ``state`` into the reused cut buffer and store
        them, a chunk (one transaction) at a time; returns the bytes written."""
        per_token = state.layout.bytes_per_token
        need = max(min(CUT_CHUNK_BYTES, sum(b.n_tokens for b in missing) * per_token),
                   max((b.n_tokens for b in missing), default=0) * per_token)  # at least one block
        if self._cut_buffer.nbytes < need:
            self._cut_buffer = np.empty(need, dtype=np.uint8)
        written = 0
        for chunk in _cut(state, missing, self._cut_buffer):
            written += self.store.put(self.fingerprint, chunk, active_path=chain)
        if not missing:
            self.store.put(self.fingerprint, [], active_path=chain)
        return written

    def _recompute_decoded(self) -> None:
        """Re-prefill the tokens decoded one at a time, in batches of >= 2 tokens, so the
        live KV is what a from-scratch prefill computes (see the module docstring)."""
        n = self.llama.n_tokens
        if self._exact_upto >= n:
            return
        keep = max(min(self._exact_upto, n - MIN_BATCH), 0)
        tokens = list(self.llama.input_ids[keep:n])
        if not self._truncate(keep):
            self._clear()
            keep, tokens = 0, list(self.llama.input_ids[:n])
        self.llama.n_tokens = keep
        for chunk in _batches(tokens, self.llama.n_batch):
            self._eval(chunk)
        self._exact_upto = self.llama.n_tokens if self.llama.n_tokens >= MIN_BATCH else 0

    def _state_blob(self) -> np.ndarray:
        """The live sequence's state blob, written into the reusable restore buffer (its
        pages are already mapped: a fresh 48 MB array costs ~60 ms of page faults here)."""
        ctx = self.llama.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        if self._buffer.nbytes < size:
            self._buffer = np.empty(size, dtype=np.uint8)
        buf = self._buffer[:size]
        got = llama_cpp.llama_state_seq_get_data(ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, 0)
        if got != size:
            raise kv_codec.UnsupportedStateError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return buf

    # -- models with checkpoints (sliding-window, recurrent, hybrid) -------------------
    # Their state is two parts (engine/kv_codec.py StateKind): KV that can be cut at any
    # token goes into the shared blocks as for a dense model; the rest (a sliding window,
    # a recurrent state) is stored whole as a checkpoint at message boundaries, keyed by
    # the block chain's hash there. A request restores the deepest checkpoint at or before
    # the longest stored prefix with the blocks below it, then prefills the rest.

    def _position_checkpointed(self, prompt: list[int], use_cache: bool, stats: GenerationStats,
                               on_progress) -> None:
        t = time.perf_counter()
        limit = max(len(prompt) - MIN_BATCH, 0)
        live = 0
        if use_cache:
            held = self.llama.input_ids[: self.llama.n_tokens]
            live = min(_common_prefix(held, prompt), limit, self._exact_upto)
            if live and not self._can_rewind(live):
                live = 0
        ref: CheckpointRef | None = None
        match = PrefixMatch()
        if use_cache and self.store is not None and not self.cache_note:
            try:
                if self.kind == kv_codec.StateKind.RECURRENT:
                    bound = limit
                elif self.layout is not None:
                    match = self.store.lookup(self.fingerprint, prompt[:limit])
                    bound = match.n_tokens
                else:
                    bound = 0
                if bound > live:
                    ref = self.store.lookup_checkpoint(self.fingerprint, prompt, bound)
            except StoreError:
                ref = None
        restored = 0
        if ref is not None and ref.n_tokens >= max(live + 1, MIN_RESTORE_TOKENS):
            if on_progress:
                on_progress("restore", 0, ref.n_tokens)
            restored, dropped = self._restore(match.truncated(ref.n_tokens), ref)
            stats.cache_blocks_dropped = dropped
            if not restored and self.llama.n_tokens == 0:
                live = 0
        if restored > live:
            stats.restore_source = "store"
            stats.checkpoint_tokens = restored
            self._set_tokens(prompt[:restored])
            self._exact_upto = restored
        elif live > 0 and self._rewind_live(live):
            restored = live
            stats.restore_source = "context"
            self.llama.n_tokens = live
            self._exact_upto = live
        else:
            restored = 0
            self._clear()
        stats.cache_note = self.cache_note
        self._positioned(stats, t, restored, len(prompt), use_cache)

    def _can_rewind(self, n: int) -> bool:
        """Whether cutting the live context back to ``n`` tokens keeps it exact: a
        recurrent state cannot be rewound at all; a sliding window only while the cells the
        next token attends to are still there and are not the zero padding of a restore."""
        if n == self.llama.n_tokens:
            return True
        if self.kind != kv_codec.StateKind.ISWA:
            return False
        need_from = max(0, n - self.model.n_swa + 1)
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        return need_from >= self._swa_valid_from and llama_cpp.llama_memory_seq_pos_min(mem, 0) <= need_from

    def _rewind_live(self, n: int) -> bool:
        """Cut the live context back to ``n`` tokens when :meth:`_can_rewind` allows it."""
        return self._can_rewind(n) and (n == self.llama.n_tokens or self._truncate(n))

    def _partial_state(self) -> bytes:
        """The live sequence's partial state (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``),
        without its 8-byte header: a checkpoint's payload."""
        ctx = self.llama.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, PARTIAL_ONLY)
        buf = np.empty(size, dtype=np.uint8)
        got = llama_cpp.llama_state_seq_get_data_ext(
            ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, 0, PARTIAL_ONLY)
        if got != size or size < 8:
            raise kv_codec.UnsupportedStateError(f"llama_state_seq_get_data_ext wrote {got} of {size} bytes")
        return buf[8:].tobytes()

    def _hold_checkpoint(self) -> None:
        """Keep the partial state at the live context's end (before decoding moves it on)."""
        n = self.llama.n_tokens
        if self._pending is not None and self._pending.n == n:
            self._pending.tokens = list(self.llama.input_ids[:n])
            return
        try:
            data = self._partial_state()
            if kv_codec.partial_tokens(self.kind, data) != n:
                raise kv_codec.UnsupportedStateError(
                    f"the partial state stands for {kv_codec.partial_tokens(self.kind, data)} tokens, not {n}")
        except kv_codec.UnsupportedStateError as exc:
            self._not_storable(exc)
            return
        self._pending = _Checkpoint(n, list(self.llama.input_ids[:n]), data)

    def _not_storable(self, exc: Exception) -> None:
        self.cache_note = (f"the prefix store is off for this model: its state has a layout "
                           f"this version does not know ({exc}); every prompt is prefilled")
        log.warning("%s", self.cache_note)
        self._pending = None

    def _rewind(self, cp: _Checkpoint) -> bool:
        """Bring the live context back to the held checkpoint ``cp`` (for recomputing the
        reply in one batch): by cutting the sliding window when that is exact, else by
        re-assembling the state from the live blocks below ``cp.n`` and ``cp``'s data."""
        if self._rewind_live(cp.n):
            self.llama.n_tokens = cp.n
            return True
        try:
            payloads: list = []
            layout = None
            if self.kind != kv_codec.StateKind.RECURRENT:
                state = kv_codec.split(self._state_blob(), self.kind).blocks
                payloads = [(kv_codec.block_payload(state, 0, cp.n), cp.n, cp.n)]
                layout = state.layout
            blob = kv_codec.assemble(self.kind, layout, payloads, cp.data)
        except (ValueError, kv_codec.UnsupportedStateError) as exc:
            log.warning("cannot rewind to the checkpoint: %s", exc)
            return False
        tokens = list(self.llama.input_ids[: cp.n])
        if not self._apply(blob):
            return False
        self._set_tokens(tokens)
        self._pending = cp
        if self.kind == kv_codec.StateKind.ISWA:
            self._swa_valid_from = kv_codec.partial_start(self.kind, cp.data)
        return True

    def _snapshot_checkpointed(self, stats: GenerationStats | None) -> int:
        assert self.store is not None
        if self.cache_note:  # this model's state cannot be stored (see _not_storable)
            return 0
        t = time.perf_counter()
        written = 0
        cp = self._pending
        n = self.llama.n_tokens
        if cp is not None and (cp.n > self._exact_upto or cp.tokens and list(self.llama.input_ids[: cp.n]) != cp.tokens):
            cp = None  # not from this context
        try:
            # Recompute the decoded reply in one batch from the held checkpoint.
            if n > self._exact_upto and cp is not None and n - cp.n >= MIN_BATCH:
                tokens = list(self.llama.input_ids[cp.n : n])
                if self._rewind(cp):
                    for chunk in _batches(tokens, self.llama.n_batch):
                        self._eval(chunk)
                    self._exact_upto = self.llama.n_tokens
            if stats is not None:
                stats.recompute_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            exact = self._exact_upto
            tokens = np.asarray(self.llama.input_ids[:exact], dtype=np.int32)
            at_end = exact == self.llama.n_tokens and exact >= MIN_RESTORE_TOKENS
            if not at_end and not len(tokens):
                return written
            state = kv_codec.split(self._state_blob(), self.kind)
            if state.n_tokens != self.llama.n_tokens:
                raise kv_codec.UnsupportedStateError(
                    f"state holds {state.n_tokens} tokens, expected {self.llama.n_tokens}")
            chain: list[bytes] = []
            if self.kind != kv_codec.StateKind.RECURRENT:
                missing, chain = self.store.plan(self.fingerprint, tokens)
                if self.layout != state.blocks.layout:
                    self.layout = state.blocks.layout
                    self.store.register_model(
                        self.fingerprint, json.dumps(state.blocks.layout.to_json()), self.model.facts.name)
                written += self._store_blocks(state.blocks, missing, chain)
            keys = list(chain)
            if cp is not None and cp.n >= MIN_RESTORE_TOKENS and cp.n <= exact:
                key, w = self.store.put_checkpoint(self.fingerprint, tokens[: cp.n], cp.data, active_path=keys)
                keys.append(key)
                written += w
            if at_end:
                data = bytes(state.partial)
                self._pending = _Checkpoint(exact, tokens.tolist(), data)
                written += self.store.put_checkpoint(self.fingerprint, tokens, data, active_path=keys)[1]
        except kv_codec.UnsupportedStateError as exc:
            self._not_storable(exc)
        except (StorageFullError, StoreError) as exc:
            log.warning("KV state not stored: %s", exc)
        if stats is not None:
            stats.snapshot_ms = (time.perf_counter() - t) * 1000
            stats.snapshot_bytes_written = written
        return written

    # -- context helpers ---------------------------------------------------------------

    def _set_tokens(self, tokens: list[int]) -> None:
        self.llama.input_ids[: len(tokens)] = tokens
        self.llama.n_tokens = len(tokens)

    def _eval(self, tokens: list[int]) -> None:
        """``llama.eval(tokens)``, remembering where the context's logits stand: after a
        batch of >= MIN_BATCH tokens they are the last token's, as a from-scratch prefill
        of the same tokens computes them (see the module docstring), and a request whose
        prompt is exactly the live context samples from them at once (``_position``)."""
        self.llama.eval(tokens)
        self._logits_at = self.llama.n_tokens if len(tokens) >= MIN_BATCH else -1

    def _truncate(self, n: int) -> bool:
        if n != self._logits_at:
            self._logits_at = -1
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        return bool(llama_cpp.llama_memory_seq_rm(mem, 0, n, -1))

    def _clear(self, data: bool = True) -> None:
        """Empty the context. ``data=False`` resets only the cells' metadata: the KV
        buffers keep stale values in free cells, as after any llama.cpp ``seq_rm``
        (masked in attention); zeroing them costs a memset of the whole cache."""
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        llama_cpp.llama_memory_clear(mem, data)
        self.llama.n_tokens = 0
        self._exact_upto = 0
        self._logits_at = -1
        self._pending = None
        self._swa_valid_from = 0

    def reset_context(self) -> None:
        """Forget the live context (the next request restores from the store or prefills)."""
        with self._lock:
            self._clear()

    def close(self) -> None:
        self.model.close()


CUT_CHUNK_BYTES = 64 * 1024 * 1024
"""Most payload bytes cut out of a state before they are stored: a first snapshot of a long
context is stored in several transactions of at most this size, so the cut buffer stays
bounded (each one extends the chain of the one before, so a kill between them leaves a
consistent prefix)."""


def _cut(state: kv_codec.ParsedState, missing: list[NewBlock], buffer: np.ndarray) -> Iterator[list[NewBlock]]:
    """The ``missing`` blocks, a chunk of at most :data:`CUT_CHUNK_BYTES` of payload at a
    time. Each payload is a callable that cuts it out of ``state`` into its own piece of
    ``buffer`` (a reused uint8 array of at least ``min(CUT_CHUNK_BYTES, all payloads)``
    bytes, so its pages are already mapped; valid until the next chunk is asked for):
    ``PrefixStore.put`` calls it on the thread that checksums and writes the block."""
    per_token = state.layout.bytes_per_token
    chunk: list[NewBlock] = []
    used = 0

    def cut(b: NewBlock, off: int) -> NewBlock:
        return NewBlock(b.key, b.parent, b.start, b.tokens,
                        lambda: kv_codec.block_into(state, b.start, b.start + b.n_tokens, buffer[off:]),
                        b.n_tokens * per_token)

    for b in missing:
        size = b.n_tokens * per_token
        if chunk and used + size > buffer.nbytes:
            yield chunk
            chunk, used = [], 0
        chunk.append(cut(b, used))
        used += size
    if chunk:
        yield chunk


def _batches(tokens: list[int], size: int) -> list[list[int]]:
    """``tokens`` in chunks of at most ``size``, none of exactly one token (unless the
    whole list is one token): a one-token batch takes a different path in llama.cpp."""
    chunks = [tokens[i : i + size] for i in range(0, len(tokens), size)]
    if len(chunks) >= 2 and len(chunks[-1]) == 1:
        chunks[-2], chunks[-1] = chunks[-2][:-1], [chunks[-2][-1], *chunks[-1]]
    return chunks


def _common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
