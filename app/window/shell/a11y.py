"""Accessible names: what a screen reader says for each control.

Qt names a button after its text, but an input, a list or a combo box after its content
(or nothing), and a symbol button ("‹", "✕") after the symbol. Controls built in code
set a name where they are made (``setAccessibleName``); :func:`name_controls` gives every
control under a widget that still has none the name a sighted user reads beside it: its
form label, the label it is the buddy of, its tooltip or its placeholder (a button with
words on it is left alone: Qt reads its text, and follows it when it changes).
"""

from __future__ import annotations

import html
import re

from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSpinBox,
    QComboBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSlider,
    QTabBar,
    QTextEdit,
    QWidget,
)

CONTROLS = (QAbstractButton, QLineEdit, QPlainTextEdit, QTextEdit, QAbstractItemView, QComboBox,
            QAbstractSpinBox, QSlider)
"""The kinds of widget a person operates (and a screen reader must name)."""

_TAGS = re.compile(r"<[^>]*>")


def is_internal(widget: QWidget) -> bool:
    """True for the parts Qt builds inside a control (a spin box's line edit, a line
    edit's clear button, a combo box's list, a tab bar's scroll arrows): their control
    carries the name."""
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, (QAbstractSpinBox, QComboBox, QLineEdit, QTabBar)):
            return True
        parent = parent.parentWidget()
    return widget.objectName().startswith("qt_")


def _plain(text: str) -> str:
    """Label, tooltip or button text as words: no markup, no mnemonic ``&``, no colon."""
    text = html.unescape(_TAGS.sub(" ", text or "")).replace("&&", "\0").replace("&", "").replace("\0", "&")
    return " ".join(text.split()).rstrip(":").strip()


def _form_label(widget: QWidget) -> str:
    parent = widget.parentWidget()
    layout = parent.layout() if parent is not None else None
    if isinstance(layout, QFormLayout):
        label = layout.labelForField(widget)
        if isinstance(label, QLabel):
            return _plain(label.text())
    return ""


def _buddy_label(widget: QWidget, labels: list[QLabel]) -> str:
    return next((_plain(lab.text()) for lab in labels if lab.buddy() is widget), "")


def name_controls(root: QWidget) -> int:
    """Give each control under ``root`` (``CONTROLS``, not Qt's inner parts) that has no
    accessible name one (see the module docstring). Returns how many were named."""
    labels = root.findChildren(QLabel)
    named = 0
    for w in root.findChildren(QWidget):
        if not isinstance(w, CONTROLS) or w.accessibleName() or is_internal(w):
            continue
        if isinstance(w, QAbstractButton) and any(ch.isalpha() for ch in w.text()):
            continue  # Qt names a button by its text, and follows it when it changes (Send/Stop)
        name = _form_label(w) or _buddy_label(w, labels) or _plain(w.toolTip())
        if not name and isinstance(w, (QLineEdit, QPlainTextEdit, QTextEdit)):
            name = _plain(w.placeholderText())
        if name:
            w.setAccessibleName(name)
            named += 1
    return named
