"""Guard against the Qt binding bug that would crash the window mid-reply.

PySide6 6.12.0 drops one reference to ``True`` on every emission of a Python-defined
signal to a Python slot; after a few hundred emissions (a few hundred streamed tokens)
CPython aborts with "bool_dealloc: deallocating True or False". 6.11.2 is fine.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QObject, Signal  # noqa: E402


class _Emitter(QObject):
    fired = Signal(int)


def test_signal_emission_keeps_bool_refcounts(qapp):
    e = _Emitter()
    hits = []
    e.fired.connect(hits.append)
    before = sys.getrefcount(True)
    for i in range(50):
        e.fired.emit(i)
    after = sys.getrefcount(True)
    e.fired.disconnect()
    sys_true_lost = before - after
    assert len(hits) == 50
    assert sys_true_lost < 10, (
        f"this PySide6 loses a reference to True per signal emission ({sys_true_lost} for 50): "
        "the app would abort after a few hundred streamed tokens. Use PySide6-Essentials != 6.12.0."
    )
