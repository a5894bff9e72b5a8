"""The live llama.cpp context: what sequence 0 holds, how much of it is exact, where its
logits stand.

One object owns that state, so the engine, its cache strategies
(:mod:`engine.cache_strategy`), the prewarmer and the bench all move it through the same
methods:

* ``exact_upto``: the leading live tokens whose KV was computed in batches of >=
  ``min_batch`` tokens, and so equals what a from-scratch prefill computes (they may be
  reused or stored); decoded tokens are not exact until recomputed;
* ``logits_at``: the live position whose logits the context holds (after a batch of >=
  ``min_batch`` tokens), or -1;
* ``held``: a partial state kept in memory (a sliding window, a recurrent state) for the
  models with checkpoints;
* ``swa_valid_from``: below this position a restored sliding window is zero padding;
* ``status``: :class:`LiveStatus`, whether the state may be stored at all (``note`` says
  why not, in words).

Exactness rule: llama.cpp computes a token's KV bit for bit the same in any batch of at
least ``min_batch`` tokens, but not in smaller ones (``docs/architecture.md``): a single
token goes through other kernels than a batch, and for K-quant weights llama.cpp's tiled
kernel takes over from 8 rows (``engine.cpu.min_batch``). So :func:`batches` never cuts a
batch smaller than that and :meth:`LiveContext.evaluate` records logits only after a
batch of >= ``min_batch`` tokens.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import llama_cpp
import numpy as np

from engine import kv_codec

log = logging.getLogger(__name__)

MIN_BATCH = 2
"""The smallest prompt batch for any model (a single token is never exact); a model's own is
``LiveContext.min_batch`` (``engine.cpu.min_batch``: 8 for K-quant weights)."""
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (include/llama.h)
SCRATCH_SEQ = 1
"""The context's second sequence, where a restored piece of state lands before it joins
sequence 0 (:meth:`LiveContext.append`); it holds no cells between calls."""
SEQUENCES = 2  # sequences of every engine context: 0 (the conversation) and SCRATCH_SEQ


class LiveStatus(StrEnum):
    """Whether the live context's state may be stored and restored."""

    STORABLE = "storable"
    UNSTORABLE = "unstorable"  # its layout turned out unknown to kv_codec: the store is off for this model


@dataclass
class HeldState:
    """A partial state held in memory: after the first ``n`` tokens of the live context
    (``tokens``, or ``[]`` when restored from the store and not yet checked), ``data`` its
    payload without the 8-byte header."""

    n: int
    tokens: list[int]
    data: bytes


