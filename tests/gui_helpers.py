"""Helpers for the GUI tests: timeouts, test sampling, a new chat, send and wait.

The fixtures (``open_window``, ``data_dir``, ``no_leaks``) are in conftest.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

LOAD_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_MS = 180_000
TEST_SAMPLING = {"temperature": 0.0, "max_tokens": 24, "seed": 1}


def new_chat(window, sampling: dict | None = None, system_prompt: str = "") -> int:
    """Create a conversation with test sampling, show it, and return its id."""
    conv = window.store.create_conversation(system_prompt=system_prompt,
                                            sampling={**TEST_SAMPLING, **(sampling or {})})
    window.show_conversation(conv.id)
    return conv.id


def send_and_wait(qtbot, window, text: str) -> int:
    """Type ``text`` in the composer, press Enter, wait for the reply; return its message id."""
    from PySide6.QtCore import Qt

    window.composer.input.setPlainText(text)
    with qtbot.waitSignal(window.reply_finished, timeout=REPLY_TIMEOUT_MS) as blocker:
        qtbot.keyClick(window.composer.input, Qt.Key.Key_Return)
    return blocker.args[0]


def wait_for_tree(qtbot, window) -> None:
    """Wait until the tree panel has drawn the tree it reads and lays out off the UI thread."""
    qtbot.waitUntil(lambda: not window.tree.loading, timeout=30_000)
