"""Speculative decoding: draft a few tokens cheaply, verify them in one batch of the model.

Two drafters, both deterministic functions of the conversation so far:

* :class:`PromptLookup` (``--speculative lookup``): the n-gram draft of llama.cpp's
  ``common_ngram_simple_draft`` (``common/ngram-map.cpp``) and llama-cpp-python's
  ``LlamaPromptLookupDecoding``: the last 2-4 tokens are looked up in the prompt and the
  reply so far (the most recent earlier occurrence, 4 then 3 tokens), and the tokens
  that followed them there are the draft. It costs no model and pays on follow-ups that
  quote a document, code edits and summaries.
* :class:`DraftModel` (``--speculative draft:PATH``): a small model sharing the target's
  vocabulary drafts greedily (checked before use: the same vocabulary size and the same
  text for every token; :class:`DraftModelError` otherwise).

Verification (:func:`verify`). The last sampled token ``t`` and the draft ``d1..dk`` are
evaluated in one batch of ``k + 1 >= 2`` tokens with the logits of every position kept.
Then, in order, the token at position ``i`` is sampled from the target's logits there with
the reply's own sampler chain (:class:`llama_cpp.LlamaSampler`: penalties, top-k/p, min-p,
temperature, the seeded RNG); a drafted token is accepted iff it equals that sample, and the
first sample that differs (or the one after the last draft) is the next token. This is the
standard acceptance rule for a draft without probabilities (as llama.cpp's
``common_sampler_sample_and_accept_n``): every emitted token is drawn from the target's
distribution at its position, one RNG draw per emitted token, as plain decoding does, so
the distribution of replies is unchanged; at temperature 0 each token is the target's argmax.
The KV of the rejected drafts is removed (``llama_memory_seq_rm``, :meth:`LiveContext.truncate`),
so the live context holds exactly the prompt and the tokens emitted.

Numerics, measured on the pinned llama.cpp (CPU, the default model): a batch of >= 2 tokens
runs other kernels than a one-token step (llama.cpp's ``llamafile_sgemm`` declines n < 2;
``docs/architecture.md``, "Exact restores"), and the logits differ by up to 0.45. So a token
verified in a batch may differ from the one a one-token step would have chosen in a near
tie: greedy decoding with one-token steps and with two-token batches parted after 4, 34, 15
and 5 tokens on four prompts (with and without weight repacking). A reply with speculative
decoding is therefore a deterministic function of the prompt, the sampling settings and the
drafter (the same with or without the prefix store, after any restore), but not always the
bytes ``--speculative none`` gives. Making every decode step a batch of two would make them
agree, at about 1.7 times the cost of a step (measured), which is why plain decoding stays
one token a step.

After a reply the engine recomputes the KV of the tokens decoded one at a time
(``DenseBlocks.recompute_decoded``). A verification batch of >= 2 tokens computes its
tokens' KV as a prefill would, bit for bit, but only while everything before it is exact:
the first one-token step makes every later token's KV differ. So the recompute skips the
leading run of the reply that was evaluated in verification batches (``exact_upto``
follows it, :class:`Speculation`) and recomputes from the first one-token step on;
``tests/test_speculative.py`` compares that run's KV with a from-scratch prefill.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from engine.errors import EngineError
from engine.speculative_setting import DRAFT, LOOKUP, NONE, kind_of, parse

__all__ = ["DRAFT", "LOOKUP", "MAX_DRAFT", "NONE", "DraftModel", "DraftModelError", "PromptLookup", "Speculation",
           "Verifier", "kind_of", "parse", "vocabulary_mismatch"]

log = logging.getLogger(__name__)

MAX_NGRAM = 4  # the longest n-gram looked up (then 3, then 2)
MIN_NGRAM = 3  # shorter matches draft too poorly to pay for their batch (measured: README "Benchmarks")
MAX_DRAFT = 16  # most tokens drafted for one verification
DRAFT_MIN_P = 0.5  # a draft model stops drafting below this probability of its own choice


class DraftModelError(EngineError):
    """The draft model cannot be used (not loadable, or another vocabulary)."""


# -- drafters --------------------------------------------------------------------------------


class PromptLookup:
    """The n-gram drafter over the conversation (prompt and reply so far).

    Args:
        capacity: most tokens the history holds (the context size).
    """

    name = LOOKUP

    def __init__(self, capacity: int):
        self.hist = np.zeros(capacity + MAX_DRAFT + 2, dtype=np.int32)
        self.n = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a reply after ``prompt`` (token ids)."""
        n = min(len(prompt), len(self.hist) - 1)
        self.hist[:n] = prompt[len(prompt) - n:]
        self.n = n

    def push(self, token: int) -> None:
        """Append an emitted token to the history."""
        if self.n < len(self.hist):
            self.hist[self.n] = token
            self.n += 1

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens that followed the most recent earlier occurrence of the
        history's last n tokens (n = 4, then 3); [] when none does."""
        n, h = self.n, self.hist
        if limit <= 0:
            return []
        for size in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if n <= size:
                continue
            # m[j]: h[j:j+size] equals the last `size` tokens, for j < n - size (an earlier
            # occurrence, followed by at least one token)
            m = h[: n - size] == h[n - size]
            for i in range(1, size):
                m &= h[i : n - size + i] == h[n - size + i]
            hits = np.flatnonzero(m)
            if hits.size:
                start = int(hits[-1]) + size
                return h[start : min(start + limit, n)].tolist()
        return []

    def close(self) -> None:
        """Nothing to free."""


