"""A dense restore goes to llama.cpp in pieces, each joining sequence 0 after the cells
before it (engine/cache_strategy/base.py ``restore_blocks``, engine/live_context.py
``LiveContext.append``). On the real default model: the state restored in pieces is the
original byte for byte, a branch switch copies only the blocks after what the branches
share, and a damaged block in a later piece stops the restore there."""

from __future__ import annotations

import sqlite3
import threading

import pytest

import engine.cache_strategy.base as strategy
from engine.chat_engine import GenerationStats
from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.settings import SamplingParams
from storage.parallel import in_halves, pipelined
from test_engine import SETTINGS, engine, store  # noqa: F401 (fixtures)

GREEDY = SamplingParams(temperature=0, max_tokens=16)
STORY = ("A lighthouse keeper named Ada kept a logbook of every ship that passed. "
         "One winter night a ship without lights came close to the rocks. ") * 16


@pytest.fixture
def one_block_a_piece(monkeypatch):
    monkeypatch.setattr(strategy, "RESTORE_PIECE_BYTES", 1)  # every block is a piece of its own


def _state(engine) -> bytes:
    return bytes(engine.live.state_blob())


def _scratch_state(engine, tokens: list[int]) -> bytes:
    engine.reset_context()
    engine.llama.eval(tokens)  # one batch, from scratch
    return _state(engine)


def _scratch_reply(engine, messages):
    engine.reset_context()
    return engine.generate(messages, GREEDY, use_cache=False, snapshot=False)


def test_a_state_restored_in_pieces_is_the_original_byte_for_byte(engine, one_block_a_piece):
    msgs = [ChatMessage("user", STORY + "Summarise.")]
    engine.generate(msgs, GREEDY)
    prompt = engine.prompt_tokens(msgs)
    match = engine.store.lookup(engine.fingerprint, prompt, count=False)
    assert len(match.blocks) >= 8
    engine.reset_context()
    n, dropped = engine.cache.restore(match)
    assert (n, dropped) == (match.n_tokens, 0)
    assert engine.cache.last_restore.pieces == len(match.blocks)
    engine.live.adopt(prompt[:n])
    restored = _state(engine)
    assert restored == _scratch_state(engine, prompt[:n])


def test_switching_branch_copies_only_the_blocks_after_what_the_branches_share(engine, one_block_a_piece):
    history = [ChatMessage("user", STORY + "What did Ada see?")]
    first = engine.generate(history, GREEDY)
    history.append(ChatMessage("assistant", first.text, first.token_ids))
    branch_a = history + [ChatMessage("user", "Who was Ada? " + STORY)]
    engine.generate(branch_a, GREEDY)  # stored, then the live context moves on
    branch_b = history + [ChatMessage("user", "What colour was the lighthouse?")]
    engine.generate(branch_b, GREEDY)  # the live context now holds branch B
    shared = len(engine.prompt_tokens(history))
    follow_a = branch_a + [ChatMessage("assistant", "It is not said."), ChatMessage("user", "And then?")]
    r = engine.generate(follow_a, GREEDY)
    timing = engine.cache.last_restore
    assert r.stats.restore_source == "store"
    # kept: the live tokens up to the start of the block the shared prefix ends in
    assert shared - 64 < timing.kept_tokens <= shared and timing.kept_tokens % 64 == 0
    assert timing.pieces == -(-(r.stats.restored_tokens - timing.kept_tokens) // 64)
    assert r.token_ids == _scratch_reply(engine, follow_a).token_ids


def test_the_live_context_after_a_switch_is_a_from_scratch_prefill(engine):
    history = [ChatMessage("user", STORY + "What did Ada see?"), ChatMessage("assistant", "A ship.")]
    long_branch = history + [ChatMessage("user", STORY + "Why?")]
    engine.generate(long_branch, GREEDY)
    engine.generate(history + [ChatMessage("user", "Where?")], GREEDY)  # live: the short branch
    prompt = engine.prompt_tokens(long_branch)
    stats = GenerationStats()
    engine.position(prompt, stats)
    n = engine.live.n_tokens
    assert stats.restore_source == "store" and n == len(prompt) - 2
    assert engine.cache.last_restore.kept_tokens > 0
    assert _state(engine) == _scratch_state(engine, prompt[:n])


def test_a_damaged_block_in_a_later_piece_stops_the_restore_there(model_path, store, tmp_path, one_block_a_piece):
    e = Engine(model_path, SETTINGS, store)
    msgs = [ChatMessage("user", STORY + "Summarise.")]
    first = e.generate(msgs, GREEDY)
    db = sqlite3.connect(tmp_path / "kvcache.sqlite3")
    (key,) = db.execute("SELECT key FROM blocks WHERE start=192").fetchone()
    db.close()
    file = tmp_path / "kvcache.sqlite3-blocks" / key.hex()
    data = bytearray(file.read_bytes())
    data[len(data) // 3] ^= 0x21
    file.write_bytes(bytes(data))
    e.reset_context()
    again = e.generate(msgs, GREEDY)
    assert again.stats.cache_blocks_dropped >= 1
    assert again.stats.restored_tokens == 192  # the three blocks (pieces) before the damage
    assert again.token_ids == first.token_ids
    e.close()


# -- storage.parallel.pipelined -------------------------------------------------------------


def test_pipelined_consumes_in_order_and_prepares_the_next_item_meanwhile():
    seen, threads = [], {}

    def produce(i):
        threads[i] = threading.current_thread().name
        return i * 10

    def consume(i, item):
        seen.append((i, item))
        return True

    assert pipelined(produce, consume, 5) == 5
    assert seen == [(i, i * 10) for i in range(5)]
    assert threads[0] == threading.current_thread().name
    assert all(threads[i].startswith("branchwise-copy") for i in range(1, 5))


def test_pipelined_stops_at_the_first_refusal_and_waits_for_the_helper():
    produced, finished = [], threading.Event()

    def produce(i):
        produced.append(i)
        if i == 3:
            finished.wait(5)
        return i

    def consume(i, item):
        if i == 2:
            finished.set()
            return False
        return True

    assert pipelined(produce, consume, 6) == 2
    assert produced == [0, 1, 2, 3]  # item 3 was being prepared; nothing after it


def test_in_halves_on_the_helper_thread_runs_there_instead_of_waiting_for_itself():
    def produce(i):
        return sum(in_halves(lambda part: [x * 2 for x in part], list(range(100)), 1 << 30))

    assert pipelined(produce, lambda i, item: item == 9900, 3) == 3


def test_pipelined_raises_what_produce_raised_after_the_items_before_it():
    seen = []

    def produce(i):
        if i == 2:
            raise ValueError("bad piece")
        return i

    with pytest.raises(ValueError, match="bad piece"):
        pipelined(produce, lambda i, item: seen.append(i) or True, 4)
    assert seen == [0, 1]
