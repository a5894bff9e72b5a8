"""Where the time goes between Enter and the first streamed text drawn in the window.

``ChatController`` starts a ``SendTimeline`` when a message is sent (or, for an edit or a
regeneration, when its request starts) and marks each step with ``time.perf_counter``:

=============  ===========================================================================
``request``    the generate request is about to be sent to the engine process (after the
               checks, the overflow count when one is needed, the prompt read from
               ``chats.sqlite3``)
``stored``     the user message is in ``chats.sqlite3`` (right after the request is sent)
``drawn``      the sent message and the reply's empty bubble are drawn
``token_read`` the window's reader thread read the first token from the pipe
``token``      the UI thread handled it (later than ``token_read`` when it was busy)
``shown``      the text is in the reply's bubble
``painted``    the bubble was painted with it
=============  ===========================================================================

The engine's side comes with the reply's stats: ``queued_ms`` (the request waited in the
engine process behind the request it was busy with: a prewarm batch, a count) and ``ttft_ms``
(from there to the first token). When the reply ends, ``describe`` goes to the log as one
line (debug level); ``breakdown`` gives the same figures to tools (``tools/zero_wait.py``).
"""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QObject

STEPS = ("request", "stored", "drawn", "token_read", "token", "shown", "painted")


class SendTimeline(QObject):
    """The marks of the last send, in perf_counter seconds (``at``) and in milliseconds
    since it started (``ms``)."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.t0: float | None = None
        self.at: dict[str, float] = {}
        self._watched = None

    def start(self) -> None:
        """A new send (or reply): forget the marks of the last one."""
        self.t0 = time.perf_counter()
        self.at = {}
        self._unwatch()

    def mark(self, step: str, at: float | None = None) -> None:
        """Record ``step`` (one of ``STEPS``) now, or at perf_counter ``at``; only its first time."""
        if self.t0 is not None and step not in self.at:
            self.at[step] = time.perf_counter() if at is None else at

    def ms(self, step: str) -> float | None:
        """Milliseconds from the start to ``step`` (None: not reached)."""
        return None if self.t0 is None or step not in self.at else (self.at[step] - self.t0) * 1000

    def watch_paint(self, widget) -> None:
        """Mark ``painted`` at the first paint of ``widget`` (the reply's text label) after ``shown``."""
        self._unwatch()
        self._watched = widget
        widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if watched is self._watched and event.type() == QEvent.Type.Paint and "shown" in self.at:
            self.mark("painted")
            self._unwatch()
        return False

    def _unwatch(self) -> None:
        if self._watched is not None:
            try:
                self._watched.removeEventFilter(self)
            except RuntimeError:  # the bubble was deleted already
                pass
            self._watched = None

    def breakdown(self, stats: dict) -> dict[str, float | None]:
        """The window's TTFT in parts, in milliseconds (None: a step not reached). ``stats``:
        the reply's stats (``ttft_ms``, ``queued_ms``); without them the engine's part is
        one figure (``engine_and_pipe``)."""
        ms = {step: self.ms(step) for step in STEPS}

        def span(a: str | None, b: str) -> float | None:
            start = 0.0 if a is None else ms[a]
            return None if start is None or ms[b] is None else round(ms[b] - start, 1)

        engine = span("request", "token_read")
        queued, ttft = float(stats.get("queued_ms") or 0.0), stats.get("ttft_ms")
        pipe = round(engine - queued - ttft, 1) if engine is not None and ttft is not None else None
        return {
            "before_request": span(None, "request"),
            "engine_queued": round(queued, 1) if ttft is not None else None,
            "engine_ttft": round(ttft, 1) if ttft is not None else None,
            "pipe": pipe,
            "engine_and_pipe": engine,
            "ui_busy": span("token_read", "token"),
            "to_bubble": span("token", "shown"),
            "to_paint": span("shown", "painted"),
            "window_ttft": span(None, "painted"),
        }

    def describe(self, stats: dict) -> str:
        """``breakdown(stats)`` in one line of words (``describe``)."""
        return describe(self.breakdown(stats))


PARTS = (("before_request", "Enter to request"), ("engine_queued", "waiting in the engine process"),
         ("engine_ttft", "engine TTFT"), ("pipe", "pipe"), ("ui_busy", "UI thread busy"),
         ("to_bubble", "into the bubble"), ("to_paint", "painted"))


def describe(breakdown: dict) -> str:
    """A ``SendTimeline.breakdown`` as "Enter to request 3.1 + ... = 85.0 ms" ("?": not reached)."""
    def f(value) -> str:
        return "?" if value is None else f"{value:.1f}"

    return (" + ".join(f"{label} {f(breakdown.get(key))}" for key, label in PARTS)
            + f" = {f(breakdown.get('window_ttft'))} ms")
