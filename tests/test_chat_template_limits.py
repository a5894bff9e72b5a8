"""Chat templates are data from a downloaded file: rendering is bounded in time and size,
broken templates are readable load errors, and a template that drops the user's text is
replaced by ChatML with a stated reason (issue #16.2, #11.8). No model needed."""

from __future__ import annotations

import time

import pytest

from engine.chat_template import (
    CHATML_STOP_STRINGS,
    RENDER_TIME_LIMIT_S,
    ChatMessage,
    PromptBuilder,
    PromptFormat,
    StopMatcher,
    TemplateLoadError,
    template_from_metadata,
)
from engine.errors import ModelLoadError, TemplateError


def _chars(text: str, _special: bool) -> list[int]:
    return [ord(c) for c in text]


USER = [ChatMessage("user", "What is 2+2?")]

HOSTILE = {
    "nested range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                    "{{ messages[0].content }}",
    "huge repeat": "{{ 'x' * 10**8 }}{{ messages[0].content }}",
    "huge power": "{{ 2 ** 10000000 }}{{ messages[0].content }}",
    "power tower": "{{ ((10 ** 4000) ** 4000) ** 4000 }}{{ messages[0].content }}",
    "squaring loop": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
                     "{% endfor %}{{ messages[0].content }}",
    "concat doubling": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ messages[0].content }}",
    "filter width": "{{ 'x'|center(1000000000) }}{{ messages[0].content }}",
    "method width": "{{ 'x'.ljust(1000000000) }}{{ messages[0].content }}",
    "format width": "{{ '{:>1000000000}'.format(1) }}{{ messages[0].content }}",
    "percent width": "{{ '%0*d' % (1000000000, 1) }}{{ messages[0].content }}",
    "replace bomb": "{{ ('x' * 1000000)|replace('x', 'xxxxxxxxxxxxxxxx') }}{{ messages[0].content }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}{{ messages[0].content }}",
    "fan-out": "{% macro f(n) %}{% if n < 40 %}{{ f(n+1) }}{{ f(n+1) }}{% endif %}{% endmacro %}{{ f(0) }}",
    "empty nested loops": "{% set l = [0,1,2,3,4,5,6,7,8,9] * 10 %}{% for a in l %}{% for b in l %}"
                          "{% for c in l %}{% for d in l %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_a_load_error_within_the_budget(name):
    t0 = time.monotonic()
    with pytest.raises(TemplateLoadError) as err:
        PromptBuilder(HOSTILE[name], _chars)
    elapsed = time.monotonic() - t0
    # Not a speed target: a hang guard. The budget is checked from inside the render, so
    # the error comes at the budget plus one check interval, not minutes later.
    assert elapsed < RENDER_TIME_LIMIT_S * 10, elapsed
    assert isinstance(err.value, ModelLoadError) and isinstance(err.value, TemplateError)
    assert "use another model file" in str(err.value).lower()


def test_the_time_budget_names_itself():
    with pytest.raises(TemplateLoadError, match=r"took more than 2 s to render"):
        PromptBuilder(HOSTILE["nested range"], _chars)


def test_size_limit_names_the_size():
    with pytest.raises(TemplateLoadError, match=r"100,000,000 characters"):
        PromptBuilder(HOSTILE["huge repeat"], _chars)


def test_syntax_error_is_a_readable_load_error():
    with pytest.raises(TemplateLoadError, match=r"syntax error \(line 1: .*\), so the model cannot be used"):
        PromptBuilder("{% if %}", _chars)


def test_sandbox_still_blocks_python_internals():
    pb = PromptBuilder("{{ ''.__class__.__mro__ }}{{ messages[0].content }}", _chars)
    with pytest.raises(TemplateError, match="unsafe"):
        pb.render(USER)


@pytest.mark.parametrize("template", ["", "   ", "\n\t \n"])
def test_blank_template_falls_back_to_chatml_with_a_reason(template):
    pb = PromptBuilder(template, _chars)
    assert pb.format is PromptFormat.CHATML_FALLBACK
    assert "blank" in pb.note and "ChatML" in pb.note
    assert "What is 2+2?" in pb.render(USER)
    assert pb.stop_strings == CHATML_STOP_STRINGS


def test_template_that_drops_the_users_text_falls_back():
    pb = PromptBuilder("{% for m in messages %}<turn>{% endfor %}", _chars)
    assert pb.format is PromptFormat.CHATML_FALLBACK
    assert "leaves out the user's message" in pb.note
    ids = pb.build(USER)
    assert "What is 2+2?" in "".join(map(chr, ids))


def test_missing_template_says_so_and_stops_at_chatml_markers():
    pb = PromptBuilder(None, _chars)
    assert pb.format is PromptFormat.CHATML_FALLBACK
    assert pb.note.startswith("The model file has no chat template")
    assert pb.stop_matcher() is not None


def test_a_working_template_is_used_as_is():
    pb = PromptBuilder("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>", _chars)
    assert pb.format is PromptFormat.MODEL_TEMPLATE and pb.note == "" and pb.stop_matcher() is None
    assert pb.render(USER) == "<|user|>What is 2+2?<|assistant|>"


def test_long_conversation_renders_within_the_budget():
    """1,000 messages through a ChatML-like template: far inside the limits."""
    msgs = [ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i} " * 20) for i in range(1000)]
    pb = PromptBuilder("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", _chars)
    text = pb.render(msgs)
    assert text.count("<|im_start|>") == 1001


def test_non_utf8_metadata_recovers_the_template_or_says_why():
    raw = {"tokenizer.chat_template": b"{{ messages[0].content }}"}
    assert template_from_metadata({}, raw.get) == ("{{ messages[0].content }}", "")
    text, why = template_from_metadata({}, {"tokenizer.chat_template": b"\xff{{ x }}"}.get)
    assert text is None and "not valid UTF-8" in why
    text, why = template_from_metadata({}, {}.get)
    assert text is None and "UTF-8" in why and "no chat template" in why
    assert template_from_metadata({"general.name": "x"}, {}.get) == (None, "")
    pb = PromptBuilder(None, _chars, missing_reason=why)
    assert pb.note.startswith(why)


# -- stop strings -------------------------------------------------------------------------


def _stream(pieces: list[str]) -> tuple[str, StopMatcher, list[str]]:
    m = StopMatcher(CHATML_STOP_STRINGS)
    shown = []
    for p in pieces:
        shown.append(m.feed(p))
        if m.hit:
            break
    else:
        shown.append(m.flush())
    return "".join(shown), m, shown


def test_stop_string_never_reaches_the_screen_even_split_across_tokens():
    text, m, shown = _stream(["Four", ".", "<", "|", "im", "_end", "|>", "\n<|im_start|>user"])
    assert text == "Four." and m.hit and m.text == "Four."
    assert all("<" not in s for s in shown)


def test_partial_marker_is_released_when_it_is_not_a_marker():
    text, m, _ = _stream(["a <", "b", " <|i", "x"])
    assert text == "a <b <|ix" and not m.hit


def test_partial_marker_at_the_end_is_flushed():
    text, m, _ = _stream(["ends with <|im"])
    assert text == "ends with <|im" and not m.hit


def test_cut_ids_spell_exactly_the_text_before_the_stop():
    pieces = ["Hi", " there", ".<", "|im_end|>"]
    ids = [1, 2, 3, 4]
    m = StopMatcher(CHATML_STOP_STRINGS)
    for p in pieces:
        m.feed(p)
    assert m.hit
    kept, n = m.cut_ids(ids, _chars)
    assert n == 2 and kept == [1, 2, ord(".")]
    assert m.text == "Hi there."
