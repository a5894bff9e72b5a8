"""Dense attention: every layer's KV in shared token blocks (``CacheMode.BLOCKS``).

The KV can be cut at any token, so the live context is cut back to the longest common
prefix of a new prompt, and the store holds the blocks of every exact prefix. A prompt that
is exactly the live context, ending in a batch of >= ``min_batch`` tokens (a prewarm of the
message as sent), is not prefilled at all: its logits are the prompt's.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from engine import kv_codec
from engine.cache_strategy.base import CacheStrategy
from engine.chat_engine import GenerationStats, ProgressFn
from storage.errors import StorageFullError
from storage.prefix_store import CheckpointRef, PrefixMatch, StoreError

log = logging.getLogger(__name__)


class DenseBlocks(CacheStrategy):
    """Blocks only; the live context is cut back freely (see the module docstring)."""

    cuts_back = True

    def coverage(self, ids: list[int]) -> int:
        e = self.engine
        return e.store.coverage(e.fingerprint, ids)

    def lookup(self, prompt: list[int], limit: int, live: int, record: bool) -> tuple[PrefixMatch, CheckpointRef | None, int]:
        e = self.engine
        if e.layout is None:
            return PrefixMatch(), None, 0
        try:
            match = e.store.lookup(e.fingerprint, prompt[:limit], count=record)
        except StoreError:
            match = PrefixMatch()
        return match, None, match.n_tokens

    def position(self, prompt: list[int], use_cache: bool, stats: GenerationStats,
                 on_progress: ProgressFn | None, record: bool = True) -> None:
        t = time.perf_counter()
        if use_cache and self.live.logits_ready(prompt):
            # The live context is this very prompt, ending in a batch of >= min_batch tokens
            # (a prewarm of the message as sent): its logits are the prompt's, nothing is
            # prefilled, and the first token is sampled at once.
            stats.restore_source = "context"
            return self.positioned(stats, t, len(prompt), len(prompt), record)
        return super().position(prompt, use_cache, stats, on_progress, record)

    def snapshot(self, stats: GenerationStats | None) -> int:
        e, live = self.engine, self.live
        t = time.perf_counter()
        self.recompute_decoded()
        if stats is not None:
            stats.recompute_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        written = 0
        tokens = np.asarray(live.ids(live.exact_upto), dtype=np.int32)
        try:
            missing, chain = e.store.plan(e.fingerprint, tokens)
            if missing or (e.layout is None and len(tokens)):
                state = kv_codec.parse(live.state_blob())
                if state.n_tokens != live.n_tokens or len(tokens) > state.n_tokens:
                    raise kv_codec.UnsupportedStateError(
                        f"state holds {state.n_tokens} tokens, expected {len(tokens)}"
                    )
                self.learn_layout(state.layout)
                written = self.store_blocks(state, missing, chain)
            else:
                e.store.put(e.fingerprint, [], active_path=chain)
        except kv_codec.UnsupportedStateError as exc:
            log.warning("KV state not stored: %s", exc)
        except (StorageFullError, StoreError) as exc:
            log.warning("KV state not stored: %s", exc)
        if stats is not None:
            stats.snapshot_ms = (time.perf_counter() - t) * 1000
            stats.snapshot_bytes_written = written
        return written

    def recompute_decoded(self) -> None:
        """Re-prefill the tokens decoded one at a time, in batches of >= ``min_batch``, so the
        live KV is what a from-scratch prefill computes (``engine/core.py``'s docstring)."""
        live = self.live
        n = live.n_tokens
        if live.exact_upto >= n:
            return
        keep = max(min(live.exact_upto, n - live.min_batch), 0)
        tokens = list(live.ids(n)[keep:])
        if not live.truncate(keep):
            live.clear()
            keep, tokens = 0, list(live.llama.input_ids[:n])
        live.llama.n_tokens = keep
        live.evaluate_all(tokens)
        live.exact_upto = live.n_tokens if live.n_tokens >= live.min_batch else 0
