"""How the window looks, from the settings: ``Look`` keeps the theme's colors, the focus
outline (``focus_ring.py``) and the tree panel's visibility in step with
``SettingsModel.changed`` (and with the system's light or dark scheme when the theme is
"system")."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QWidget

from app.window.settings.settings_model import SettingsModel
from app.window.shell import theme
from app.window.shell.focus_ring import FocusRing
from app.window.shell.theme import Colors


class Look(QObject):
    """The theme (``colors``, applied to the application at once) and, once ``follow_tree``
    names it, the tree panel's visibility, for ``settings``.

    Signals: ``restyled(Colors)`` after the theme changed; ``tree_shown(bool)`` after the
    panel was shown or hidden."""

    restyled = Signal(object)
    tree_shown = Signal(bool)

    def __init__(self, settings: SettingsModel, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings
        self.colors: Colors = theme.apply(QApplication.instance(), settings.theme)
        self._tree: QWidget | None = None
        # the keyboard focus outline of the window ``parent`` (and of its dialogs)
        self.ring = FocusRing(parent, self.colors.accent) if isinstance(parent, QWidget) else None
        settings.changed.connect(self._changed)
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._system_scheme_changed)

    def follow_tree(self, tree: QWidget) -> None:
        """Show ``tree`` as ``settings.show_tree`` says, now and after each change."""
        self._tree = tree
        tree.setVisible(self.settings.show_tree)

    def toggle_tree(self) -> None:
        """View → Conversation tree: the setting flips (and is saved); the panel follows."""
        self.settings.update(show_tree=not (self._tree is not None and self._tree.isVisible()))

    def set_theme(self, name: str) -> None:
        """View → Theme: "system", "light" or "dark" (saved; applied by the change signal)."""
        self.settings.update(theme=name)

    def apply(self) -> None:
        """Apply the theme of the settings to the application and emit ``restyled``."""
        self.colors = theme.apply(QApplication.instance(), self.settings.theme)
        if self.ring is not None:
            self.ring.set_color(self.colors.accent)
        self.restyled.emit(self.colors)

    def _changed(self, names: frozenset[str]) -> None:
        if "show_tree" in names and self._tree is not None:
            self._tree.setVisible(self.settings.show_tree)
            self.tree_shown.emit(self._tree.isVisible())
        if "theme" in names:
            self.apply()

    def _system_scheme_changed(self, *_args) -> None:
        if self.settings.theme == "system":
            self.apply()
