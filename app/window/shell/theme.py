"""Light and dark palettes (Fusion style) that follow the system colour scheme or a choice."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")


@dataclass(frozen=True)
class Colors:
    """Colours the transcript and tree panel draw with (CSS hex strings)."""

    dark: bool
    window: str
    base: str
    text: str
    muted: str
    accent: str
    user_bubble: str
    assistant_bubble: str
    code_bg: str
    border: str
    cached: str
    pygments_style: str
    search_mark: str = "#ffe066"  # the background of a searched word in an opened message


LIGHT = Colors(False, "#f5f5f7", "#ffffff", "#1d1d1f", "#6e6e73", "#0a63c9", "#e3efff", "#ffffff",
               "#f3f4f6", "#d6d6db", "#1f9d55", "friendly")
DARK = Colors(True, "#1e1f22", "#26272b", "#e6e6e8", "#9a9aa2", "#5aa2ff", "#23344d", "#2b2c31",
              "#17181b", "#3a3b41", "#3ecf8e", "monokai", "#806000")


def system_is_dark() -> bool:
    """True when the desktop asks for a dark colour scheme (Qt 6.5+ style hints)."""
    hints = QGuiApplication.styleHints()
    try:
        return hints.colorScheme() == Qt.ColorScheme.Dark
    except AttributeError:  # older Qt: guess from the default palette
        return QApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def resolve(theme: str) -> Colors:
    """The colours for ``theme`` ("system", "light" or "dark")."""
    if theme == "dark" or (theme == "system" and system_is_dark()):
        return DARK
    return LIGHT


def apply(app: QApplication, theme: str) -> Colors:
    """Set the Fusion style and a palette for ``theme`` on ``app``; return the colours used."""
    colors = resolve(theme)
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    p = QPalette()
    c = QColor
    p.setColor(QPalette.ColorRole.Window, c(colors.window))
    p.setColor(QPalette.ColorRole.WindowText, c(colors.text))
    p.setColor(QPalette.ColorRole.Base, c(colors.base))
    p.setColor(QPalette.ColorRole.AlternateBase, c(colors.window))
    p.setColor(QPalette.ColorRole.Text, c(colors.text))
    p.setColor(QPalette.ColorRole.Button, c(colors.base if colors.dark else "#ececf0"))
    p.setColor(QPalette.ColorRole.ButtonText, c(colors.text))
    p.setColor(QPalette.ColorRole.ToolTipBase, c(colors.base))
    p.setColor(QPalette.ColorRole.ToolTipText, c(colors.text))
    p.setColor(QPalette.ColorRole.PlaceholderText, c(colors.muted))
    p.setColor(QPalette.ColorRole.Highlight, c(colors.accent))
    # white on the dark theme's light-blue accent is 2.6:1; a near-black is over 7:1 (WCAG asks 4.5:1)
    p.setColor(QPalette.ColorRole.HighlightedText, c("#0d1b2a" if colors.dark else "#ffffff"))
    p.setColor(QPalette.ColorRole.Link, c(colors.accent))
    p.setColor(QPalette.ColorRole.BrightText, c("#ff5555"))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, c(colors.muted))
    app.setPalette(p)
    return colors
