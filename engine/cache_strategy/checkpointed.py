"""Models with checkpoints: sliding-window, recurrent and hybrid (``CacheMode.*_CHECKPOINTS``).

Their state is two parts (``engine/kv_codec.py`` ``StateKind``): KV that can be cut at any
token goes into the shared blocks as for a dense model; the rest (a sliding window, a
recurrent state) is stored whole as a checkpoint at message boundaries, keyed by the block
chain's hash there. A request restores the deepest checkpoint at or before the longest
stored prefix with the blocks below it, then prefills the rest.

The part that cannot be cut back is held in memory (``LiveContext.held``) at
``len(prompt) - min_batch`` while prefilling, so a regenerate restores there and the reply's
KV can be recomputed in one batch from a state before the reply (a recurrent state cannot
be rewound); it is stored as a checkpoint there and after the recomputed reply. A restored
sliding window is padded with zero cells from position 0, so every cell sits at the index
a from-scratch prefill gives it (see ``kv_codec.assemble``).
"""

from __future__ import annotations

import logging
import time

import llama_cpp
import numpy as np

from engine import kv_codec
from engine.cache_strategy.base import MIN_RESTORE_TOKENS, CacheStrategy
from engine.chat_engine import GenerationStats
from engine.live_context import HeldState
from storage.errors import StorageFullError
from storage.prefix_store import CheckpointRef, PrefixMatch, StoreError

log = logging.getLogger(__name__)


