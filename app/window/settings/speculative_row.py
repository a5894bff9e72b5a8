"""Settings → App → Speculative decoding: a choice of Off, Prompt lookup or Draft model,
the last with the draft model's file (``engine.speculative_setting`` is the value's form)."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLineEdit, QPushButton, QSizePolicy, QWidget

from app.window.shell.plain import tooltip
from engine.speculative_setting import DRAFT, LOOKUP, NONE, kind_of

LABELS = ((NONE, "Off"), (LOOKUP, "Prompt lookup"), (DRAFT, "Draft model"))


class SpeculativeRow(QWidget):
    """The setting's row. :meth:`value` is the setting's text ("none", "lookup" or
    "draft:PATH"; "draft:" with no file yet, which the settings' check refuses)."""

    def __init__(self, setting: str, parent=None):
        super().__init__(parent)
        self.kind = QComboBox()
        for key, label in LABELS:
            self.kind.addItem(label, key)
        self.kind.setToolTip("Speculative decoding: tokens are drafted and checked by the model in one batch. "
                             "Prompt lookup drafts from the chat itself (quotes, code edits); a draft model is "
                             "a small model with the same vocabulary. Off decodes one token at a time.")
        self.kind.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)  # one width for every choice
        self.path = QLineEdit()
        self.path.setPlaceholderText("the draft model's .gguf file")
        self.path.textChanged.connect(lambda text: self.path.setToolTip(tooltip(text)))  # the whole path
        self.browse = QPushButton("Choose…")
        self.browse.clicked.connect(self._choose)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.kind)
        lay.addWidget(self.path, 1)
        lay.addWidget(self.browse)
        lay.addStretch(0)  # takes the room the path leaves when it is hidden
        kind = kind_of(setting) if setting else NONE
        self.kind.setCurrentIndex(max(0, self.kind.findData(kind)))
        if kind == DRAFT:
            self.path.setText(setting[len(DRAFT) + 1:])
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self._kind_changed()

    def _kind_changed(self, *_args) -> None:
        draft = self.kind.currentData() == DRAFT
        self.path.setVisible(draft)
        self.browse.setVisible(draft)
        self.layout().setStretch(3, 0 if draft else 1)

    def _choose(self) -> None:
        name, _ = QFileDialog.getOpenFileName(self, "Draft model", self.path.text(), "GGUF models (*.gguf)")
        if name:
            self.path.setText(name)

    def problem(self) -> str:
        """Why the row's value cannot be used ("" when it can: the file itself is checked
        when the model loads)."""
        if self.kind.currentData() == DRAFT and not self.path.text().strip():
            return "speculative decoding with a draft model needs the draft model's file (Choose…)"
        return ""

    def value(self) -> str:
        kind = self.kind.currentData()
        return f"{DRAFT}:{self.path.text().strip()}" if kind == DRAFT else kind
