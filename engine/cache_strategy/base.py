"""What the two cache strategies share: restoring stored KV into the live context, the
positioning of a prompt (the live context or the store, whichever holds more), and storing
new blocks.

A strategy serves one :class:`engine.core.Engine` and reads its public fields (``store``,
``fingerprint``, ``layout``, ``live``, ``kind``, ``model``); it learns ``layout`` at its
first snapshot. The engine calls it under its lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine import kv_codec
from engine.chat_engine import GenerationStats, ProgressFn
from engine.live_context import SCRATCH_SEQ, HeldState, LiveContext
from storage.errors import StorageFullError
from storage.parallel import pipelined
from storage.prefix_store import CheckpointRef, MappedBlocks, NewBlock, PrefixMatch, StoreError

if TYPE_CHECKING:
    from engine.core import Engine

log = logging.getLogger(__name__)

# Below this many tokens a restore is not worth its fixed cost (a SQLite query, a state
# blob, a llama_state_seq_set_data call: about 2 ms, while prefilling a handful of tokens
# costs one batched forward pass of similar length). Measured with `branchwise bench`.
MIN_RESTORE_TOKENS = 16

RESTORE_PIECE_BYTES = 64 * 1024 * 1024
"""A dense restore hands llama.cpp its blocks in pieces of at most this many bytes (a
single larger block is a piece of its own); copying the next piece overlaps llama.cpp
reading this one (``CacheStrategy.restore_blocks``). Both are memory-bound: on this
project's 2-core machine a 37 MB restore took 13.0 ms in one piece, 13.8 ms in 16 MB
pieces and 14.2 ms in 8 MB ones (medians of 15, interleaved), so pieces are large: they
bound the buffer a long context needs, and a branch switch appends its blocks as one."""

CUT_CHUNK_BYTES = 64 * 1024 * 1024
"""Most payload bytes cut out of a state before they are stored: a first snapshot of a long
context is stored in several transactions of at most this size, so the cut buffer stays
bounded (each one extends the chain of the one before, so a kill between them leaves a
consistent prefix)."""


class CacheStrategy:
    """How one engine keeps its model's state in the prefix store (see the subclasses).

    Args:
        engine: the engine served.
        cut_buffer: the reused buffer block payloads are cut into (uint8, pages mapped).
    """

    cuts_back = True
    """The live context can be cut back to any prefix exactly (so a prewarm may run)."""

    def __init__(self, engine: Engine, cut_buffer: np.ndarray | None = None):
        self.engine = engine
        self.cut_buffer = cut_buffer if cut_buffer is not None else np.empty(0, dtype=np.uint8)
        self.last_restore = RestoreTiming()

    @property
    def live(self) -> LiveContext:
        return self.engine.live

    # -- what a subclass decides -----------------------------------------------------------

    def coverage(self, ids: list[int]) -> int:
        """Leading tokens of ``ids`` the store could restore.

        Raises:
            StoreError: the store cannot be read.
        """
        raise NotImplementedError

    def lookup(self, prompt: list[int], limit: int, live: int, record: bool) -> tuple[PrefixMatch, CheckpointRef | None, int]:
        """``(match, checkpoint, tokens)``: what the store would restore of ``prompt`` (at
        most ``limit`` tokens; ``live`` are in the live context already), and how many
        tokens that is. Never raises (a store error means nothing found)."""
        raise NotImplementedError

    def live_prefix(self, n: int) -> int:
        """How many of the ``n`` exact shared live tokens may be kept (0: none)."""
        return n

    def cut_live(self, n: int) -> bool:
        """Cut the live context back to ``n`` tokens; False when that is not exact."""
        return self.live.truncate(n)

    def hold_at(self, prompt: list[int], start: int, use_cache: bool) -> int | None:
        """Where the prefill of ``prompt`` from ``start`` stops to :meth:`hold` a partial
        state, or None."""
        return None

    def hold(self) -> None:
        """Keep the partial state at the live context's end (before decoding moves it on)."""

    def snapshot(self, stats: GenerationStats | None) -> int:
        """Store what the store lacks of the live context; returns bytes written. Never
        raises for cache problems (they are logged)."""
        raise NotImplementedError

    # -- positioning -------------------------------------------------------------------------

    def position(self, prompt: list[int], use_cache: bool, stats: GenerationStats,
                 on_progress: ProgressFn | None, record: bool = True) -> None:
        """Bring the live context to the longest known prefix of ``prompt`` (all but its
        last ``min_batch`` tokens): the live context or the prefix store, whichever is
        longer. ``record`` False leaves the store's statistics and LRU marks alone."""
        t = time.perf_counter()
        live_ctx = self.live
        # A snapshot has no logits, and no batch may be under the model's min_batch: leave
        # at least that many prompt tokens to prefill.
        limit = max(len(prompt) - live_ctx.min_batch, 0)
        live = 0
        if use_cache:
            live = self.live_prefix(min(live_ctx.reusable(prompt), limit))
        match, ref, found = PrefixMatch(), None, 0
        if use_cache and self.engine.store is not None:
            match, ref, found = self.lookup(prompt, limit, live, record)
        restored = 0
        if found >= max(live + 1, MIN_RESTORE_TOKENS):
            if on_progress:
                on_progress("restore", 0, found)
            restored, dropped = self.restore(match, ref, live)
            stats.cache_blocks_dropped = dropped
            live = min(live, live_ctx.n_tokens)  # a restore keeps at most a block-aligned part of it
        if restored > live:
            stats.restore_source = "store"
            if ref is not None:
                stats.checkpoint_tokens = restored
            live_ctx.adopt(prompt[:restored])
        elif live > 0 and self.cut_live(live):
            restored = live
            stats.restore_source = "context"
            live_ctx.exact_upto = live
        else:
            restored = 0
            live_ctx.clear()
        stats.cache_note = live_ctx.note
        self.positioned(stats, t, restored, len(prompt), use_cache and record)

    def positioned(self, stats: GenerationStats, t: float, restored: int, n_prompt: int, count: bool) -> None:
        """After positioning for a prompt of ``n_prompt`` tokens that began at
        ``perf_counter()`` ``t``: the stats (``restored`` tokens, ms), and with ``count`` the
        store's restored/prefilled statistics (best effort)."""
        stats.restored_tokens = restored
        stats.restore_ms = (time.perf_counter() - t) * 1000
        store = self.engine.store
        if store is not None and count:
            with contextlib.suppress(StoreError, StorageFullError):
                store.record_restore(restored, n_prompt - restored)

    # -- restoring ---------------------------------------------------------------------------

    def restore(self, match: PrefixMatch, ref: CheckpointRef | None = None, live: int = 0) -> tuple[int, int]:
        """Restore the blocks of ``match`` (and, for a model with checkpoints, the
        checkpoint ``ref`` after them) into sequence 0. Returns ``(tokens the live context
        holds now, blocks dropped)``. The caller records the tokens (``LiveContext.adopt``).

        Without a checkpoint the blocks go in pieces (:meth:`restore_blocks`), and the
        first ``live`` tokens of the live context, when they are the match's (exact and
        shared), are kept up to the start of the block they end in: only the blocks from
        there are copied (a switch between branches that share a long prefix moves only
        what differs). With a checkpoint the whole state is one blob; ``(0, n)`` when
        anything fails (the sequence is then empty).

        The byte path, one pass over the bytes: the block files are mapped
        (``PrefixStore.map_blocks``), then ``kv_codec.assemble`` copies each block into its
        place in the reusable state buffer, checking its xxh3 just before the copy (the
        bytes are then in the CPU cache), and ``llama_state_seq_set_data`` reads that
        buffer in place. A block that fails its checksum is dropped with its descendants
        and the state is assembled again from the blocks before it: a damaged block never
        reaches llama.cpp."""
        e = self.engine
        assert e.store is not None
        recurrent = e.kind == kv_codec.StateKind.RECURRENT
        rejected: list[tuple[MappedBlocks, int]] = []
        with e.store.files.reading():  # no process zeroes a block file between its check and copy
            if ref is None and not recurrent:
                n, dropped = self.restore_blocks(match, live, rejected)
            else:
                n, dropped = self._restore_with_checkpoint(match, ref, rejected)
        for mapped, index in rejected:  # after the lock: deleting a block waits for every reader
            try:
                dropped += e.store.reject(mapped, index)
            except StoreError:
                pass
        return n, dropped

    def _restore_with_checkpoint(self, match: PrefixMatch, ref: CheckpointRef | None,
                                 rejected: list[tuple[MappedBlocks, int]]) -> tuple[int, int]:
        """:meth:`restore` for a model with checkpoints: one blob. A damaged block is put in
        ``rejected`` (``(mapped, index)``) for the caller to drop once it let go of the lock."""
        e, live = self.engine, self.live
        recurrent = e.kind == kv_codec.StateKind.RECURRENT
        try:
            data = e.store.read_checkpoint(ref) if ref is not None else None
            mapped = MappedBlocks() if recurrent else e.store.map_blocks(match)
        except StoreError:
            return 0, 0
        dropped = mapped.n_bad
        if ref is not None and data is None:
            return 0, dropped
        payloads, check = mapped.payloads, mapped.check
        while True:
            n = sum(use for _, _, use in payloads)
            try:
                if ref is not None:
                    if not recurrent and n != ref.n_tokens:
                        return 0, dropped
                    n = ref.n_tokens
                    if kv_codec.partial_tokens(e.kind, data) != n:
                        raise kv_codec.UnsupportedStateError("the checkpoint is not at the position it is stored under")
                if n < MIN_RESTORE_TOKENS:
                    return 0, dropped
                kind = e.kind if ref is not None else kv_codec.StateKind.DENSE
                blob = kv_codec.assemble(kind, e.layout, payloads, data, buffer=live.buffer, check=check)
                break
            except kv_codec.DamagedPayloadError as bad:
                rejected.append((mapped, bad.index))
                payloads, check = payloads[: bad.index], None  # the ones before it passed
            except (ValueError, kv_codec.UnsupportedStateError) as exc:
                log.warning("stored KV does not fit (%s); prefilling instead", exc)
                return 0, dropped
        del payloads  # the mapping goes with ``mapped`` (kept for a rejected block)
        if blob.base is not live.buffer and blob is not live.buffer:
            live.buffer = blob  # grown: keep the larger buffer for the next restore
        if not live.apply(blob):
            return 0, dropped
        if ref is not None:
            live.held = HeldState(n, [], data)
            if e.kind == kv_codec.StateKind.ISWA:
                live.swa_valid_from = kv_codec.partial_start(e.kind, data)
        return n, dropped

    def restore_blocks(self, match: PrefixMatch, live: int,
                       rejected: list[tuple[MappedBlocks, int]]) -> tuple[int, int]:
        """Restore the blocks of ``match`` into sequence 0, keeping the first ``live``
        tokens of the live context up to a block start (see :meth:`restore`). Returns
        ``(tokens the live context holds now, blocks dropped)``: after a failure, those
        that were in place before it (0 when nothing was).

        The bytes go to llama.cpp in pieces of about :data:`RESTORE_PIECE_BYTES`: piece
        ``i + 1`` is checked and copied into its own half of the reusable state buffer on
        the helper thread while ``llama_state_seq_set_data`` reads piece ``i`` on this one
        (``storage.parallel.pipelined``), and each piece joins sequence 0 after the cells
        before it (``LiveContext.append``). Every block's xxh3 is checked just before it is
        copied; a block that fails goes to ``rejected`` (``(mapped, index)``), for
        :meth:`restore` to drop with its descendants once it let go of the lock; the blocks
        before it are restored, and nothing after it: a damaged block never reaches llama.cpp."""
        e, lc = self.engine, self.live
        keep = max((b.start for b in match.blocks if b.start <= live), default=0) if live else 0
        if keep and not lc.truncate(keep):
            keep = 0
        todo = PrefixMatch([b for b in match.blocks if b.start >= keep])
        try:
            mapped = e.store.map_blocks(todo)
        except StoreError:
            return keep, 0
        dropped = mapped.n_bad
        if not mapped.payloads or e.layout is None:
            return keep, dropped
        per_token = e.layout.bytes_per_token
        pieces = _pieces([use for _, _, use in mapped.payloads], per_token, RESTORE_PIECE_BYTES)
        size = 8 + kv_codec.kv_section_bytes(e.layout, max(sum(mapped.payloads[i][2] for i in p) for p in pieces))
        room = size * min(2, len(pieces))  # one piece needs no second half (no page faults for it)
        if lc.buffer.nbytes < room:
            lc.buffer = np.empty(room, dtype=np.uint8)
        halves = (lc.buffer[:size], lc.buffer[size:room])
        starts = [keep]
        for p in pieces:
            starts.append(starts[-1] + sum(mapped.payloads[i][2] for i in p))

        def produce(k: int) -> np.ndarray | Exception:
            first = pieces[k][0]
            try:
                return kv_codec.assemble(
                    kv_codec.StateKind.DENSE, e.layout, [mapped.payloads[i] for i in pieces[k]], None,
                    seq_id=0 if k == 0 and not keep else SCRATCH_SEQ, buffer=halves[k % 2],
                    check=lambda j, data: mapped.check(first + j, data), pos0=starts[k])
            except kv_codec.DamagedPayloadError as bad:
                return kv_codec.DamagedPayloadError(first + bad.index)
            except (ValueError, kv_codec.UnsupportedStateError) as exc:
                return exc

        failed: list[Exception] = []
        timing = RestoreTiming(pieces=len(pieces), kept_tokens=keep)

        def consume(k: int, blob) -> bool:
            t = time.perf_counter()
            timing.copy_ms = (t - t0) * 1000 if k == 0 else timing.copy_ms
            if isinstance(blob, Exception):
                failed.append(blob)
                return False
            ok = lc.apply(blob) if k == 0 and not keep else lc.append(blob)
            timing.set_data_ms += (time.perf_counter() - t) * 1000
            return ok

        t0 = time.perf_counter()
        done = pipelined(produce, consume, len(pieces))
        timing.total_ms = (time.perf_counter() - t0) * 1000
        self.last_restore = timing
        n = starts[done]
        if failed and not isinstance(failed[0], kv_codec.DamagedPayloadError):
            log.warning("stored KV does not fit (%s); prefilling the rest", failed[0])
        elif failed:  # the blocks of its piece before it passed: restore them, then stop
            k, bad = done, failed[0].index
            before = [i for i in pieces[k] if i < bad]
            if before:
                blob = kv_codec.assemble(kv_codec.StateKind.DENSE, e.layout, [mapped.payloads[i] for i in before],
                                         None, seq_id=0 if k == 0 and not keep else SCRATCH_SEQ,
                                         buffer=halves[0], pos0=n)
                if lc.apply(blob) if k == 0 and not keep else lc.append(blob):
                    n += sum(mapped.payloads[i][2] for i in before)
            rejected.append((mapped, bad))
        return n, dropped

    # -- storing -----------------------------------------------------------------------------

    def learn_layout(self, layout: kv_codec.KvLayout) -> None:
        """Register the model's KV layout with the store when it is new or changed.

        Raises:
            StoreError, StorageFullError: the store cannot be written.
        """
        e = self.engine
        if e.layout != layout:
            e.layout = layout
            e.store.register_model(e.fingerprint, json.dumps(layout.to_json()), e.model.facts.name)

    def store_blocks(self, state: kv_codec.ParsedState, missing: list[NewBlock], chain: list[bytes]) -> int:
        """Cut the ``missing`` blocks out of ``state`` into the reused cut buffer and store
        them, a chunk (one transaction) at a time; returns the bytes written.

        Raises:
            StoreError, StorageFullError: the store cannot be written.
        """
        e = self.engine
        per_token = state.layout.bytes_per_token
        need = max(min(CUT_CHUNK_BYTES, sum(b.n_tokens for b in missing) * per_token),
                   max((b.n_tokens for b in missing), default=0) * per_token)  # at least one block
        if self.cut_buffer.nbytes < need:
            self.cut_buffer = np.empty(need, dtype=np.uint8)
        written = 0
        for chunk in cut_blocks(state, missing, self.cut_buffer):
            written += e.store.put(e.fingerprint, chunk, active_path=chain)
        if not missing:
            e.store.put(e.fingerprint, [], active_path=chain)
        return written


