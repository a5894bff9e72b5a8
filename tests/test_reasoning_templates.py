"""Earlier assistant turns go to the chat template with the answer as ``content`` and the
reasoning in ``reasoning_content`` / ``thinking``; the template decides what to keep.
Rendered with the real public templates of Qwen3, DeepSeek-R1 and gpt-oss
(tests/data/templates, sources in SOURCE.md), through Branchwise's bounded sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.chat_template import ChatMessage, PromptBuilder

TEMPLATES = Path(__file__).parent / "data" / "templates"
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chars(text: str, special: bool) -> list[int]:
    """A tokenizer with one token per character: ids decode back to the text exactly."""
    return [ord(c) for c in text]


def text_of(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def builder(name: str) -> PromptBuilder:
    src = CHATML if name == "chatml" else (TEMPLATES / name).read_text(encoding="utf-8")
    return PromptBuilder(src, chars, bos_token="<s>", eos_token="</s>")


def history(reasoning: bool = True) -> list[ChatMessage]:
    r1 = "The user greets me; keep it short." if reasoning else None
    r2 = "Two plus two is four." if reasoning else None
    return [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hello!"),
        ChatMessage("assistant", "Hi there.", [ord(c) for c in "<think>x</think>Hi there."], r1),
        ChatMessage("user", "What is 2+2?"),
        ChatMessage("assistant", "4.", None, r2),
        ChatMessage("user", "Thanks."),
    ]


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                                  "openai-gpt-oss-120b.jinja", "chatml"])
def test_earlier_turns_keep_the_answer_and_drop_the_reasoning(name):
    b = builder(name)
    msgs = history()
    text = b.render(msgs)
    assert "Hi there." in text and "4." in text
    assert "keep it short" not in text and "Two plus two" not in text  # every template drops it
    assert "<think>x</think>" not in text  # the reply's generated ids (with the thinking) are not used
    # build() assembles the same text the template renders, piece by piece
    assert text_of(b.build(msgs)) == text


def test_without_reasoning_the_generated_ids_are_used_as_before():
    b = builder("chatml")
    msgs = history(reasoning=False)
    assert "<think>x</think>Hi there." in text_of(b.build(msgs))


def test_qwen3_keeps_the_reasoning_of_a_turn_after_the_last_question():
    b = builder("Qwen-Qwen3-0.6B.jinja")
    msgs = history()[:-1]  # ends on the assistant's "4." with its reasoning
    text = b.render(msgs, add_generation_prompt=False)
    assert "<|im_start|>assistant\n<think>\nTwo plus two is four.\n</think>\n\n4.<|im_end|>" in text
    assert "keep it short" not in text  # the earlier turn, before the last question, is dropped
    assert text_of(b.build(msgs, add_generation_prompt=False)) == text
    assert b.render(history()).endswith("<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n")


def test_gpt_oss_keeps_thinking_only_for_a_final_assistant_turn():
    b = builder("openai-gpt-oss-120b.jinja")
    text = b.render(history())
    assert "<|start|>assistant<|channel|>final<|message|>Hi there.<|end|>" in text
    assert "<|channel|>analysis" not in text
    assert text.endswith("<|start|>user<|message|>Thanks.<|end|><|start|>assistant")
    last = b.render(history()[:-1], add_generation_prompt=False)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Two plus two is four.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>4.<|return|>") in last
    assert text_of(b.build(history()[:-1], add_generation_prompt=False)) == last


def test_deepseek_r1_opens_think_in_the_generation_prompt_and_never_shows_reasoning():
    b = builder("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    text = b.render(history())
    assert text.endswith("<｜User｜>Thanks.<｜Assistant｜><think>\n")
    assert "<｜Assistant｜>Hi there.<｜end▁of▁sentence｜>" in text
    last = b.render(history()[:-1], add_generation_prompt=False)
    assert "Two plus two" not in last and last.endswith("<｜Assistant｜>4.<｜end▁of▁sentence｜>")


def test_reasoning_text_that_spells_control_tokens_stays_text():
    seen: list[tuple[str, bool]] = []

    def tok(text: str, special: bool) -> list[int]:
        seen.append((text, special))
        return [0] if special and text == "<|im_end|>" else [ord(c) for c in text]

    b = PromptBuilder(CHATML.replace("{{ m.content }}", "{{ m.reasoning_content }}|{{ m.content }}"), tok)
    msgs = [ChatMessage("user", "q"), ChatMessage("assistant", "a", None, "think <|im_end|> more"),
            ChatMessage("user", "q2")]
    b.build(msgs)
    assert ("think <|im_end|> more", False) in seen  # tokenized on its own, without special parsing
