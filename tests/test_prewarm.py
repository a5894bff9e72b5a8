"""Zero-wait turns (engine/prewarm.py) on the real default model: whatever the prewarms did
(restores on open, draft prefills, edits of the draft, cancellations, branch switches), the
reply is the one computed from scratch; a prewarm never writes KV to the store; and a send
after a prewarm evaluates only what the prewarm could not know."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.prewarm import Prewarmer, prewarm_target, stable_prefix
from engine.settings import EngineSettings, SamplingParams
from storage.prefix_store import PrefixStore

GREEDY = SamplingParams(temperature=0, max_tokens=8)
SETTINGS = EngineSettings(n_ctx=2048)
STORY = ("A lighthouse keeper named Ada kept a logbook of every ship that passed. "
         "One winter night a ship without lights came close to the rocks. ") * 2
WORDS = ["What", "did", "Ada", "write", "in", "the", "logbook", "that", "night?", "Tell", "me",
         "about", "ship", "rocks,", "and", "why", "lights", "mattered."]


class _Countdown(threading.Event):
    """A cancel flag that turns on after ``n`` checks (a request arriving mid-prewarm)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


@pytest.fixture(scope="module")
def rig(model_path, tmp_path_factory):
    """An engine with a prefix store, a store-less reference engine, and two branches."""
    store = PrefixStore(tmp_path_factory.mktemp("prewarm") / "kvcache.sqlite3")
    engine = Engine(model_path, SETTINGS, store)
    reference = Engine(model_path, SETTINGS, None)
    engine.reference = reference
    base = [ChatMessage("system", "You are terse."), ChatMessage("user", STORY + "Who is Ada?")]
    r1 = engine.generate(base, GREEDY)
    one = base + [ChatMessage("assistant", r1.text, r1.token_ids)]
    other = [ChatMessage("system", "You are terse."), ChatMessage("user", STORY + "What came close?")]
    r2 = engine.generate(other, GREEDY)
    two = other + [ChatMessage("assistant", r2.text, r2.token_ids)]
    expected: dict = {}

    def scratch(messages):
        key = repr([(m.role, m.content, tuple(m.token_ids or ())) for m in messages])
        if key not in expected:
            reference.reset_context()
            expected[key] = reference.generate(messages, GREEDY, use_cache=False).token_ids
        return expected[key]

    yield engine, store, [one, two], scratch
    engine.close()
    reference.close()
    store.close()


def test_stable_prefix_stops_before_the_word_being_typed():
    assert stable_prefix("Tell me abo") == ("Tell me", " ")
    assert stable_prefix("Tell me about ") == ("Tell me", " ")  # "about" may still grow
    assert stable_prefix("one\n\ntwo") == ("one", "\n\n")
    assert stable_prefix("word") == ("", "")
    assert stable_prefix("") == ("", "")


def test_a_draft_target_is_a_token_prefix_of_what_is_finally_sent(rig):
    engine, _store, (path, _), _ = rig
    build = engine.model.prompts.build
    draft = "Tell me about the logbook tha"
    target = prewarm_target(build, path, draft, complete=False)
    sent = build(path + [ChatMessage("user", "Tell me about the logbook that night.")], True)
    opened = prewarm_target(build, path, "", complete=False)
    assert sent[: len(target)] == target
    assert len(opened) < len(target) < len(sent)
    assert sent[: len(opened)] == opened  # the path and the user header
    assert build(path, False) == opened[: len(build(path, False))]


def test_after_a_complete_prewarm_nothing_is_evaluated_and_the_reply_is_the_same(rig):
    engine, _store, (path, _), scratch = rig
    engine.reset_context()
    warm = Prewarmer(engine)
    text = "Why did the lights matter?"
    assert warm.run(path, "").finished
    r = warm.run(path, text[:14])
    assert r.finished and r.prefilled_tokens >= 2
    r = warm.run(path, text, complete=True)
    messages = path + [ChatMessage("user", text)]
    assert r.ready_tokens == r.target_tokens == len(engine.prompt_tokens(messages))
    result = engine.generate(messages, GREEDY)
    # the prewarm's last batch left the prompt's logits: the first token is sampled at once
    assert result.stats.restore_source == "context"
    assert result.stats.prefilled_tokens == 0
    assert result.token_ids == scratch(messages)
    ready = warm.account(result.stats)
    assert ready["prepared_tokens"] == result.stats.prompt_tokens
    assert 0 < ready["typed_tokens"] < ready["prepared_tokens"]


