"""The window's menus and actions, declared once by name.

``ACTIONS`` lists every action: (menu, name, text, shortcut, checkable). ``build_menus``
creates them on a window and connects each to the handler of the same name (the window
passes its flows' methods: ``MainWindow._menu_handlers``), so a shortcut, a menu entry and
what it runs are read in two places side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow

from app.window.shell import theme

SEPARATOR = None
ACTIONS = {
    "&File": [
        ("new_chat", "New chat", "Ctrl+N", False),
        SEPARATOR,
        ("open_model_dialog", "Open model…", "Ctrl+O", False),
        ("recent_models", "Recent models", None, False),  # a submenu, filled when shown
        ("show_model_info", "Model info…", None, False),
        ("restart_engine", "Restart engine", None, False),
        SEPARATOR,
        ("import_chats", "Import chats…", "Ctrl+I", False),
        ("import_folder", "Import a folder of chats…", None, False),
        ("export_chat", "Export chat…", "Ctrl+Shift+E", False),
        SEPARATOR,
        ("open_settings", "Settings…", "Ctrl+,", False),
        SEPARATOR,
        ("close", "Quit", QKeySequence.StandardKey.Quit, False),
    ],
    "&Model": [
        ("find_models", "Find models…", "Ctrl+Shift+M", False),
    ],
    "&Chat": [
        ("focus_search", "Search chats", "Ctrl+F", False),
        ("regenerate_last", "Regenerate last reply", "Ctrl+R", False),
        ("continue_reply", "Continue reply", "Ctrl+Shift+R", False),
        ("edit_last", "Edit last message", "Ctrl+E", False),
        ("stop_reply", "Stop reply", "Esc", False),  # from anywhere in the window
        ("fork_last", "Fork to new chat", None, False),
        SEPARATOR,
        ("copy_conversation_markdown", "Copy conversation as Markdown", "Ctrl+Shift+C", False),
    ],
    "&Server": [
        ("start_api_server", "Start API server", None, False),
        ("stop_api_server", "Stop API server", None, False),
    ],
    "&View": [
        ("toggle_tree", "Conversation tree", "Ctrl+T", True),
        ("theme", "Theme", None, False),  # a submenu of the themes
    ],
}


def build_menus(window: QMainWindow, handlers: Mapping[str, Callable], theme_name: str) -> dict[str, QAction]:
    """Create the menu bar of ``window`` from ``ACTIONS``, each action calling
    ``handlers[name]()``; returns the actions by name.

    ``recent_models`` is a submenu passed to ``handlers["recent_models"](menu)`` each time it
    is shown (to fill it); ``theme`` a group of checkable themes calling
    ``handlers["theme"](name)``, ``theme_name`` checked.

    Raises:
        KeyError: ``handlers`` lacks one of the names.
    """
    actions: dict[str, QAction] = {}
    bar = window.menuBar()
    for title, entries in ACTIONS.items():
        menu = bar.addMenu(title)
        for entry in entries:
            if entry is SEPARATOR:
                menu.addSeparator()
                continue
            name, text, shortcut, checkable = entry
            if name == "recent_models":
                recent = menu.addMenu(text)
                fill = handlers[name]
                recent.aboutToShow.connect(lambda m=recent, f=fill: f(m))
                continue
            if name == "theme":
                _theme_menu(window, menu.addMenu(text), handlers[name], theme_name)
                continue
            action = QAction(text, window)
            if shortcut:
                action.setShortcut(QKeySequence(shortcut))
                # the whole window, whichever widget has focus (a widget that uses the key
                # itself, such as the inline editor's Esc, claims it by ShortcutOverride)
                action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            action.setCheckable(checkable)
            action.triggered.connect(lambda _checked=False, run=handlers[name]: run())
            menu.addAction(action)
            actions[name] = action
    return actions


def _theme_menu(window: QMainWindow, menu, set_theme: Callable[[str], None], current: str) -> None:
    group = QActionGroup(window)
    for name in theme.THEMES:
        action = QAction(name.capitalize(), window, checkable=True)
        action.setChecked(name == current)
        action.triggered.connect(lambda _checked=False, n=name: set_theme(n))
        group.addAction(action)
        menu.addAction(action)
