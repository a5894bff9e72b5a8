"""Qt fixtures for the GUI tests (imported by tests/test_gui_*.py).

``QT_QPA_PLATFORM=offscreen`` is set before Qt is imported. ``open_window`` opens
MainWindow on a data folder and closes every window it opened at the end of the test;
``no_leaks`` then fails the test if a thread or a child process is still running.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

LOAD_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_MS = 180_000
TEST_SAMPLING = {"temperature": 0.0, "max_tokens": 24, "seed": 1}


@pytest.fixture
def no_leaks():
    """Fail if the test leaves a thread or a child process running."""
    threads = threading.active_count()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        threading.active_count() > threads or multiprocessing.active_children()
    ):
        time.sleep(0.05)
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    assert multiprocessing.active_children() == []


@pytest.fixture
def data_dir(tmp_path):
    """A data folder whose settings keep the engine small (2,048-token context, 1 thread)."""
    d = tmp_path / "data"
    d.mkdir()
    (d / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 1}))
    return d


@pytest.fixture
def open_window(qtbot, no_leaks):
    """``open_window(data_dir, wait=True, **kw)`` -> a shown MainWindow with its model loaded."""
    from app.main_window import MainWindow

    windows = []

    def _open(folder, wait: bool = True, **kw):
        w = MainWindow(folder, **kw)
        windows.append(w)
        w.show()
        if wait and w.model_state != "ready":
            qtbot.waitUntil(lambda: w.model_state in ("ready", "failed", "dead"), timeout=LOAD_TIMEOUT_MS)
            assert w.model_state == "ready", w.banner.text
        return w

    yield _open
    for w in windows:
        w.close()
        w.deleteLater()
    qtbot.wait(10)
    gc.collect()


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
