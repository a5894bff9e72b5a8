"""A chat's Thinking setting (engine/thinking_control.py) rendered by the real templates of
tests/data/templates: Qwen3's ``enable_thinking``, gpt-oss's ``reasoning_effort``, and the
``/no_think`` system flag; and the settings form shows the choice only where it applies."""

from __future__ import annotations

import pytest
from test_reasoning_templates import CHATML, builder, text_of

from engine.chat_template import ChatMessage, PromptBuilder
from engine.settings import SamplingParams
from engine.thinking_control import ThinkingControl, detect_control, template_variables, with_flag

Q = [ChatMessage("system", "Be brief."), ChatMessage("user", "What is 2+2?")]


def test_qwen3_thinking_off_renders_an_empty_think_block():
    b = builder("Qwen-Qwen3-0.6B.jinja")
    assert b.thinking_control is ThinkingControl.ENABLE
    on, off = b.render(Q), b.render(Q, thinking="off")
    assert on.endswith("<|im_start|>assistant\n") and "<think>" not in on
    assert off == on + "<think>\n\n</think>\n\n"  # the model is told its thinking is done
    assert text_of(b.build(Q, thinking="off")) == off  # the token path renders the same
    assert b.render(Q, thinking="high") == on  # an effort Qwen3 does not take changes nothing


def test_gpt_oss_reasoning_effort_goes_to_its_system_message():
    b = builder("openai-gpt-oss-120b.jinja")
    assert b.thinking_control is ThinkingControl.EFFORT
    assert "Reasoning: medium\n" in b.render(Q)  # the template's default
    for effort in ("low", "medium", "high"):
        text = b.render(Q, thinking=effort)
        assert f"Reasoning: {effort}\n" in text and text.count("Reasoning: ") == 1
        assert text_of(b.build(Q, thinking=effort)) == text
    assert b.render(Q, thinking="off") == b.render(Q)  # gpt-oss cannot turn it off: unchanged


def test_templates_without_a_control_are_unchanged():
    for name in ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "chatml"):
        b = builder(name)
        assert b.thinking_control is ThinkingControl.NONE
        assert b.render(Q, thinking="off") == b.render(Q) and b.build(Q, thinking="low") == b.build(Q)


def test_the_no_think_flag_is_added_to_the_system_message():
    flag = ("{% if messages[0].role == 'system' and '/no_think' in messages[0].content %}[no thinking]{% endif %}"
            + CHATML)
    b = PromptBuilder(flag, lambda t, s: [ord(c) for c in t])
    assert b.thinking_control is ThinkingControl.NO_THINK_FLAG
    off = b.render(Q, thinking="off")
    assert off.startswith("[no thinking]<|im_start|>system\nBe brief. /no_think<|im_end|>")
    assert not b.render(Q).startswith("[no thinking]")
    assert text_of(b.build(Q, thinking="off")) == off  # the token path too (the flag is read from the text)
    assert text_of(b.build(Q)) == b.render(Q)
    alone = with_flag(ThinkingControl.NO_THINK_FLAG, "off", Q[1:])
    assert [(m.role, m.content) for m in alone] == [("system", "/no_think"), ("user", "What is 2+2?")]
    assert with_flag(ThinkingControl.ENABLE, "off", Q) == Q


@pytest.mark.parametrize(("text", "control"), [
    ("{% if enable_thinking is false %}x{% endif %}", ThinkingControl.ENABLE),
    ("{% set r = reasoning_effort %}{% if enable_thinking %}{% endif %}", ThinkingControl.EFFORT),
    ("{{ '/no_think' in m.content }}", ThinkingControl.NO_THINK_FLAG),
    ("{{ messages }}", ThinkingControl.NONE), (None, ThinkingControl.NONE)])
def test_detect_control(text, control):
    assert detect_control(text) is control


def test_variables_and_sampling_defaults():
    assert template_variables(ThinkingControl.ENABLE, "off") == {"enable_thinking": False}
    assert template_variables(ThinkingControl.ENABLE, "") == {}
    assert template_variables(ThinkingControl.EFFORT, "low") == {"reasoning_effort": "low"}
    sp = SamplingParams.from_dict({"thinking": "off", "thinking_budget": 30})
    assert (sp.thinking, sp.thinking_budget) == ("off", 30)
    assert (SamplingParams().thinking, SamplingParams().thinking_budget) == ("", None)


def test_settings_form_shows_thinking_only_where_the_template_has_a_control(qtbot):
    from app.window.settings.chat_settings_form import ChatSettingsForm

    def form(facts, sampling=None):
        f = ChatSettingsForm("", sampling or {}, {}, "", facts=facts)
        qtbot.addWidget(f)
        return f

    qwen = form({"thinking_control": "enable_thinking", "reasoning_format": "<think>"})
    assert qwen.form.isRowVisible(qwen.thinking) and qwen.form.isRowVisible(qwen.thinking_budget)
    assert [qwen.thinking.itemData(i) for i in range(qwen.thinking.count())] == ["", "off"]
    qwen.thinking.setCurrentIndex(1)
    qwen.thinking_budget.setValue(200)
    assert {k: qwen.values()[1][k] for k in ("thinking", "thinking_budget")} == {"thinking": "off",
                                                                                  "thinking_budget": 200}
    oss = form({"thinking_control": "reasoning_effort", "reasoning_format": "harmony"}, {"thinking": "high"})
    assert oss.thinking.currentData() == "high" and oss.thinking.count() == 4
    plain = form({"thinking_control": "none", "reasoning_format": "none"}, {"thinking": "off", "thinking_budget": 5})
    assert not plain.form.isRowVisible(plain.thinking) and not plain.form.isRowVisible(plain.thinking_budget)
    assert {k: plain.values()[1][k] for k in ("thinking", "thinking_budget")} == {"thinking": "off",
                                                                                   "thinking_budget": 5}
    assert form(None).values()[1]["thinking_budget"] is None  # off by default


QWEN_LIKE = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and "
    "enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
)


def test_the_engine_renders_the_chat_setting_on_the_real_model(tmp_path, model_path):
    """``SamplingParams.thinking`` (what the window sends) reaches the template."""
    from engine.core import Engine
    from engine.settings import EngineSettings
    from tools.think_model import think_copy

    engine = Engine(think_copy(model_path, tmp_path / "qwen-like.gguf", QWEN_LIKE), EngineSettings(n_ctx=1024))
    try:
        assert engine.model.facts.thinking_control == "enable_thinking"
        q = [ChatMessage("user", "Hi")]
        off = engine.generate(q, SamplingParams(temperature=0.0, max_tokens=2, thinking="off"), use_cache=False)
        on = engine.generate(q, SamplingParams(temperature=0.0, max_tokens=2), use_cache=False)
        assert engine.model.detokenize(off.prompt_ids).endswith("assistant\n<think>\n\n</think>\n\n")
        assert off.prompt_ids[: len(on.prompt_ids)] == on.prompt_ids and len(off.prompt_ids) > len(on.prompt_ids)
        assert engine.prompt_tokens(q, "off") == off.prompt_ids
    finally:
        engine.close()