class LiveContext:
    """Sequence 0 of a llama.cpp context (a ``llama_cpp.Llama``) and what is known about it.

    Args:
        llama: the loaded model's ``Llama``.
        buffer: the reusable state buffer (uint8; its pages mapped already), grown on demand.
        min_batch: the smallest prompt batch whose KV is exact for this model (tokens).
    """

    def __init__(self, llama: llama_cpp.Llama, buffer: np.ndarray | None = None, min_batch: int = MIN_BATCH):
        self.llama = llama
        self.min_batch = max(MIN_BATCH, int(min_batch))
        self.buffer = buffer if buffer is not None else np.empty(0, dtype=np.uint8)
        self.exact_upto = 0
        self.logits_at = -1
        self.held: HeldState | None = None
        self.swa_valid_from = 0
        self.status = LiveStatus.STORABLE
        self.note = ""

    # -- what it holds -----------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens the context holds."""
        return self.llama.n_tokens

    def ids(self, stop: int | None = None) -> np.ndarray:
        """The live token ids ``[0, stop)`` (default: all held), a view of ``input_ids``."""
        return self.llama.input_ids[: self.llama.n_tokens if stop is None else stop]

    def reusable(self, prompt: Sequence[int]) -> int:
        """Leading tokens of ``prompt`` the context holds exactly (in batches of >= 2)."""
        return min(common_prefix(self.ids(), prompt), self.exact_upto)

    def logits_ready(self, prompt: Sequence[int]) -> bool:
        """The context is exactly ``prompt``, its last batch (of >= ``min_batch`` tokens)
        ended there: its logits are the prompt's and the first token can be sampled at once."""
        n = len(prompt)
        return (self.logits_at == n == self.llama.n_tokens and self.exact_upto >= n
                and common_prefix(self.ids(n), prompt) == n)

    # -- moving it -----------------------------------------------------------------------

    def evaluate(self, tokens: list[int]) -> None:
        """Evaluate one batch (``llama.eval``), remembering where the logits stand: after a
        batch of >= ``min_batch`` tokens they are the last token's, as a from-scratch prefill
        of the same tokens computes them. Does not move ``exact_upto``."""
        self.llama.eval(tokens)
        self.logits_at = self.llama.n_tokens if len(tokens) >= self.min_batch else -1

    def evaluate_all(self, tokens: list[int]) -> None:
        """Evaluate ``tokens`` in batches of at most ``n_batch``, none under ``min_batch``
        (unless all of them are fewer)."""
        for chunk in batches(tokens, self.llama.n_batch, self.min_batch):
            self.evaluate(chunk)

    def adopt(self, tokens: list[int]) -> None:
        """The context's KV is now that of ``tokens`` (a restored state), all exact."""
        self.set_tokens(tokens)
        self.exact_upto = len(tokens)

    def set_tokens(self, tokens: list[int]) -> None:
        """Record that the context holds ``tokens`` (after a state was applied)."""
        self.llama.input_ids[: len(tokens)] = tokens
        self.llama.n_tokens = len(tokens)

    def truncate(self, n: int) -> bool:
        """Cut the context back to its first ``n`` tokens; False when llama.cpp refuses
        (then nothing changed)."""
        if n != self.logits_at:
            self.logits_at = -1
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        if not llama_cpp.llama_memory_seq_rm(mem, 0, n, -1):
            return False
        self.llama.n_tokens = n
        self.exact_upto = min(self.exact_upto, n)
        return True

    def clear(self, data: bool = True) -> None:
        """Empty the context. ``data=False`` resets only the cells' metadata: the KV
        buffers keep stale values in free cells, as after any llama.cpp ``seq_rm``
        (masked in attention); zeroing them costs a memset of the whole cache."""
        mem = llama_cpp.llama_get_memory(self.llama.ctx)
        llama_cpp.llama_memory_clear(mem, data)
        self.llama.n_tokens = 0
        self.exact_upto = 0
        self.logits_at = -1
        self.held = None
        self.swa_valid_from = 0

    # -- its state blob ------------------------------------------------------------------

    def apply(self, blob: np.ndarray) -> bool:
        """Replace sequence 0 with the state ``blob`` (uint8); on refusal the sequence is
        left empty and False returned. The buffers are not zeroed first (a 94 MB memset at
        4,096 cells of the default model, measured as 8 ms of a 20 ms set_data by
        `branchwise bench`): the state overwrites every cell it uses. The caller records
        the tokens (:meth:`adopt` / :meth:`set_tokens`)."""
        self.clear(data=False)
        ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data(self.llama.ctx, ptr, blob.nbytes, 0) == blob.nbytes:
            return True
        log.warning("llama_state_seq_set_data rejected a %d-byte state; prefilling instead", blob.nbytes)
        self.clear()
        return False

    def append(self, blob: np.ndarray) -> bool:
        """Add the state piece ``blob`` (uint8, assembled for :data:`SCRATCH_SEQ` with
        positions from ``p`` on, ``kv_codec.assemble(..., pos0=p)``, where ``p`` is the
        number of cells sequence 0 holds) after those cells, which are kept: llama.cpp places the piece in
        :data:`SCRATCH_SEQ` (``llama_state_seq_set_data``), then the cells are shared with
        sequence 0 (``llama_memory_seq_cp``, which moves no bytes in a unified cache) and
        the scratch sequence let go of them. Returns False when llama.cpp refused the piece
        (sequence 0 is then unchanged). The caller records the tokens.

        Where the cells land decides the bits of later attention (its sums run in cell
        order), so this relies on sequence 0 holding cells ``0 .. p - 1`` with every cell
        after them free, as every prefill, restore and cut here leaves it: llama.cpp then
        takes the first free cells, ``p`` on (``tests/test_restore_pieces.py`` compares the
        state restored in pieces with a from-scratch prefill byte for byte)."""
        ctx = self.llama.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        ok = llama_cpp.llama_state_seq_set_data(ctx, ptr, blob.nbytes, SCRATCH_SEQ) == blob.nbytes
        if ok:
            llama_cpp.llama_memory_seq_cp(mem, SCRATCH_SEQ, 0, -1, -1)
        else:
            log.warning("llama_state_seq_set_data rejected a %d-byte piece of state", blob.nbytes)
        llama_cpp.llama_memory_seq_rm(mem, SCRATCH_SEQ, -1, -1)
        return ok

    def state_blob(self) -> np.ndarray:
        """The live sequence's state blob, written into the reusable :attr:`buffer` (its
        pages are already mapped: a fresh 48 MB array costs ~60 ms of page faults here).
        Valid until the buffer is next written.

        Raises:
            kv_codec.UnsupportedStateError: llama.cpp wrote fewer bytes than it announced.
        """
        ctx = self.llama.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        if self.buffer.nbytes < size:
            self.buffer = np.empty(size, dtype=np.uint8)
        buf = self.buffer[:size]
        got = llama_cpp.llama_state_seq_get_data(ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, 0)
        if got != size:
            raise kv_codec.UnsupportedStateError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return buf

    def partial_state(self) -> bytes:
        """The live sequence's partial state (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``),
        without its 8-byte header: a checkpoint's payload.

        Raises:
            kv_codec.UnsupportedStateError: llama.cpp wrote a short or empty state.
        """
        ctx = self.llama.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, 0, PARTIAL_ONLY)
        buf = np.empty(size, dtype=np.uint8)
        got = llama_cpp.llama_state_seq_get_data_ext(
            ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, 0, PARTIAL_ONLY)
        if got != size or size < 8:
            raise kv_codec.UnsupportedStateError(f"llama_state_seq_get_data_ext wrote {got} of {size} bytes")
        return buf[8:].tobytes()

    # -- status --------------------------------------------------------------------------

    @property
    def storable(self) -> bool:
        """The state may be stored and restored (:attr:`status` is ``STORABLE``)."""
        return self.status is LiveStatus.STORABLE

    def mark_unstorable(self, exc: Exception) -> None:
        """The state turned out to have a layout :mod:`engine.kv_codec` does not know:
        the store is off for this model from now on (``note`` says so, in words)."""
        self.status = LiveStatus.UNSTORABLE
        self.note = (f"the prefix store is off for this model: its state has a layout "
                     f"this version does not know ({exc}); every prompt is prefilled")
        log.warning("%s", self.note)
        self.held = None


def batches(tokens: list[int], size: int, min_size: int = MIN_BATCH) -> list[list[int]]:
    """``tokens`` in chunks of at most ``size``, none of fewer than ``min_size`` tokens
    (unless the whole list is fewer): the last chunk takes what it lacks from the one before
    (``size`` must be at least twice ``min_size``). A smaller batch takes other kernels in
    llama.cpp (see the module docstring)."""
    assert size >= 2 * min_size or len(tokens) <= size
    chunks = [tokens[i : i + size] for i in range(0, len(tokens), size)]
    if len(chunks) >= 2 and len(chunks[-1]) < min_size:
        lack = min_size - len(chunks[-1])
        chunks[-2], chunks[-1] = chunks[-2][:-lack], [*chunks[-2][-lack:], *chunks[-1]]
    return chunks


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token id sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