class DraftModel:
    """A small model sharing the target's vocabulary, drafting greedily.

    Args:
        path: its GGUF file.
        target: the target's ``llama_cpp.Llama`` (its vocabulary is compared).
        n_ctx: its context (the target's).
        threads: CPU threads.

    Raises:
        DraftModelError: the file cannot be loaded, or its vocabulary differs from the target's.
    """

    name = DRAFT

    def __init__(self, path: str | Path, target: llama_cpp.Llama, n_ctx: int, threads: int):
        p = Path(path)
        if not p.is_file():
            raise DraftModelError(f"The draft model {p} is not a file; give a GGUF model path after draft:.")
        try:
            vocab_only = llama_cpp.Llama(str(p), vocab_only=True, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise DraftModelError(f"The draft model {p} cannot be loaded ({exc}).") from exc
        try:
            why = vocabulary_mismatch(target, vocab_only)
        finally:
            vocab_only.close()
        if why:
            raise DraftModelError(f"The draft model {p} cannot draft for this model: {why}.")
        try:
            from engine.cpu import load_llama  # under the machine's repack decision, as every load

            self.llama, _ = load_llama(p, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                                       n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise DraftModelError(f"The draft model {p} cannot be loaded ({exc}).") from exc
        self.path = p
        self.history: list[int] = []
        self.n_vocab = self.llama.n_vocab()

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a reply after ``prompt``."""
        self.history = list(prompt)

    def push(self, token: int) -> None:
        """Append an emitted token."""
        self.history.append(token)

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` greedy tokens of the draft model after the history, stopping
        early when its own probability for its choice falls under ``DRAFT_MIN_P``."""
        llama, hist = self.llama, self.history
        if limit <= 0 or len(hist) + limit + 1 >= llama.n_ctx():
            return []
        keep = _common_prefix(llama.input_ids[: llama.n_tokens], hist)
        if keep == len(hist):  # evaluate at least the last token, to have its logits
            keep -= 1
        llama.n_tokens = keep
        llama.eval(hist[keep:])
        out: list[int] = []
        while len(out) < limit:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(self.n_vocab,))
            token = int(np.argmax(logits))
            top = float(logits[token])
            p = 1.0 / float(np.exp(logits.astype(np.float64) - top).sum())
            if p < DRAFT_MIN_P and out:
                break
            out.append(token)
            if len(out) < limit:
                llama.eval([token])
        return out

    def close(self) -> None:
        """Free the draft model."""
        self.llama.close()


def vocabulary_mismatch(a: llama_cpp.Llama, b: llama_cpp.Llama) -> str:
    """Why two models' vocabularies differ, in words ("" when they are the same: the same
    size, and the same text and attributes for every token, special tokens included)."""
    va, vb = llama_cpp.llama_model_get_vocab(a.model), llama_cpp.llama_model_get_vocab(b.model)
    na, nb = llama_cpp.llama_vocab_n_tokens(va), llama_cpp.llama_vocab_n_tokens(vb)
    if na != nb:
        return f"its vocabulary has {nb:,} tokens, this model's {na:,}"
    for name in ("bos", "eos", "eot"):
        special = getattr(llama_cpp, f"llama_vocab_{name}")
        if special(va) != special(vb):
            return f"its {name.upper()} token is {special(vb)}, this model's {special(va)}"
    for i in range(na):
        if (llama_cpp.llama_vocab_get_text(va, i) != llama_cpp.llama_vocab_get_text(vb, i)
                or llama_cpp.llama_vocab_get_attr(va, i) != llama_cpp.llama_vocab_get_attr(vb, i)):
            return f"token {i} differs ({_text(va, i)!r} here, {_text(vb, i)!r} there)"
    return ""


def _text(vocab, i: int) -> str:
    return (llama_cpp.llama_vocab_get_text(vocab, i) or b"").decode("utf-8", "replace")


def _common_prefix(a, b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


# -- the draft budget and the verification ----------------------------------------------------------


@dataclass
class Budget:
    """How many tokens to draft next, from how the last verifications went.

    On this CPU a batch of ``k + 1`` tokens costs about ``1 + k/2`` one-token steps (measured:
    ``branchwise bench``), so a draft pays only when more than about half of it is accepted.
    The budget doubles after a draft accepted whole (up to ``MAX_DRAFT``), drops to one more
    than what was accepted otherwise, and after two drafts in a row accepted less than half,
    drafting rests for ``rest`` steps (doubling each time it happens again, up to 32)."""

    size: int = 4
    poor: int = 0
    rest: int = 0
    pause: int = 2

    def limit(self) -> int:
        """Tokens to draft at this step (0: decode one token plainly)."""
        if self.rest > 0:
            self.rest -= 1
            return 0
        return self.size

    def update(self, drafted: int, accepted: int) -> None:
        """Record a verification of ``drafted`` tokens of which ``accepted`` were taken."""
        if accepted == drafted:
            self.size = min(MAX_DRAFT, max(self.size, drafted) * 2)
            self.poor, self.pause = 0, 2
            return
        self.size = max(2, accepted + 1)
        if 2 * accepted < drafted:
            self.poor += 1
            if self.poor >= 2:
                self.rest, self.poor = self.pause, 0
                self.pause = min(32, self.pause * 2)
        else:
            self.poor = 0


class Verifier:
    """Evaluates a verification batch with every position's logits (``llama_decode``
    directly: ``Llama.eval`` keeps only the last one's).

    Args:
        llama: the target's ``llama_cpp.Llama``.
    """

    def __init__(self, llama: llama_cpp.Llama):
        self.llama = llama
        self.batch = llama_cpp.llama_batch_init(MAX_DRAFT + 1, 0, 1)

    def run(self, tokens: list[int], sampler) -> list[int]:
        """Evaluate ``tokens`` (the last sampled token, then the draft; 2 or more) at the end
        of the context, and sample position by position with ``sampler`` (a
        ``llama_cpp.LlamaSampler``: each sample is also accepted into its state) while
        the samples equal the draft. Returns the samples: the accepted drafts, then one
        more (the first that differs, or the one after the whole draft). The context then
        holds ``tokens[0]`` and the accepted drafts; the caller cuts the rest.

        Raises:
            RuntimeError: llama_decode failed.
        """
        llama, b = self.llama, self.batch
        n, p = len(tokens), llama.n_tokens
        assert 2 <= n <= MAX_DRAFT + 1
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llama.ctx), 0, p, -1)
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p + i, 1, True
            b.seq_id[i][0] = 0
        rc = llama_cpp.llama_decode(llama.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        llama.input_ids[p : p + n] = tokens
        llama.n_tokens = p + n
        out: list[int] = []
        for i in range(n):
            s = llama_cpp.llama_sampler_sample(sampler.sampler, llama.ctx, i)
            out.append(s)
            if i + 1 >= n or s != tokens[i + 1]:
                break
        return out

    def close(self) -> None:
        """Free the batch."""
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None


class Speculation:
    """One engine's speculative decoding: its drafter, the verification batch, the budget.

    Args:
        setting: a :func:`parse`'d setting other than ``"none"``.
        llama: the target's ``llama_cpp.Llama``.
        threads: CPU threads for a draft model.

    Raises:
        DraftModelError: a ``draft:PATH`` model cannot be used.
    """

    def __init__(self, setting: str, llama: llama_cpp.Llama, threads: int):
        self.setting = setting
        kind = kind_of(setting)
        assert kind != NONE
        self.drafter = (PromptLookup(llama.n_ctx()) if kind == LOOKUP
                        else DraftModel(setting[len(DRAFT) + 1:], llama, llama.n_ctx(), threads))
        self.verifier = Verifier(llama)
        self.budget = Budget()
        self.always_batch = False
        """Make every decode step a batch of two or more (a one-token guess when there is no
        draft): the reply then depends on neither the drafter nor its luck, and its whole KV
        is a prefill's. About 1.7 times the cost of a plain step where nothing is drafted,
        so only the tests turn it on (tests/test_speculative.py compares it with decoding
        in two-token batches)."""

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a reply after ``prompt`` (a fresh budget)."""
        self.drafter.begin(prompt)
        self.budget = Budget()

    def close(self) -> None:
        """Free the drafter and the batch."""
        self.drafter.close()
        self.verifier.close()
