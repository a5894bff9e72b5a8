"""The watchdog behind Stop: the engine checks for Stop between prefill batches and between
tokens, so a healthy one answers within one batch. After ``STOP_HINT_S`` without an answer
the window offers "End engine now"; after ``STOP_WATCHDOG_S`` it ends the engine process
itself (``EngineClient.kill_unresponsive``); ModelController then starts a new one and the
reply (or the message being counted) is kept, marked stopped."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

from app.window.shell.banner import Banner
from app.window.workers.engine_client import STOP_HINT_S, STOP_WATCHDOG_S, EngineClient

HINT_ACTION = "End engine now"


class StopWatchdog(QObject):
    """Offers in ``banner`` to end ``client``'s engine, then ends it. ``waiting()`` tells
    whether Stop is still unanswered; ``start()`` when Stop is pressed, ``settle()`` when
    the engine answered. ``hint`` and ``deadline`` are the two timers (tests shorten them)."""

    def __init__(self, banner: Banner, client: EngineClient, waiting: Callable[[], bool],
                 parent: QObject | None = None):
        super().__init__(parent)
        self.banner, self.client = banner, client
        self.waiting = waiting
        self.hint = QTimer(self, singleShot=True, interval=int(STOP_HINT_S * 1000))
        self.hint.timeout.connect(self._offer)
        self.deadline = QTimer(self, singleShot=True, interval=int(STOP_WATCHDOG_S * 1000))
        self.deadline.timeout.connect(self.force_stop)
        self._offered = False

    def start(self) -> None:
        self.hint.start()
        self.deadline.start()

    def settle(self) -> None:
        """The engine answered (or the request ended): stand down, and take back the offer."""
        self.hint.stop()
        self.deadline.stop()
        if self._offered:
            self._offered = False
            if self.banner.button(HINT_ACTION) is not None:
                self.banner.hide()

    def _offer(self) -> None:
        if not self.waiting():
            return
        self._offered = True
        self.banner.show_message(
            "The engine finishes its current step before it stops; on a busy machine that can take a while. "
            f"It will be ended after {STOP_WATCHDOG_S:g} seconds.", "info", [(HINT_ACTION, self.force_stop)])

    def force_stop(self) -> None:
        """End an engine that has not answered Stop: its process is killed, the reply is
        saved as stopped when the death is reported, and ModelController starts a new one."""
        if self.waiting():
            self.client.kill_unresponsive()
