"""The "Thinking" rows of a chat's settings (``ChatSettingsForm``), for reasoning models:
a choice the chat template offers (``engine.thinking_control``: Qwen3's and SmolLM3's
on / off, gpt-oss's effort low / medium / high) and the thinking budget in tokens (0: no
limit, the default; the same limit as ``branchwise chat --thinking-budget``).

The choice is shown only when the loaded model's template has such a control, the budget
only when the model thinks (a reasoning format was found); hidden rows keep the chat's
values, so switching models loses nothing.
"""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QFormLayout, QSpinBox

from engine.thinking_control import CHOICES, ThinkingControl

CHOICE_WORDS = {"": "as the model decides", "off": "off", "low": "low effort", "medium": "medium effort",
                "high": "high effort"}
BUDGET_MAX = 131072


def thinking_rows(form: QFormLayout, sampling: dict, facts: dict) -> tuple[QComboBox, QSpinBox]:
    """Add the Thinking choice and the budget to ``form`` (shown as ``facts`` allows, see
    the module doc) with the values of ``sampling`` (``thinking``, ``thinking_budget``);
    returns (choice, budget). The choice's ``currentData()`` is the ``thinking`` value."""
    try:
        control = ThinkingControl(facts.get("thinking_control") or "none")
    except ValueError:
        control = ThinkingControl.NONE
    current = sampling.get("thinking") or ""
    choice = QComboBox()
    choice.setAccessibleName("Thinking")
    for value in CHOICES[control] or ("",):
        choice.addItem(CHOICE_WORDS.get(value, value), value)
    if choice.findData(current) < 0:  # a value another model's template took: kept as it is
        choice.addItem(CHOICE_WORDS.get(current, current), current)
    choice.setCurrentIndex(choice.findData(current))
    budget = QSpinBox()
    budget.setRange(0, BUDGET_MAX)
    budget.setSpecialValueText("no limit")
    budget.setSuffix(" tokens")
    budget.setAccessibleName("Thinking budget")
    budget.setValue(int(sampling.get("thinking_budget") or 0))
    budget.setToolTip("Close the thinking after this many tokens and let the model answer")
    form.addRow("Thinking", choice)
    form.addRow("Thinking budget", budget)
    form.setRowVisible(choice, control is not ThinkingControl.NONE)
    form.setRowVisible(budget, (facts.get("reasoning_format") or "none") != "none")
    return choice, budget
