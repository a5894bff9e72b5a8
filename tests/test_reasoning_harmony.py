"""gpt-oss's harmony format on its special tokens, at the parser level (no small gpt-oss
GGUF can be had here): the real token ids of the o200k_harmony vocabulary for the markers,
a tokenizer that, like llama.cpp's with special parsing on, turns a marker into one id
and plain text into others, and replies as gpt-oss writes them, fed token by token
through ``ReasoningSplitter`` and ``ReasoningSteer`` (the engine's path)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.reasoning import (
    HARMONY_MARKERS,
    ReasoningFormat,
    ReasoningSplitter,
    ReasoningSteer,
    detect_syntax,
    special_ids,
)

TEMPLATES = Path(__file__).parent / "data" / "templates"
# the ids of gpt-oss's special tokens (openai/gpt-oss-120b tokenizer.json, o200k_harmony)
IDS = {"<|return|>": 200002, "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006,
       "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012}
BY_ID = {v: k for k, v in IDS.items()}
_MARKER = re.compile("|".join(re.escape(m) for m in IDS))


def tokenize(text: str, special: bool) -> list[int]:
    """Markers as one id each with ``special`` (else spelled out), other text one id per
    character (ids above the vocabulary's specials, so none collides)."""
    out, pos = [], 0
    for m in _MARKER.finditer(text) if special else ():
        out += [300000 + ord(c) for c in text[pos:m.start()]]
        out.append(IDS[m.group()])
        pos = m.end()
    return out + [300000 + ord(c) for c in text[pos:]]


def detokenize(tok: int) -> str:
    return BY_ID.get(tok) or chr(tok - 300000)


def syntax():
    src = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return detect_syntax(src, "<|start|>assistant", lambda t: len(tokenize(t, True)) == 1)


def run(text: str, budget: int | None = None):
    """Feed ``text`` (as gpt-oss writes it, markers special) token by token; returns the
    splitter, the streamed (kind, piece) list and the ids fed (forced ones included)."""
    s = syntax()
    specials = special_ids(s, tokenize)
    steer = ReasoningSteer(s, specials, budget, tokenize(s.closing_text, True))
    streamed: list[tuple[str, str]] = []
    feed = steer.wrap(lambda t, _i: streamed.append(("answer", t)), lambda t, _i: streamed.append(("reasoning", t)))
    fed, queue = [], list(tokenize(text, True))
    while queue:
        forced = steer.forced()
        tok = forced if forced is not None else queue.pop(0)
        fed.append(tok)
        feed(detokenize(tok) if tok not in specials else "", tok)
    steer.finish()
    return steer.splitter, streamed, fed


def test_the_real_template_and_vocabulary_give_harmony_with_every_marker_special():
    s = syntax()
    assert s.format == ReasoningFormat.HARMONY and s.field == "thinking"
    assert special_ids(s, tokenize) == {IDS[m]: m for m in HARMONY_MARKERS}


def test_analysis_then_final_on_special_tokens():
    sp, streamed, _ = run("<|channel|>analysis<|message|>User asks 2+2. That is 4.<|end|>"
                          "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>")
    assert (sp.reasoning, sp.answer) == ("User asks 2+2. That is 4.", "2 + 2 = 4.")
    assert "".join(t for k, t in streamed if k == "reasoning") == sp.reasoning
    assert all("<|" not in t for _, t in streamed)  # no marker leaks into either part
    switch = tokenize("<|end|><|start|>assistant<|channel|>final<|message|>", True)
    assert sp.reasoning_tokens == 1 + len("User asks 2+2. That is 4.") + len(switch)  # <|message|> to the switch


def test_two_analysis_messages_and_a_constrained_header_are_all_reasoning():
    sp, _, _ = run("<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis"
                   "<|message|>Second.<|end|><|start|>assistant<|channel|>final <|constrain|>text"
                   "<|message|>Done.<|return|>")
    assert (sp.reasoning, sp.answer) == ("First.Second.", "Done.")


def test_markers_spelled_as_text_in_the_answer_stay_text():
    # the final answer explains the format: its "<|channel|>" is text ids, not the special id
    answer = "Write <|channel|>final<|message|> to answer."
    text = "<|channel|>analysis<|message|>Explain it.<|end|><|start|>assistant<|channel|>final<|message|>"
    s = syntax()
    ids = tokenize(text, True) + tokenize(answer, False)
    sp = ReasoningSplitter(s, special_ids(s, tokenize))
    for tok in ids:
        sp.feed(tok, "" if tok in BY_ID else detokenize(tok))
    sp.flush()
    assert (sp.reasoning, sp.answer) == ("Explain it.", answer)


def test_no_channel_is_a_plain_answer():
    sp, streamed, _ = run("Just an answer.")
    assert (sp.reasoning, sp.answer) == (None, "Just an answer.") and streamed[0][0] == "answer"


def test_a_thinking_budget_switches_to_the_final_channel_with_its_special_tokens():
    thought = "a long analysis that goes on and on"
    sp, _, fed = run(f"<|channel|>analysis<|message|>{thought}", budget=6)
    switch = tokenize("<|end|><|start|>assistant<|channel|>final<|message|>", True)
    at = fed.index(IDS["<|end|>"])
    assert fed[at:at + len(switch)] == switch  # the closing text, injected as special ids
    header = len(tokenize("<|channel|>analysis<|message|>", True))
    assert at - header == 6 - 1  # <|message|> and 5 text ids: the 6 tokens of the budget
    assert sp.reasoning == thought[:5] and sp.parser.closed
    assert sp.answer == thought[5:]  # the rest of the model's text now goes to the answer
