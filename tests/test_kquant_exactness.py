"""Exact restores on a K-quant model (Q4_K_M, the most common download format).

llama.cpp multiplies K-quant weights with its tiled kernel from 8 batch rows on and with
``vec_dot`` below that, and repacked K-quant weights four rows at a time and the rest one at
a time; each rounds differently, so a token's KV depended on the size of the batch it was
prefilled in, and a restored prefix could differ from a from-scratch prefill. The engine
now prefills such a model in batches of at least 8 tokens (``engine.cpu.min_batch``) with
repacking off under "auto". These tests use a tiny random-weight llama quantized to Q4_K_M
by llama.cpp itself (``tests/models.py``): random weights give many near ties, which is
what makes a differing bit show in the reply.
"""

from __future__ import annotations

import ctypes
import random

import llama_cpp
import numpy as np
import pytest

import models
from engine import cpu
from engine.chat_engine import GenerationStats
from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.gguf_meta import layer_weight_types
from engine.settings import EngineSettings, SamplingParams
from storage.prefix_store import PrefixStore

GREEDY = SamplingParams(temperature=0, max_tokens=24)
MIN_BATCH = 8  # what the engine must use for this model (engine.cpu.min_batch)
TEXT = ("The ferry left the harbour at dawn, and the keeper of the lighthouse counted the gulls "
        "that followed it out past the rocks. ") * 6


@pytest.fixture(scope="module")
def kquant(tmp_path_factory, model_path):
    return models.build_k_quant_llama(tmp_path_factory.mktemp("kquant") / "tiny-q4km.gguf", model_path)


def _state(llama) -> bytes:
    n = llama_cpp.llama_state_seq_get_size(llama.ctx, 0)
    buf = np.empty(n, np.uint8)
    llama_cpp.llama_state_seq_get_data(llama.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), n, 0)
    return buf.tobytes()


def _split_states(llama, tokens: list[int], smallest: int, trials: int = 8) -> list[list[int]]:
    """The splits of ``tokens`` into batches of >= ``smallest`` whose KV differs from one batch's."""
    mem = llama_cpp.llama_get_memory(llama.ctx)

    def fresh() -> None:
        llama_cpp.llama_memory_clear(mem, True)
        llama.n_tokens = 0

    fresh()
    llama.eval(tokens)
    whole = _state(llama)
    rng, bad = random.Random(7), []
    for _ in range(trials):
        cuts, i = [], 0
        while len(tokens) - i >= 2 * smallest:
            cuts.append(rng.randint(smallest, min(len(tokens) - i - smallest, 40)))
            i += cuts[-1]
        cuts.append(len(tokens) - i)
        fresh()
        for start, size in zip(np.cumsum([0, *cuts[:-1]]), cuts):
            llama.eval(tokens[start : start + size])
        if _state(llama) != whole:
            bad.append(cuts)
    return bad


def test_the_model_is_recognised_and_repacking_stays_off(kquant):
    types = layer_weight_types(kquant)
    assert types and {12, 14} <= types  # Q4_K and Q6_K layer weights
    assert cpu.min_batch(types) == 8
    decision = cpu.decide_repack("auto", None, "CPU : AVX2 = 1 | REPACK = 1 |", False, types)
    assert not decision.repack and "K-quant" in decision.reason


def test_batches_of_eight_or_more_give_the_kv_of_one_batch_and_smaller_ones_do_not(kquant):
    llama, _ = cpu.load_llama(kquant, force=False, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=1,
                              n_threads_batch=1, verbose=False)
    try:
        tokens = llama.tokenize(TEXT.encode(), add_bos=True)[:150]
        assert _split_states(llama, tokens, smallest=8) == []
        assert _split_states(llama, tokens, smallest=2) != []  # the rule is needed, and this test can fail
    finally:
        llama.close()


def test_a_restored_continuation_equals_one_computed_from_scratch(kquant, tmp_path):
    store = PrefixStore(tmp_path / "kvcache.sqlite3")
    engine = Engine(kquant, EngineSettings(n_ctx=2048), store)
    try:
        assert engine.live.min_batch == MIN_BATCH and not engine.model.repack.repack
        history = [ChatMessage("user", TEXT + "What did the keeper count?")]
        for question in ("Why?", "And then?", "Where did the ferry go?"):
            reply = engine.generate(history, GREEDY)  # stored; the next turn's prompt holds it
            engine.reset_context()
            again = engine.generate(history, GREEDY, snapshot=False)  # a regenerate: all but 8 restored
            assert again.stats.restore_source == "store" and again.stats.prefilled_tokens == MIN_BATCH
            assert again.token_ids == reply.token_ids
            # the KV itself: restored, the rest prefilled as a regenerate does it, is bit for bit
            # what one from-scratch batch computes (with batches of 2 it was not)
            prompt = engine.prompt_tokens(history)
            engine.reset_context()
            engine.position(prompt, GenerationStats())
            assert engine.live.n_tokens == len(prompt) - MIN_BATCH
            engine.live.evaluate_all(prompt[engine.live.n_tokens:])
            restored = _state(engine.llama)
            engine.reset_context()
            engine.llama.eval(prompt)
            assert restored == _state(engine.llama)
            history += [ChatMessage("assistant", reply.text, reply.token_ids), ChatMessage("user", question)]
            engine.reset_context()
            cached = engine.generate(history, GREEDY, snapshot=False)  # the turn, after a restore
            assert cached.stats.restore_source == "store" and cached.stats.prefilled_tokens >= MIN_BATCH
            engine.reset_context()
            scratch = engine.generate(history, GREEDY, use_cache=False, snapshot=False)
            assert cached.token_ids == scratch.token_ids
    finally:
        engine.close()
        store.close()
