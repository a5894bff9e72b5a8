"""The window's menus and actions, declared once by name.

``ACTIONS`` lists every action: (menu, name, text, shortcut, checkable). ``build_menus``
creates them on a window and connects each to the window's method of the same name,
so a shortcut, a menu entry and the method it runs are read in one place.
"""

from __future__ import annotations

from PySide6.QtGui import QAction, QActionGroup, QKeySequence

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
        SEPARATOR,
        ("open_settings", "Settings…", "Ctrl+,", False),
        SEPARATOR,
        ("close", "Quit", QKeySequence.StandardKey.Quit, False),
    ],
    "&Chat": [
        ("focus_search", "Search chats", "Ctrl+F", False),
        ("regenerate_last", "Regenerate last reply", "Ctrl+R", False),
        ("edit_last", "Edit last message", "Ctrl+E", False),
        ("stop_reply", "Stop reply", None, False),
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


def build_menus(window) -> dict[str, QAction]:
    """Create the menu bar of ``window`` from ``ACTIONS``; returns the actions by name.

    ``recent_models`` becomes ``window.recent_menu`` (filled by ``window.fill_recent``
    when shown); ``theme`` a group of checkable themes calling ``window.set_theme``."""
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
                window.recent_menu = menu.addMenu(text)
                window.recent_menu.aboutToShow.connect(window.fill_recent)
                continue
            if name == "theme":
                _theme_menu(window, menu.addMenu(text))
                continue
            action = QAction(text, window)
            if shortcut:
                action.setShortcut(QKeySequence(shortcut))
            action.setCheckable(checkable)
            action.triggered.connect(lambda _checked=False, n=name: getattr(window, n)())
            menu.addAction(action)
            actions[name] = action
    return actions


def _theme_menu(window, menu) -> None:
    group = QActionGroup(window)
    for name in theme.THEMES:
        action = QAction(name.capitalize(), window, checkable=True)
        action.setChecked(name == window.settings.theme)
        action.triggered.connect(lambda _checked=False, n=name: window.set_theme(n))
        group.addAction(action)
        menu.addAction(action)
