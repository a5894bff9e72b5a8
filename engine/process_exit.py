"""How a process running llama.cpp ended: the words for a native crash.

``multiprocessing`` and ``subprocess`` report a child killed by a signal as a negative
exit code on POSIX (``-signal.SIGSEGV`` is -11) and, on Windows, the process's exit
status: an NTSTATUS exception code such as 0xC0000005 (access violation, ntstatus.h). A
crash inside llama.cpp (a segmentation fault, an illegal instruction, an abort from
GGML_ASSERT) shows up as one of these. The window's engine process and the CLI's
supervised child (app/cli/supervisor.py) both use this.

A stop can reach a supervised process twice (a terminal Ctrl+C, and the copy its
supervisor passes on): :class:`RepeatFilter` tells the two apart, for the CLI's child
(app/cli/interrupts.py) and ``branchwise serve``'s uvicorn (app/serve/server.py).
"""

from __future__ import annotations

import signal
import time

_POSIX_CRASHES = {
    getattr(signal, "SIGSEGV", 11): "segmentation fault",
    getattr(signal, "SIGBUS", 7): "bus error",
    getattr(signal, "SIGILL", 4): "illegal instruction",
    getattr(signal, "SIGFPE", 8): "arithmetic error",
    getattr(signal, "SIGABRT", 6): "abort",
}
_WINDOWS_CRASHES = {  # ntstatus.h
    0xC0000005: "access violation",
    0xC000001D: "illegal instruction",
    0xC0000096: "privileged instruction",
    0xC00000FD: "stack overflow",
    0xC0000409: "abort",  # STATUS_STACK_BUFFER_OVERRUN, what abort() raises under the MSVC runtime
}


def crash_name(exitcode: int | None) -> str | None:
    """"segmentation fault", "abort", ... for an exit code that means a native crash, else None."""
    if exitcode is None:
        return None
    if exitcode < 0:
        return _POSIX_CRASHES.get(-exitcode)
    return _WINDOWS_CRASHES.get(exitcode & 0xFFFFFFFF)


REPEAT_WINDOW_S = 0.5
"""SIGINTs closer together than this are one stop (a terminal Ctrl+C plus its forwarded copy)."""


class RepeatFilter:
    """Tells a repeated delivery of one stop from a new stop (``REPEAT_WINDOW_S``)."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._last: float | None = None

    def is_repeat(self) -> bool:
        """True when the previous accepted signal came less than ``REPEAT_WINDOW_S`` ago."""
        now = self.clock()
        if self._last is not None and now - self._last < REPEAT_WINDOW_S:
            return True
        self._last = now
        return False