@dataclass
class RestoreTiming:
    """Where the time of the last dense restore went (``CacheStrategy.last_restore``, for
    ``branchwise bench``), in ms: ``copy_ms`` checking and copying the first piece (the
    rest overlap ``set_data_ms``, llama.cpp reading the pieces), ``total_ms`` from the
    first copy to the last piece in place. ``kept_tokens``: live tokens kept, not copied."""

    pieces: int = 0
    kept_tokens: int = 0
    copy_ms: float = 0.0
    set_data_ms: float = 0.0
    total_ms: float = 0.0


def _pieces(uses: list[int], per_token: int, limit: int) -> list[list[int]]:
    """Consecutive block indices grouped into pieces of at most ``limit`` bytes of KV
    (``uses[i]`` tokens of ``per_token`` bytes each), at least one block a piece."""
    out: list[list[int]] = []
    size = limit
    for i, use in enumerate(uses):
        if size + use * per_token > limit:
            out.append([])
            size = 0
        out[-1].append(i)
        size += use * per_token
    return out


def cut_blocks(state: kv_codec.ParsedState, missing: list[NewBlock], buffer: np.ndarray) -> Iterator[list[NewBlock]]:
    """The ``missing`` blocks, a chunk of at most :data:`CUT_CHUNK_BYTES` of payload at a
    time, each chunk's payloads cut out of ``state`` in one go (``kv_codec.cut_into``)
    into their own pieces of ``buffer`` (a reused uint8 array of at least
    ``min(CUT_CHUNK_BYTES, all payloads)`` bytes, so its pages are already mapped; valid
    until the next chunk is asked for). ``PrefixStore.put`` checksums each payload just
    before it writes it, while it is in the CPU cache."""
    per_token = state.layout.bytes_per_token
    chunk: list[tuple[NewBlock, int]] = []
    used = 0

    def ready() -> list[NewBlock]:
        kv_codec.cut_into(state, [(b.start, b.start + b.n_tokens, off) for b, off in chunk], buffer)
        return [NewBlock(b.key, b.parent, b.start, b.tokens, buffer[off : off + b.n_tokens * per_token])
                for b, off in chunk]

    for b in missing:
        size = b.n_tokens * per_token
        if chunk and used + size > buffer.nbytes:
            yield ready()
            chunk, used = [], 0
        chunk.append((b, used))
        used += size
    if chunk:
        yield ready()
