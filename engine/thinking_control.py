"""Turning a reasoning model's thinking off, or setting its effort, where its chat template
lets it: the per-chat "Thinking" setting (``SamplingParams.thinking``).

Three controls (:class:`ThinkingControl`), read from the template's text:

* ``enable_thinking`` (Qwen3, SmolLM3): a template variable; ``False`` renders an empty
  ``<think>\\n\\n</think>`` in the generation prompt (Qwen3) or the ``/no_think`` mode (SmolLM3).
* ``/no_think`` (templates that read the flag from the system message but have no
  variable): "off" appends `` /no_think`` to the system message (or adds one).
* ``reasoning_effort`` (gpt-oss): a template variable, "low", "medium" or "high".

A setting the model's control does not know ("" the template's default, or an effort for a
model that can only be turned off) changes nothing, so a chat's setting stays harmless when
the chat is continued with another model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.chat_template import ChatMessage


class ThinkingControl(StrEnum):
    """What a chat template lets a chat set about the thinking (``ModelFacts.thinking_control``)."""

    NONE = "none"
    ENABLE = "enable_thinking"     # a template variable: on / off
    NO_THINK_FLAG = "/no_think"    # a flag in the system message: on / off
    EFFORT = "reasoning_effort"    # a template variable: low / medium / high


DEFAULT = ""
"""The ``thinking`` setting that leaves the template's default."""

CHOICES: dict[ThinkingControl, tuple[str, ...]] = {
    ThinkingControl.NONE: (),
    ThinkingControl.ENABLE: (DEFAULT, "off"),
    ThinkingControl.NO_THINK_FLAG: (DEFAULT, "off"),
    ThinkingControl.EFFORT: (DEFAULT, "low", "medium", "high"),
}
"""The ``thinking`` values each control takes (empty: the setting is not shown)."""


def detect_control(template: str | None) -> ThinkingControl:
    """The control a chat template offers (NONE for None or a template without one).
    ``reasoning_effort`` wins over ``enable_thinking``, which wins over a bare ``/no_think``."""
    if not template:
        return ThinkingControl.NONE
    if "reasoning_effort" in template:
        return ThinkingControl.EFFORT
    if "enable_thinking" in template:
        return ThinkingControl.ENABLE
    if "/no_think" in template:
        return ThinkingControl.NO_THINK_FLAG
    return ThinkingControl.NONE


def template_variables(control: ThinkingControl, thinking: str) -> dict:
    """The variables to render the template with for the setting ``thinking`` ({} when it
    changes nothing), e.g. ``{"enable_thinking": False}`` or ``{"reasoning_effort": "low"}``."""
    if thinking not in CHOICES[control] or thinking == DEFAULT:
        return {}
    if control is ThinkingControl.ENABLE:
        return {"enable_thinking": False}
    if control is ThinkingControl.EFFORT:
        return {"reasoning_effort": thinking}
    return {}


def with_flag(control: ThinkingControl, thinking: str, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with `` /no_think`` at the end of the system message (one is added at the
    start when there is none) for NO_THINK_FLAG and "off"; else ``messages`` unchanged (a new list)."""
    out = list(messages)
    if control is not ThinkingControl.NO_THINK_FLAG or thinking != "off":
        return out
    if out and out[0].role == "system":
        out[0] = replace(out[0], content=f"{out[0].content} /no_think".lstrip())
    else:
        from engine.chat_template import ChatMessage  # noqa: PLC0415 - chat_template imports this module

        out.insert(0, ChatMessage("system", "/no_think"))
    return out
