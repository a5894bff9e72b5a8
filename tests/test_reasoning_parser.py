"""The reasoning parser (engine/reasoning.py): formats, tags split anywhere, UTF-8 split
over tokens, and format detection from templates and vocabularies. No model needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.reasoning import (
    ANSWER,
    NO_REASONING,
    REASONING,
    ReasoningFormat,
    ReasoningParser,
    ReasoningSplitter,
    ReasoningSyntax,
    detect_syntax,
    parse,
    special_ids,
)

TEMPLATES = Path(__file__).parent / "data" / "templates"
THINK = ReasoningSyntax(ReasoningFormat.THINK, "<think>", "</think>")
THINK_OPEN = ReasoningSyntax(ReasoningFormat.THINK, "<think>", "</think>", starts_open=True)
BRACKET = ReasoningSyntax(ReasoningFormat.BRACKET, "[THINK]", "[/THINK]")
HARMONY = ReasoningSyntax(ReasoningFormat.HARMONY, field="thinking")


def test_think_block_at_the_start_is_reasoning():
    assert parse(THINK, ["<think>\nLet me add: 2+2=4.\n</think>\n\nIt is 4."]) == ("Let me add: 2+2=4.", "It is 4.")


def test_a_reply_without_a_block_is_unchanged():
    for text in ["  Hello <think> world", "\n\nPlain answer.\n", "", "<thin", "<b>bold</b>"]:
        assert parse(THINK, [text]) == (None, text)
        assert parse(NO_REASONING, [text]) == (None, text)


def test_a_think_tag_inside_the_answer_stays_answer_text():
    text = "Use the <think> tag like <think>this</think>."
    assert parse(THINK, [text]) == (None, text)
    assert parse(THINK, ["<think>a</think>Then write <think>x</think>"]) == ("a", "Then write <think>x</think>")


def test_a_special_open_token_opens_reasoning_anywhere():
    assert parse(THINK, ["Sure. ", ("<think>",), "hmm", ("</think>",), " ok"]) == ("hmm", "Sure. ok")


def test_generation_prompt_that_opens_think_starts_in_the_reasoning():
    assert parse(THINK_OPEN, ["Okay, so 2+2.\n</think>\n\nFour."]) == ("Okay, so 2+2.", "Four.")
    assert parse(THINK_OPEN, ["never closed"]) == ("never closed", "")


def test_unclosed_block_is_all_reasoning_and_a_partial_close_tag_is_kept():
    assert parse(THINK, ["<think>step one </thi"]) == ("step one </thi", "")


def test_bracket_format():
    assert parse(BRACKET, [("[THINK]",), "Plan it.", ("[/THINK]",), "Done."]) == ("Plan it.", "Done.")
    assert parse(BRACKET, ["[THINK]Plan[/THINK]Done"]) == ("Plan", "Done")


def test_harmony_channels_as_special_tokens():
    pieces = [("<|channel|>",), "analysis", ("<|message|>",), "User asks 2+2. Answer 4.", ("<|end|>",),
              ("<|start|>",), "assistant", ("<|channel|>",), "final", ("<|message|>",), "2 + 2 = 4."]
    assert parse(HARMONY, pieces) == ("User asks 2+2. Answer 4.", "2 + 2 = 4.")
    # Spelled as plain text, the markers are answer text.
    text = "<|channel|>analysis<|message|>x<|end|>"
    assert parse(HARMONY, [text]) == (None, text)


def test_harmony_without_channels_is_an_answer():
    assert parse(HARMONY, ["Just text."]) == (None, "Just text.")


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(text[last:p])
        last = p
    out.append(text[last:])
    return out


REPLIES = [
    "<think>\nFirst, recall the rule.\n\nThen apply it.  \n</think>\n\nThe answer is **42**.",
    "  <think>a</thin></think> b </think>  c",
    "<think></think>\n\nEmpty thought.",
    "No thinking here, but <think> appears.",
    "   ",
    "<think>unfinished </thi",
    "<th",
    "[THINK]plan[/THINK] go",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REPLIES), st.lists(st.integers(0, 200), max_size=12),
       st.sampled_from([THINK, THINK_OPEN, BRACKET, NO_REASONING]))
def test_any_split_gives_the_one_shot_parse(text, cuts, syntax):
    """The property: chunks of a reply fed in any pieces concatenate to the one-shot parse."""
    whole = parse(syntax, [text])
    p = ReasoningParser(syntax)
    chunks = []
    for piece in _pieces(text, cuts):
        chunks += p.feed(piece)
    chunks += p.flush()
    got_r = "".join(t for k, t in chunks if k == REASONING)
    got_a = "".join(t for k, t in chunks if k == ANSWER)
    assert (got_r if p.opened else None, got_a) == whole
    assert all(t for _, t in chunks)  # no empty chunks


HARMONY_REPLY = [("<|channel|>",), "analysis", ("<|message|>",), "  Think about it.\n", ("<|end|>",),
                 ("<|start|>",), "assistant", ("<|channel|>",), "final", ("<|message|>",), "\nFinal words."]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=10))
def test_harmony_any_split_of_the_text_gives_the_one_shot_parse(cuts):
    pieces = []
    for piece in HARMONY_REPLY:
        pieces += [piece] if isinstance(piece, tuple) else _pieces(piece, cuts)
    assert parse(HARMONY, pieces) == parse(HARMONY, HARMONY_REPLY) == ("Think about it.", "Final words.")


def test_splitter_joins_utf8_split_over_tokens_and_counts():
    clock = iter(range(100)).__next__
    data = "<think>café 🍎</think>Ok".encode()
    s = ReasoningSplitter(THINK, clock=lambda: float(clock()))
    chunks = []
    for i in range(len(data)):  # one byte per "token": every character is split
        chunks += s.feed(1000 + i, data[i:i + 1])
    chunks += s.flush()
    assert s.reasoning == "café 🍎" and s.answer == "Ok"
    assert "".join(t for k, t in chunks if k == REASONING) == "café 🍎"
    close_at = data.index(b"</think>") + len("</think>") - 1
    assert s.reasoning_tokens == close_at - len("<think>") + 2  # from the tag's last byte to the close
    assert s.reasoning_ms == pytest.approx((close_at - 0) * 1000)


def test_splitter_uses_special_ids():
    s = ReasoningSplitter(HARMONY, {1: "<|channel|>", 2: "<|message|>", 3: "<|end|>", 4: "<|start|>"})
    for tok, text in [(1, ""), (9, "analysis"), (2, ""), (9, "hmm"), (3, ""), (4, ""), (9, "assistant"),
                      (1, ""), (9, "final"), (2, ""), (9, "Yes.")]:
        s.feed(tok, text)
    s.flush()
    assert (s.reasoning, s.answer) == ("hmm", "Yes.")


# -- detection ----------------------------------------------------------------------------


def _vocab(*tokens: str):
    return lambda text: text in tokens


def test_detect_from_the_real_templates():
    import jinja2

    def gen_prompt(name: str) -> str:
        src = (TEMPLATES / name).read_text()
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        env.globals["strftime_now"] = lambda f: "2026-01-01"
        return src, env.from_string(src).render(messages=[{"role": "user", "content": "hi"}],
                                                add_generation_prompt=True, bos_token="", eos_token="")

    src, gp = gen_prompt("Qwen-Qwen3-0.6B.jinja")
    qwen = detect_syntax(src, gp, _vocab("<think>", "</think>"))
    assert qwen == ReasoningSyntax(ReasoningFormat.THINK, "<think>", "</think>", False, "reasoning_content")
    src, gp = gen_prompt("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    r1 = detect_syntax(src, gp, _vocab("<think>", "</think>"))
    assert r1.format == ReasoningFormat.THINK and r1.starts_open and r1.field == ""
    src, gp = gen_prompt("openai-gpt-oss-120b.jinja")
    assert detect_syntax(src, gp, _vocab("<|channel|>", "<|message|>")).format == ReasoningFormat.HARMONY
    # the same template over a vocabulary without the channel tokens is no harmony model
    assert detect_syntax(src, gp, _vocab()).format == ReasoningFormat.NONE


def test_detect_plain_chatml_and_vocab_only_think_tokens():
    chatml = "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>\n{% endfor %}"
    assert detect_syntax(chatml, "<|im_start|>assistant\n", _vocab()) == NO_REASONING
    assert detect_syntax(None, "", _vocab("<think>", "</think>")) == NO_REASONING
    vocab_only = detect_syntax(chatml, "<|im_start|>assistant\n", _vocab("<think>", "</think>"))
    assert vocab_only.format == ReasoningFormat.THINK and not vocab_only.starts_open
    magistral = "{{ '[THINK]' }}...{{ '[/THINK]' }}"
    assert detect_syntax(magistral, "", _vocab("[THINK]", "[/THINK]")).format == ReasoningFormat.BRACKET


def test_special_ids_keeps_single_token_markers():
    vocab = {"<think>": [5], "</think>": [1, 2]}
    assert special_ids(THINK, lambda t, special: vocab[t]) == {5: "<think>"}