class Checkpointed(CacheStrategy):
    """Blocks plus checkpoints of the state that cannot be cut (see the module docstring)."""

    cuts_back = False

    def coverage(self, ids: list[int]) -> int:
        e = self.engine
        bound = len(ids) if e.kind == kv_codec.StateKind.RECURRENT else e.store.coverage(e.fingerprint, ids)
        ref = e.store.lookup_checkpoint(e.fingerprint, ids, bound, count=False)
        return ref.n_tokens if ref else 0

    def lookup(self, prompt: list[int], limit: int, live: int, record: bool) -> tuple[PrefixMatch, CheckpointRef | None, int]:
        e = self.engine
        if not self.live.storable:
            return PrefixMatch(), None, 0
        match = PrefixMatch()
        ref: CheckpointRef | None = None
        try:
            if e.kind == kv_codec.StateKind.RECURRENT:
                bound = limit
            elif e.layout is not None:
                match = e.store.lookup(e.fingerprint, prompt[:limit], count=record)
                bound = match.n_tokens
            else:
                bound = 0
            if bound > live:
                ref = e.store.lookup_checkpoint(e.fingerprint, prompt, bound, count=record)
        except StoreError:
            ref = None
        if ref is None:
            return match, None, 0
        return match.truncated(ref.n_tokens), ref, ref.n_tokens

    def live_prefix(self, n: int) -> int:
        return n if n and self.can_rewind(n) else 0

    def can_rewind(self, n: int) -> bool:
        """Whether cutting the live context back to ``n`` tokens keeps it exact: a
        recurrent state cannot be rewound at all; a sliding window only while the cells the
        next token attends to are still there and are not the zero padding of a restore."""
        e, live = self.engine, self.live
        if n == live.n_tokens:
            return True
        if e.kind != kv_codec.StateKind.ISWA:
            return False
        need_from = max(0, n - e.model.n_swa + 1)
        mem = llama_cpp.llama_get_memory(live.llama.ctx)
        return need_from >= live.swa_valid_from and llama_cpp.llama_memory_seq_pos_min(mem, 0) <= need_from

    def cut_live(self, n: int) -> bool:
        """Cut the live context back to ``n`` tokens when :meth:`can_rewind` allows it."""
        return self.can_rewind(n) and (n == self.live.n_tokens or self.live.truncate(n))

    def hold_at(self, prompt: list[int], start: int, use_cache: bool) -> int | None:
        """``len(prompt) - min_batch``, where a regenerate restores, or ``len(prompt)``
        when stopping there would need a batch under ``min_batch``; None without the store."""
        if self.engine.store is None or not use_cache or not self.live.storable:
            return None
        m = self.live.min_batch
        at = max(len(prompt) - m, 0)
        return at if (at - start >= m or at == start) else len(prompt)

    def hold(self) -> None:
        live = self.live
        n = live.n_tokens
        if live.held is not None and live.held.n == n:
            live.held.tokens = list(live.ids(n))
            return
        try:
            data = live.partial_state()
            if kv_codec.partial_tokens(self.engine.kind, data) != n:
                raise kv_codec.UnsupportedStateError(
                    f"the partial state stands for {kv_codec.partial_tokens(self.engine.kind, data)} tokens, not {n}")
        except kv_codec.UnsupportedStateError as exc:
            live.mark_unstorable(exc)
            return
        live.held = HeldState(n, list(live.ids(n)), data)

    def rewind(self, cp: HeldState) -> bool:
        """Bring the live context back to the held checkpoint ``cp`` (for recomputing the
        reply in one batch): by cutting the sliding window when that is exact, else by
        re-assembling the state from the live blocks below ``cp.n`` and ``cp``'s data."""
        kind, live = self.engine.kind, self.live
        if self.cut_live(cp.n):
            live.llama.n_tokens = cp.n
            return True
        try:
            payloads: list = []
            layout = None
            if kind != kv_codec.StateKind.RECURRENT:
                state = kv_codec.split(live.state_blob(), kind).blocks
                payloads = [(kv_codec.block_payload(state, 0, cp.n), cp.n, cp.n)]
                layout = state.layout
            blob = kv_codec.assemble(kind, layout, payloads, cp.data)
        except (ValueError, kv_codec.UnsupportedStateError) as exc:
            log.warning("cannot rewind to the checkpoint: %s", exc)
            return False
        tokens = list(live.ids(cp.n))
        if not live.apply(blob):
            return False
        live.set_tokens(tokens)
        live.held = cp
        if kind == kv_codec.StateKind.ISWA:
            live.swa_valid_from = kv_codec.partial_start(kind, cp.data)
        return True

    def snapshot(self, stats: GenerationStats | None) -> int:
        e, live = self.engine, self.live
        assert e.store is not None
        if not live.storable:  # this model's state cannot be stored (LiveContext.mark_unstorable)
            return 0
        t = time.perf_counter()
        written = 0
        cp = live.held
        n = live.n_tokens
        if cp is not None and (cp.n > live.exact_upto or cp.tokens and list(live.ids(cp.n)) != cp.tokens):
            cp = None  # not from this context
        try:
            # Recompute the decoded reply in one batch from the held checkpoint.
            if n > live.exact_upto and cp is not None and n - cp.n >= live.min_batch:
                tokens = list(live.ids(n)[cp.n:])
                if self.rewind(cp):
                    live.evaluate_all(tokens)
                    live.exact_upto = live.n_tokens
            if stats is not None:
                stats.recompute_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            exact = live.exact_upto
            tokens = np.asarray(live.ids(exact), dtype=np.int32)
            at_end = exact == live.n_tokens and exact >= MIN_RESTORE_TOKENS
            if not at_end and not len(tokens):
                return written
            state = kv_codec.split(live.state_blob(), e.kind)
            if state.n_tokens != live.n_tokens:
                raise kv_codec.UnsupportedStateError(
                    f"state holds {state.n_tokens} tokens, expected {live.n_tokens}")
            chain: list[bytes] = []
            if e.kind != kv_codec.StateKind.RECURRENT:
                missing, chain = e.store.plan(e.fingerprint, tokens)
                self.learn_layout(state.blocks.layout)
                written += self.store_blocks(state.blocks, missing, chain)
            keys = list(chain)
            if cp is not None and cp.n >= MIN_RESTORE_TOKENS and cp.n <= exact:
                key, w = e.store.put_checkpoint(e.fingerprint, tokens[: cp.n], cp.data, active_path=keys)
                keys.append(key)
                written += w
            if at_end:
                data = bytes(state.partial)
                live.held = HeldState(exact, tokens.tolist(), data)
                written += e.store.put_checkpoint(e.fingerprint, tokens, data, active_path=keys)[1]
        except kv_codec.UnsupportedStateError as exc:
            live.mark_unstorable(exc)
        except (StorageFullError, StoreError) as exc:
            log.warning("KV state not stored: %s", exc)
        if stats is not None:
            stats.snapshot_ms = (time.perf_counter() - t) * 1000
            stats.snapshot_bytes_written = written
        return written
