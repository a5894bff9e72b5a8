"""The engine process and prewarms (engine/worker.py): any other request interrupts a prewarm
between batches and reuses what it computed; a newer prewarm replaces an older one; a count
or coverage request lets it resume afterwards. Real default model, real child process."""

from __future__ import annotations

from engine import events as ev
from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.settings import EngineSettings, SamplingParams
from engine.worker import EngineProcess

SETTINGS = EngineSettings(n_ctx=4096)
GREEDY = SamplingParams(temperature=0, max_tokens=8)
STORY = ("A lighthouse keeper named Ada kept a logbook of every ship that passed. "
         "One winter night a ship without lights came close to the rocks. ")
PATH = [ChatMessage("system", "You are terse."), ChatMessage("user", STORY + "Who is Ada?"),
        ChatMessage("assistant", "The keeper.")]
LONG_DRAFT = STORY * 12 + "So what did she"


def _until(proc: EngineProcess, done) -> list:
    events = []
    while True:
        e = proc.recv(timeout=300)
        assert e is not None, "the engine did not answer"
        events.append(e)
        if done(e):
            return events


def _answer(events, rid: int):
    return next(e for e in events if isinstance(e, ev.PrewarmEvent) and e.id == rid).result


def _loaded(model_path, tmp_path) -> EngineProcess:
    """An engine child process with the default model loaded (the caller stops it)."""
    proc = EngineProcess(tmp_path)
    proc.start()
    try:
        proc.send(ev.LoadRequest(str(model_path), SETTINGS.to_dict()))
        _until(proc, lambda e: isinstance(e, ev.LoadedEvent))
    except BaseException:
        proc.stop()
        raise
    return proc


def test_a_send_interrupts_a_draft_prewarm_and_reuses_its_tokens(model_path, tmp_path):
    proc = _loaded(model_path, tmp_path)
    try:
        proc.send(ev.PrewarmRequest(1, PATH, ""))
        opened = _answer(_until(proc, lambda e: isinstance(e, ev.PrewarmEvent)), 1)
        assert opened["finished"] and opened["ready_tokens"] == opened["target_tokens"] > 0

        sent = PATH + [ChatMessage("user", LONG_DRAFT + " see?")]
        proc.send(ev.PrewarmRequest(2, PATH, STORY * 12 + "Which ship"))  # replaced by the next one
        proc.send(ev.PrewarmRequest(3, PATH, LONG_DRAFT))
        proc.send(ev.GenerateRequest(4, sent, GREEDY.to_dict()))
        events = _until(proc, lambda e: isinstance(e, ev.SnapshotEvent))
        older, typing = _answer(events, 2), _answer(events, 3)
        # ~350 tokens each in batches of 32: the next request came first
        assert not older["finished"] and not typing["finished"]
        done = next(e for e in events if isinstance(e, ev.DoneEvent))
        s = done.stats
        assert s["restore_source"] == "context"
        ready = max(opened["ready_tokens"], older["ready_tokens"], typing["ready_tokens"])
        assert s["restored_tokens"] == ready  # all that the prewarms computed, nothing more
        assert s["prepared_tokens"] == ready
        assert s["typed_tokens"] == ready - opened["ready_tokens"]
        assert s["restored_tokens"] + s["prefilled_tokens"] == s["prompt_tokens"]
    finally:
        proc.stop()
    reference = Engine(model_path, SETTINGS, None)
    try:
        assert done.token_ids == reference.generate(sent, GREEDY, use_cache=False).token_ids
    finally:
        reference.close()


def test_a_count_interrupts_a_prewarm_which_then_resumes(model_path, tmp_path):
    proc = _loaded(model_path, tmp_path)
    try:
        proc.send(ev.PrewarmRequest(1, PATH, LONG_DRAFT))
        proc.send(ev.CountRequest(2, PATH))
        events = _until(proc, lambda e: isinstance(e, ev.PrewarmEvent))
        assert any(isinstance(e, ev.CountEvent) for e in events)  # answered first
        r = _answer(events, 1)
        assert r["finished"] and r["ready_tokens"] == r["target_tokens"] > 300
    finally:
        proc.stop()
