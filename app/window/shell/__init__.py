"""The window's frame: ``MainWindow`` (main_window.py) and what it is built of and with:
the menus (actions.py), the banner, the status bar, the theme, accessible names (a11y.py),
plain-text helpers (plain.py), the garbage-collection policy, and ``gui.run``, the entry
point ``branchwise`` with no subcommand calls."""
