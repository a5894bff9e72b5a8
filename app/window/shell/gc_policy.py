"""Python's cyclic garbage collector, kept from stalling the window: ``GcPolicy``.

CPython starts a collection at whatever allocation crosses its thresholds, on the UI
thread or on a worker holding the GIL, and a full (generation 2) collection walks every
tracked object. With a 10,000-message tree panel and the Pygments lexers alive (about
170,000 objects) full collections took 50-470 ms on a busy 2-core machine, in the middle of
opening a chat or streaming a reply (measured with ``gc.callbacks`` under
``python -m tools.ui_latency --big``).

While a window is open: the objects alive once it is built (modules, the window) are
frozen (``gc.freeze``: never walked again, they live as long as the process), young
generations are collected as usual, and the full collection runs from a timer every
``FULL_EVERY_MS`` instead of at an allocation. When the last window closes, CPython's
defaults come back.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

FULL_EVERY_MS = 60_000
_NEVER = 1_000_000_000  # a generation-2 threshold no count reaches
_windows = 0
_saved: tuple[int, int, int] | None = None


class GcPolicy(QObject):
    """Holds the policy while ``parent`` (a window) lives; ``release()`` when it closes."""

    def __init__(self, parent: QObject):
        global _windows, _saved
        super().__init__(parent)
        if _windows == 0:
            _saved = gc.get_threshold()
            gc.collect()
            gc.freeze()
            gc.set_threshold(_saved[0], _saved[1], _NEVER)
        _windows += 1
        self._timer = QTimer(self, interval=FULL_EVERY_MS)
        self._timer.timeout.connect(gc.collect)
        self._timer.start()
        self._held = True

    def release(self) -> None:
        """The window closed: with no window left, CPython's own collection policy again."""
        global _windows
        if not self._held:
            return
        self._held = False
        self._timer.stop()
        _windows -= 1
        if _windows == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            gc.unfreeze()
