"""The decode loop of one reply: sample, stream, stop; one token a step, or a verified draft
(:mod:`engine.speculative`) when the engine has speculative decoding on.

Invariant at the end, as plain decoding leaves it: the live context holds the prompt and the
reply's ids, except the last id when it was never evaluated (a reply cut by ``max_tokens``,
the context or a stop string). Rejected drafts and accepted drafts past the reply's end are
cut off (``LiveContext.truncate``).
"""

from __future__ import annotations

import codecs
import collections
import random
import time
from typing import TYPE_CHECKING

import llama_cpp

from engine import cpu
from engine.chat_engine import GenerationStats
from engine.settings import SamplingParams
from engine.speculative import MAX_DRAFT, Speculation

if TYPE_CHECKING:
    from engine.core import Engine


def decode_reply(engine: Engine, sp: SamplingParams, stats: GenerationStats, t0: float,
                 on_token, cancel, grammar: str | None = None) -> tuple[str, list[int]]:
    """Generate the reply after the prompt the live context holds (its logits are the
    prompt's last token's). ``t0`` is the request's ``perf_counter()`` start (for
    ``stats.ttft_ms``). Returns ``(text, ids)``; ``stats`` gets the counts, speeds,
    ``finish_reason`` and the drafted/accepted tokens.

    ``grammar`` (GBNF text; else the engine's test grammar, ``engine.grammar``) constrains
    sampling, and ``engine.steer`` (``engine.reasoning.ReasoningSteer``) may force the
    tokens that close a reasoning model's thinking when its budget ran out. Either turns
    speculative decoding off for the reply: a draft is not checked against them."""
    import llama_cpp

    from engine.tool_grammar import check_grammar

    llama, live, model = engine.llama, engine.live, engine.model
    steer = engine.steer
    constrained = grammar is not None or engine.grammar is not None or (steer is not None and steer.budget is not None)
    spec: Speculation | None = None if constrained else engine.speculation
    cpu.debug_crash("before-first-token")
    if grammar:  # one llama.cpp cannot build would crash the process at the first token
        check_grammar(llama_cpp.llama_model_get_vocab(llama.model), grammar)
    llama.set_seed(sp.seed if sp.seed is not None else random.getrandbits(31))
    sampler = llama._init_sampler(
        top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, temp=sp.temperature,
        repeat_penalty=sp.repeat_penalty,
        grammar=llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) if grammar else engine.grammar,
    )
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    stop = model.prompts.stop_matcher()  # None unless the prompt format needs stop strings
    ids: list[int] = []
    parts: list[str] = []
    n_ctx = llama.n_ctx()
    n_prompt = llama.n_tokens
    exact_run = live.exact_upto >= n_prompt  # every reply token so far evaluated in a batch of >= 2
    pending: collections.deque[int] = collections.deque()  # sampled by a verification, not yet emitted
    if spec is not None:
        spec.begin(live.ids().tolist())
        stats.speculative = spec.setting
    t_first = None
    stats.finish_reason = "length"
    while len(ids) < sp.max_tokens:
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            break
        forced = steer.forced() if steer is not None and not pending else None  # a thinking budget ran out
        if forced is not None:
            token = forced
            sampler.accept(forced)
        else:
            token = pending.popleft() if pending else llama_cpp.llama_sampler_sample(sampler.sampler, llama.ctx, -1)
        if t_first is None:
            t_first = time.perf_counter()
            stats.ttft_ms = (t_first - t0) * 1000
        if model.is_end_of_turn(token):
            stats.finish_reason = "stop"
            break
        ids.append(token)
        if spec is not None:
            spec.drafter.push(token)
        delta = decoder.decode(model.token_bytes(token))
        if stop is not None:  # hold back what may be a stop string's start
            delta = stop.feed(delta)
        parts.append(delta)
        if on_token:
            on_token(delta, token)
        if stop is not None and stop.hit:
            ids = _end_at_stop(engine, stop, ids, n_prompt)
            stats.finish_reason = "stop"
            break
        if len(ids) >= sp.max_tokens:
            break
        if n_prompt + len(ids) >= n_ctx:
            stats.finish_reason = "context"
            break
        if pending:  # an accepted draft: its KV is in the context already
            continue
        limit = 0 if spec is None else min(spec.budget.limit(), MAX_DRAFT, sp.max_tokens - len(ids),
                                           n_ctx - llama.n_tokens - 2)
        draft = spec.drafter.draft(limit) if limit > 0 else []
        drafted = len(draft)
        if not draft and spec is not None and spec.always_batch and llama.n_tokens + 2 < n_ctx:
            draft = [token]  # a guess, so that this step too is a batch of two (tests)
        if not draft:
            live.evaluate([token])
            exact_run = False
            continue
        n_before = llama.n_tokens
        out = spec.verifier.run([token, *draft], sampler)
        accepted = len(out) - 1
        if drafted:
            stats.drafted_tokens += drafted
            stats.accepted_tokens += accepted
            spec.budget.update(drafted, accepted)
        live.truncate(n_before + 1 + accepted)  # the rejected drafts' KV goes
        exact_run = exact_run and 1 + len(draft) >= live.min_batch
        if exact_run:  # batches of >= min_batch after an exact prefix compute a prefill's KV
            live.exact_upto = llama.n_tokens
        pending.extend(out)
    # Accepted drafts past the reply's end (its end of turn, or max_tokens) go, and as after
    # plain decoding the last id of a reply cut by max_tokens or the context has no KV.
    keep = n_prompt + len(ids) - (1 if stats.finish_reason in ("length", "context") and ids else 0)
    if llama.n_tokens > keep:
        live.truncate(keep)
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


def _end_at_stop(engine: Engine, stop, ids: list[int], n_prompt: int) -> list[int]:
    """The reply's ids once ``stop`` met a stop string: those that spell the text before
    it (``StopMatcher.cut_ids``); the live context drops the KV of the rest."""
    kept, n_evaluated = stop.cut_ids(ids, engine.model.tokenize)
    n = min(n_prompt + n_evaluated, engine.llama.n_tokens)
    if not engine.live.truncate(n):
        engine.live.clear()
    return kept
