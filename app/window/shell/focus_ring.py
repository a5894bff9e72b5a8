"""A visible focus outline: ``FocusRing`` draws a 2 px ring in the theme's accent colour
around whichever widget of the window (or of a dialog over it) has the keyboard focus.

Fusion draws little or no focus indication for most widgets (tool buttons, lists, the tree
canvas), and a style sheet ``:focus`` rule would replace each widget's whole look, so the
ring is a ``QFocusFrame``: a widget of its own over the focused one, following it when it
moves, resizes or hides, and transparent to the mouse. A button focused by a mouse click
gets no ring (a click shows where it went); the keyboard, a shortcut and a text box always do.
"""

from __future__ import annotations

import shiboken6
from PySide6.QtCore import QObject, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QApplication,
    QFocusFrame,
    QLineEdit,
    QPlainTextEdit,
    QScrollArea,
    QTextEdit,
    QWidget,
)

RING_PX = 2
"""The ring's width in pixels."""

_TEXT_BOXES = (QLineEdit, QPlainTextEdit, QTextEdit)


class _Frame(QFocusFrame):
    def __init__(self, color: str):
        super().__init__()
        self.color = QColor(color)
        self.setObjectName("focus_ring")

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(self.color, RING_PX)
        p.setPen(pen)
        half = RING_PX / 2
        p.drawRoundedRect(QRectF(self.rect()).adjusted(half, half, -half, -half), 4, 4)


class FocusRing(QObject):
    """The ring for ``window``; ``set_color`` follows the theme. ``target`` is the widget
    it is drawn around (None: hidden)."""

    def __init__(self, window: QWidget, color: str):
        super().__init__(window)
        self.window = window
        self.color = color
        self._frame = _Frame(color)
        self.target: QWidget | None = None
        # Tab reaches every control (the bubbles' tool buttons too), not only text boxes and
        # lists as some platforms (macOS, offscreen) have it by default
        QGuiApplication.styleHints().setTabFocusBehavior(Qt.TabFocusBehavior.TabFocusAllControls)
        QApplication.instance().focusChanged.connect(self._focus_changed)

    @property
    def frame(self) -> QFocusFrame:
        """The ring's widget: it lives beside the focused widget, so it goes when that
        widget's parent is deleted (a bubble drawn again, a closed dialog); then a new one."""
        if not shiboken6.isValid(self._frame):
            self._frame = _Frame(self.color)
        return self._frame

    def set_color(self, color: str) -> None:
        """Draw the ring in ``color`` (a CSS colour, e.g. the theme's accent)."""
        self.color = color
        self.frame.color = QColor(color)
        self.frame.update()

    def _ours(self, widget: QWidget) -> bool:
        top = widget.window()
        while top is not None:
            if top is self.window:
                return True
            parent = top.parentWidget()
            top = parent.window() if parent is not None else None
        return False

    def _focus_changed(self, _old: QWidget | None, new: QWidget | None) -> None:
        target = None
        if new is not None and new is not self.window and self._ours(new):
            clicked = QGuiApplication.mouseButtons() != Qt.MouseButton.NoButton
            if not clicked or isinstance(new, _TEXT_BOXES):
                target = new
                scroll = _scroll_area_of(new)
                if scroll is not None:  # around the visible box, not the whole scrolled canvas
                    target = scroll
        self.target = target
        frame = self.frame
        frame.setWidget(target)
        if target is not None:
            frame.show()
            frame.raise_()
        else:
            frame.hide()


def _scroll_area_of(widget: QWidget) -> QAbstractScrollArea | None:
    """The scroll area that shows ``widget`` as its whole content (the tree canvas in its
    ``QScrollArea``), or ``widget`` itself when it is one; else None."""
    if isinstance(widget, QAbstractScrollArea):
        return widget
    viewport = widget.parentWidget()
    area = viewport.parentWidget() if viewport is not None else None
    if isinstance(area, QScrollArea) and area.widget() is widget:
        return area
    return None
