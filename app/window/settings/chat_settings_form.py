"""The system prompt and sampling of one chat, or of every new chat: a form used twice by the
Settings dialog ("This chat" and "New chats"), with named system-prompt presets.

Presets are app-wide (``AppSettings.prompt_presets``: name -> prompt). Choosing one puts its
text in the system prompt; "Save preset" stores the prompt shown under the typed name and
clears the name; the dialog writes it to ``settings.json`` at once (kept on Cancel).
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QIntValidator
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.window.settings.thinking_rows import thinking_rows
from app.window.shell.plain import menu_text
from storage.chats import DEFAULT_SAMPLING

NO_PRESET = "(no preset)"
NAME_PLACEHOLDER = "a preset name, e.g. Translator"
SEED_MAX = 2**31 - 1  # QIntValidator takes a C int


def spin(lo: int, hi: int, value: int) -> QSpinBox:
    w = QSpinBox()
    w.setRange(lo, hi)
    w.setValue(int(value))
    return w


def dspin(lo: float, hi: float, step: float, value: float) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setRange(lo, hi)
    w.setDecimals(2)
    w.setSingleStep(step)
    w.setValue(float(value))
    return w


class ChatSettingsForm(QWidget):
    """System prompt, sampling and presets. ``presets`` is shared with the other form of the
    dialog (the same dict object); ``presets_changed`` tells it to refill its list.

    Args:
        system_prompt / sampling: the values shown (sampling: some or all DEFAULT_SAMPLING keys).
        placeholder: the system prompt's placeholder text.
        facts: the loaded model's ModelFacts dict: its ``thinking_control`` shows the
            Thinking choice (only when the template has one), its ``reasoning_format`` the
            thinking budget (only for a model that thinks). Hidden rows keep their values.
    """

    presets_changed = Signal()

    def __init__(self, system_prompt: str, sampling: dict, presets: dict[str, str], placeholder: str,
                 parent: QWidget | None = None, facts: dict | None = None):
        super().__init__(parent)
        self.presets = presets
        s = {**DEFAULT_SAMPLING, **(sampling or {})}
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setPlaceholderText(placeholder)
        self.preset = QComboBox()
        self.preset.setAccessibleName("System prompt preset")
        self.preset_name = QLineEdit()
        self.preset_name.setPlaceholderText(NAME_PLACEHOLDER)
        self.preset_name.setAccessibleName("Preset name")
        self.save_preset = QPushButton("Save preset")
        self.delete_preset = QPushButton("Delete preset")
        self.fill_presets()
        self.preset.activated.connect(self._preset_chosen)
        self.save_preset.clicked.connect(self._save_preset)
        self.delete_preset.clicked.connect(self._delete_preset)
        row = QHBoxLayout()
        row.addWidget(self.preset, 1)
        row.addWidget(self.delete_preset)
        save_row = QHBoxLayout()
        save_row.addWidget(self.preset_name, 1)
        save_row.addWidget(self.save_preset)
        self.temperature = dspin(0, 2, 0.05, s["temperature"])
        self.top_p = dspin(0, 1, 0.01, s["top_p"])
        self.top_k = spin(0, 1000, s["top_k"])
        self.min_p = dspin(0, 1, 0.01, s["min_p"])
        self.repeat_penalty = dspin(0.5, 2, 0.01, s["repeat_penalty"])
        self.seed = QLineEdit("" if s["seed"] is None else str(s["seed"]))
        self.seed.setPlaceholderText("random")
        self.seed.setValidator(QIntValidator(0, SEED_MAX, self.seed))  # llama.cpp's seed is a uint32
        self.max_tokens = spin(1, 131072, s["max_tokens"])
        form = QFormLayout(self)
        form.addRow("Preset", row)
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Save the prompt as", save_row)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top p", self.top_p)
        form.addRow("Top k (0: off)", self.top_k)
        form.addRow("Min p", self.min_p)
        form.addRow("Repeat penalty", self.repeat_penalty)
        form.addRow("Seed", self.seed)
        form.addRow("Max tokens per reply", self.max_tokens)
        self.form = form
        self.thinking, self.thinking_budget = thinking_rows(form, s, facts or {})

    def fill_presets(self) -> None:
        """Refill the preset list from ``presets``, selecting the one whose text is shown."""
        shown = self.system_prompt.toPlainText().strip()
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItem(NO_PRESET, None)
        for name in sorted(self.presets, key=str.casefold):
            self.preset.addItem(menu_text(name), name)
            if self.presets[name].strip() == shown and shown:
                self.preset.setCurrentIndex(self.preset.count() - 1)
        self.preset.blockSignals(False)
        self.delete_preset.setEnabled(self.preset.currentData() is not None)

    def choose_preset(self, name: str) -> None:
        """Show the preset ``name`` (as choosing it in the list does). KeyError if there is none."""
        self.preset.setCurrentIndex(self.preset.findData(name))
        self._preset_chosen()

    def _preset_chosen(self, *_args) -> None:
        name = self.preset.currentData()
        if name is not None:
            self.system_prompt.setPlainText(self.presets[name])
            self.preset_name.setText(name)
        self.delete_preset.setEnabled(name is not None)

    def _save_preset(self) -> None:
        name = self.preset_name.text().strip()
        if not name:
            self.preset_name.setFocus()
            self.preset_name.setPlaceholderText("type a name first")
            return
        self.presets[name] = self.system_prompt.toPlainText().strip()
        self.preset_name.clear()
        self.preset_name.setPlaceholderText(NAME_PLACEHOLDER)
        self.presets_changed.emit()

    def _delete_preset(self) -> None:
        name = self.preset.currentData()
        if name is not None:
            self.presets.pop(name, None)
            self.presets_changed.emit()

    def problem(self) -> str:
        """Why these values cannot be used ("" when they can)."""
        text = self.seed.text().strip()
        if text and not (text.isdigit() and int(text) <= SEED_MAX):
            return f"the seed must be a whole number from 0 to {SEED_MAX:,}, or empty for a random one"
        return ""

    def values(self) -> tuple[str, dict]:
        """(system prompt, sampling dict with every DEFAULT_SAMPLING key) as entered."""
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text) if seed_text else None
        except ValueError:
            seed = None
        return self.system_prompt.toPlainText().strip(), {
            "temperature": round(self.temperature.value(), 2),
            "top_p": round(self.top_p.value(), 2),
            "top_k": self.top_k.value(),
            "min_p": round(self.min_p.value(), 2),
            "repeat_penalty": round(self.repeat_penalty.value(), 2),
            "seed": seed,
            "max_tokens": self.max_tokens.value(),
            "thinking": self.thinking.currentData(),
            "thinking_budget": self.thinking_budget.value() or None,
        }