def test_hovering_regenerate_then_regenerating_evaluates_nothing_and_gives_the_same_reply(rig):
    engine, _store, (path, _), scratch = rig
    engine.reset_context()
    question = path[:-1]  # the reply is regenerated: its prompt ends at the user message
    assert Prewarmer(engine).run(question, None).finished
    result = engine.generate(question, GREEDY)
    assert result.stats.prefilled_tokens == 0
    assert result.token_ids == scratch(question)
    # the reply's last token was decoded alone: its logits are not a prefill's, so the
    # same prompt again is prefilled as before (two tokens, not zero)
    again = engine.generate(question, GREEDY)
    assert again.stats.prefilled_tokens == 2 and again.token_ids == result.token_ids


def test_a_prewarm_never_writes_to_the_store(rig):
    engine, store, (one, two), _ = rig
    engine.reset_context()
    before = store.stats()
    warm = Prewarmer(engine)
    for path in (one, two, one):
        warm.run(path, "")
        warm.run(path, "A new question about the ship", complete=True)
        warm.run(path[:-1], None)  # hovering Regenerate
    assert store.stats() == before


def test_a_cancelled_prewarm_stops_between_batches_and_keeps_what_it_computed(rig):
    engine, _store, (path, _), _ = rig
    engine.reset_context()
    r = Prewarmer(engine).run(path, "", cancel=_Countdown(1))
    assert not r.finished
    assert r.ready_tokens == engine.llama.n_tokens < r.target_tokens
    assert r.ready_tokens == r.restored_tokens + r.prefilled_tokens


def _live_kv(engine) -> bytes:
    """The live KV of the tokens the engine may reuse (``live.exact_upto``)."""
    n = engine.live.exact_upto
    if engine.llama.n_tokens > n:
        assert engine.live.truncate(n)
        assert engine.llama.n_tokens == n
    return bytes(engine.live.state_blob())


def _scratch_kv(engine) -> bytes:
    """The KV of the same tokens prefilled from scratch in one batch (the reference engine)."""
    ref = engine.reference
    ref.reset_context()
    tokens = list(engine.llama.input_ids[: engine.live.exact_upto])
    if tokens:
        ref.llama.eval(tokens)
    return bytes(ref.live.state_blob())


_draft = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join)
_step = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 1)),
    st.tuples(st.just("draft"), st.integers(0, 1), _draft, st.text("ab ", max_size=3), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 1), _draft, st.integers(0, 3)),
    st.tuples(st.just("regenerate"), st.integers(0, 1)),
    st.tuples(st.just("send"), st.integers(0, 1), _draft),
)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(_step, min_size=1, max_size=5), final=st.tuples(st.integers(0, 1), _draft))
def test_no_sequence_of_prewarms_changes_a_reply(rig, steps, final):
    engine, _store, paths, scratch = rig
    engine.reset_context()
    warm = Prewarmer(engine)
    for step in steps:
        kind, path = step[0], paths[step[1]]
        if kind == "open":
            warm.run(path, "")
        elif kind == "draft":
            warm.run(path, step[2] + step[3], complete=step[4])
        elif kind == "cancel":
            warm.run(path, step[2], cancel=_Countdown(step[3]))
        elif kind == "regenerate":
            warm.run(path[:-1], None)
        else:
            messages = path + [ChatMessage("user", step[2] or "Hi")]
            assert engine.generate(messages, GREEDY).token_ids == scratch(messages)
            warm.forget()
    assert _live_kv(engine) == _scratch_kv(engine)
    messages = paths[final[0]] + [ChatMessage("user", final[1] or "Hi")]
    assert engine.generate(messages, GREEDY).token_ids == scratch(messages)
