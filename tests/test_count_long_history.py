"""A count of a chat too long for the chat template's limits (50,001 messages): the engine
process answers every count request with a figure over the context window (for the "This
chat is too long" dialog), never with an error (50,001 messages pass the render time limit even on an idle machine). Real default model, real child process."""

from __future__ import annotations

from engine import events as ev
from engine.chat_template import ChatMessage
from engine.settings import EngineSettings
from engine.worker import EngineProcess

SETTINGS = EngineSettings(n_ctx=2048)
N_MESSAGES = 50_000
HISTORY = [ChatMessage("user" if i % 2 == 0 else "assistant", f"message number {i} of a long chat")
           for i in range(N_MESSAGES)] + [ChatMessage("user", "And now?")]


def _answers(proc: EngineProcess, n: int) -> dict:
    got = {}
    while len(got) < n:
        e = proc.recv(timeout=300)
        assert e is not None, "the engine did not answer"
        if isinstance(e, (ev.CountEvent, ev.ErrorEvent)) and e.id is not None:
            got[e.id] = e
    return got


def test_counts_of_a_history_too_long_for_the_template_say_how_long(model_path, tmp_path):
    proc = EngineProcess(tmp_path)
    proc.start()
    try:
        proc.send(ev.LoadRequest(str(model_path), SETTINGS.to_dict()))
        while not isinstance(proc.recv(timeout=300), ev.LoadedEvent):
            pass
        proc.send(ev.CountRequest(1, HISTORY))
        proc.send(ev.CountRequest(2, HISTORY, per_message=True))
        proc.send(ev.CountRequest(3, HISTORY[:-1], draft="And now?"))
        got = _answers(proc, 3)
    finally:
        proc.stop()
    whole, each, draft = got[1], got[2], got[3]
    assert isinstance(whole, ev.CountEvent) and isinstance(each, ev.CountEvent) and isinstance(draft, ev.CountEvent)
    # "message number 1234 of a long chat" is 9+ tokens: 50,001 messages hold well over 90,000
    assert whole.n_ctx == 2048 and whole.prompt_tokens > 90_000
    assert len(each.message_tokens) == N_MESSAGES + 1 and min(each.message_tokens) >= 3
    assert each.prompt_tokens == sum(each.message_tokens) >= whole.prompt_tokens
    assert draft.prompt_tokens > 90_000 and len(draft.message_tokens) == 1 and draft.message_tokens[0] > 0
