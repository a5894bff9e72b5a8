"""The prompt builder's token cache (engine/chat_template.py TokenCache): a prompt built
again tokenizes only its newest segment, and the ids are the same as without the cache,
on the real default model."""

from __future__ import annotations

import pytest

from engine.chat_template import ChatMessage, PromptBuilder, TokenCache
from engine.model import LoadedModel
from engine.settings import EngineSettings

HISTORY = " ".join(f"Sentence {i} about the harbour, its keeper and the ships <b>{i}</b> [{i}]." for i in range(200))


@pytest.fixture(scope="module")
def model(model_path):
    m = LoadedModel(model_path, EngineSettings(n_ctx=4096))
    yield m
    m.close()


def path(draft: str) -> list[ChatMessage]:
    return [
        ChatMessage("system", "You are terse. " * 30),
        ChatMessage("user", HISTORY),
        ChatMessage("assistant", "Noted.", token_ids=[2, 3, 4]),
        ChatMessage("user", "And the lighthouse? " * 20 + draft),
    ]


def test_a_rebuilt_prompt_tokenizes_only_what_changed_and_equals_an_uncached_build(model):
    calls: list[str] = []

    def counting(text: str, special: bool) -> list[int]:
        calls.append(text)
        return model.tokenize(text, special)

    cached = PromptBuilder(model.template_text, counting, bos_id=model.prompts.bos_id,
                           add_bos=model.prompts.add_bos)
    first = cached.build(path("Tell me"))
    n_first = len(calls)
    calls.clear()
    second = cached.build(path("Tell me more, please"))
    long_calls = [c for c in calls if len(c) >= 256]
    assert len(long_calls) == 1 and long_calls[0].endswith("Tell me more, please<|im_end|>\n<|im_start|>assistant\n")
    assert n_first > len(calls)
    plain = PromptBuilder(model.template_text, model.tokenize, bos_id=model.prompts.bos_id,
                          add_bos=model.prompts.add_bos)
    plain._tokenize = model.tokenize  # no cache at all
    assert first == plain.build(path("Tell me"))
    assert second == plain.build(path("Tell me more, please"))


def test_the_cache_keeps_at_most_its_budget_of_characters():
    cache = TokenCache(lambda text, special: [len(text)], max_chars=1000)
    for i in range(10):
        assert cache("x" * 300 + str(i), False) == [301]
    assert cache._chars <= 1000 and len(cache._entries) == 3
    assert cache("x" * 300 + "9", False) == [301] and cache.hits == 1
    assert cache("short", True) == [5] and len(cache._entries) == 3  # short texts are not kept
