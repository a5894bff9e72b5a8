"""Whether the window is closing: ``Lifetime``, shared by the flows.

A callback that arrives late (a deferred count, an engine answer, a finished import)
checks ``closed`` before it draws or writes anything."""

from __future__ import annotations


class Lifetime:
    """``closed`` turns True once, when the window starts to shut down (``close()``)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class SignalStop:
    """Ctrl+C in the terminal that started the window, and ``kill PID``: the window closes
    as if its close button were pressed (the chats are saved, the engine finishes the KV
    snapshot of a finished reply, within ``engine_client.STOP_TIMEOUT_S``), instead of
    ignoring SIGINT or dying at once on SIGTERM.

    Python runs a signal handler only when the interpreter gets control, which Qt's event
    loop does not give it; so the C-level handler writes to a socket (``signal.set_wakeup_fd``)
    that a ``QSocketNotifier`` watches. ``signum`` is the signal that closed the window, 0
    when none did."""

    def __init__(self, window) -> None:
        import signal
        import socket

        from PySide6.QtCore import QSocketNotifier

        self.signum = 0
        self._window = window
        self._read, self._write = socket.socketpair()
        for end in (self._read, self._write):
            end.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno())
        self._previous = {sig: signal.signal(sig, self._remember) for sig in (signal.SIGINT, signal.SIGTERM)}
        self._notifier = QSocketNotifier(self._read.fileno(), QSocketNotifier.Type.Read)
        self._notifier.activated.connect(self._close_window)

    def _remember(self, signum, _frame) -> None:
        if not self.signum:
            self.signum = signum

    def _close_window(self, *_args) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            self._read.recv(512)  # drain; the Python handler has run by now
        if self.signum:
            self._window.close()

    def restore(self) -> None:
        """Put back the handlers and the wakeup descriptor that were there before."""
        import signal

        self._notifier.setEnabled(False)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._read.close()
        self._write.close()
