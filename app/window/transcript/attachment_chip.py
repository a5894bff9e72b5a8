"""Attachment chips: a file attached to the composer's message or to a sent one (name, pages,
tokens), the composer's row of them with its inline note, and the read-only text viewer.

Everything a chip, the note or the viewer shows comes from a file (its name is hostile) or its
text, so every label is ``Qt.PlainText`` and the viewer is a read-only ``QPlainTextEdit``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.window.shell.theme import LIGHT, Colors
from app.window.shell.plain import isolate

NAME_CHARS = 48
"""A chip shows at most this many characters of a file name (the tooltip has it whole)."""


def chip_text(name: str, pages: int | None, tokens: int | None, kind: str = "", reading: bool = False,
              counting: bool = True, passages: int | None = None) -> str:
    """What a chip says, e.g. ``"report.pdf · 3 pages · 5,214 tokens"``; ``"notes.md ·
    Markdown · 812 tokens"`` for a file without pages; ``"… · reading…"`` while it is read,
    ``"… · counting tokens…"`` until it is counted (``tokens`` None; without ``counting``,
    nothing: a sent file whose count was not kept); ``passages``: how many passages a
    search sent instead of the whole text (``"… · 4 passages searched · 1,210 tokens"``)."""
    shown = isolate(name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…")
    if reading:
        return f"{shown} · reading…"
    what = f"{pages:,} page{'s' if pages != 1 else ''}" if pages is not None else kind
    count = f"{tokens:,} tokens" if tokens is not None else ("counting tokens…" if counting else "")
    searched = f"{passages} passage{'s' if passages != 1 else ''} searched" if passages is not None else ""
    return " · ".join(x for x in (shown, what, searched, count) if x)


PAPERCLIP_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="{color}" '
                 'stroke-width="2" stroke-linecap="round" stroke-linejoin="round"><path d="M21.44 11.05l-9.19 '
                 '9.19a6 6 0 0 1-8.49-8.49l9.19-9.19a4 4 0 0 1 5.66 5.66l-9.2 9.19a2 2 0 0 1-2.83-2.83l8.49-8.48"/></svg>')
"""A paperclip (the Feather icon set's, MIT licence), drawn without an emoji font."""


def paperclip_icon(color: str, size: int = 22) -> QIcon:
    """The paperclip in ``color`` (a ``#rrggbb``), ``size`` pixels, sharp at twice that."""
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(PAPERCLIP_SVG.format(color=color).encode())
    pix = QPixmap(size * 2, size * 2)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    renderer.render(p)
    p.end()
    pix.setDevicePixelRatio(2)
    return QIcon(pix)


class ClickLabel(QLabel):
    """A plain-text label that emits ``clicked`` when pressed with the left button."""

    clicked = Signal()

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    def mousePressEvent(self, event) -> None:  # noqa: N802 - Qt override
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
            event.accept()
            return
        super().mousePressEvent(event)


class AttachmentChip(QFrame):
    """One file: its label (``label``, plain text) and, with ``removable``, an × button.

    Signals: ``opened()`` (the label was clicked: show the text), ``removed()`` (×)."""

    opened = Signal()
    removed = Signal()

    def __init__(self, text: str, tooltip: str, removable: bool, colors: Colors = LIGHT,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("attachment_chip")
        self.setStyleSheet(f"QFrame#attachment_chip {{ background:{colors.assistant_bubble}; "
                           f"border:1px solid {colors.border}; border-radius:8px; }}")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 2, 4 if removable else 8, 2)
        lay.setSpacing(2)
        self.label = ClickLabel(text)
        self.label.setToolTip(f"<p>{html.escape(tooltip)}</p>")  # a tooltip guesses rich text: escaped
        self.label.setAccessibleName(f"Attached file {tooltip}")
        self.label.clicked.connect(self.opened)
        lay.addWidget(self.label)
        self.remove_button: QToolButton | None = None
        if removable:
            b = QToolButton()
            b.setText("×")
            b.setAutoRaise(True)
            b.setToolTip("Remove this file")
            b.setAccessibleName(f"Remove {tooltip}")
            b.clicked.connect(self.removed)
            lay.addWidget(b)
            self.remove_button = b

    @property
    def text(self) -> str:
        """The label's text."""
        return self.label.text()


class ChipRow(QScrollArea):
    """A row of ``AttachmentChip``s (``chips``), left-aligned, scrolled sideways when they are
    wider than the window (so many files never widen it); hidden while empty."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("attachment_chips")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setWidgetResizable(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        inner = QWidget()
        inner.setObjectName("attachment_chips_inner")
        inner.setStyleSheet("QWidget#attachment_chips_inner { background: transparent; }")
        self.viewport().setAutoFillBackground(False)
        self._lay = QHBoxLayout(inner)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(6)
        self._lay.addStretch(1)
        self.setWidget(inner)
        self.chips: list[AttachmentChip] = []
        self.hide()

    def set_chips(self, chips: Sequence[AttachmentChip]) -> None:
        for chip in self.chips:  # deleteLater: its × may be the button being clicked
            self._lay.removeWidget(chip)
            chip.hide()
            chip.deleteLater()
        self.chips = list(chips)
        for i, chip in enumerate(self.chips):
            self._lay.insertWidget(i, chip)
        height = max((c.sizeHint().height() for c in self.chips), default=0)
        self.setFixedHeight(height + self.horizontalScrollBar().sizeHint().height() + 2)
        self.setVisible(bool(self.chips))


class AttachmentBar(QWidget):
    """The composer's attachments: ``row`` (the chips, above the composer's box) and ``note``
    (one sentence under the composer: why a file could not be attached)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.row = ChipRow(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(24, 4, 24, 0)
        lay.addWidget(self.row)
        self.note = QLabel()
        self.note.setObjectName("attachment_note")
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)
        self.note.setContentsMargins(24, 0, 24, 6)
        self.note.setAccessibleName("Attachment message")
        self.note.hide()
        self.colors = LIGHT
        self.hide()

    def set_chips(self, chips: Sequence[AttachmentChip]) -> None:
        self.row.set_chips(chips)
        self.setVisible(bool(chips))

    def show_note(self, sentence: str, error: bool = True) -> None:
        """Show ``sentence`` (plain text) under the composer; red when ``error``."""
        self.note.setStyleSheet(f"color:{'#c0392b' if error else self.colors.muted};")
        self.note.setText(sentence)
        self.note.show()

    def clear_note(self) -> None:
        self.note.clear()
        self.note.hide()


class TextViewer(QDialog):
    """A file's extracted text (or passages), read-only plain text, over ``parent``."""

    def __init__(self, title: str, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setObjectName("attachment_viewer")
        self.resize(720, 560)
        lay = QVBoxLayout(self)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setPlainText(text)
        self.view.setAccessibleName(title)
        lay.addWidget(self.view)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
