"""Progress bars on the terminal for the CLI: model hashing, model load, restore, prefill.

Fed by the engine's existing callbacks (``Engine(progress=...)`` while the model file is
hashed, ``Engine.generate(on_progress=...)`` for restore and prefill) and drawn with
rich (https://rich.readthedocs.io/en/stable/progress.html) on stderr, erased when done
(``transient``), so stdout carries only the reply.

Off when stderr is not a terminal, with ``--json`` and with ``--quiet``. A phase shows
only once it has run for ``DELAY_S``: a restore of a few milliseconds draws nothing.
Call :meth:`TerminalProgress.stop` before printing the first reply token.

The bars are written to a duplicate of stderr's file descriptor, taken when the progress
is made. llama-cpp-python points descriptor 2 at /dev/null while it loads a model
(``llama_cpp._utils.suppress_stdout_stderr``); a bar drawn then, or a console that asked
"is this a terminal?" then, would be lost for the whole command.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Final, TextIO

from storage.paths import human_bytes

DELAY_S: Final = 0.3
"""A phase is drawn only after running this long (seconds)."""

LABELS: Final = {
    "hash": "Hashing the model file",
    "load": "Loading the model",
    "restore": "Restoring the KV cache",
    "prefill": "Reading the prompt (prefill)",
    "import": "Importing",
}
"""The text shown for each phase; ``total`` is in bytes for hash, tokens for restore and
prefill, items for import."""


def wanted(args, stream: TextIO | None = None) -> bool:
    """True when progress should be drawn: ``stream`` (stderr) is a terminal and neither
    ``--json`` nor ``--quiet`` was given."""
    stream = sys.stderr if stream is None else stream
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TerminalProgress:
    """Progress of one command's phases; every method is a no-op when disabled.

    Thread-safe: the engine may report from a worker thread while a timer draws.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None, delay_s: float = DELAY_S):
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self._own_stream = False
        if enabled:
            self._own_stream = self._duplicate_stream()
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._progress = None  # rich.progress.Progress once something is drawn
        self._tasks: dict[str, int] = {}  # phase -> rich task id
        self._started: dict[str, float] = {}  # phase -> monotonic start
        self._state: dict[str, tuple[int, int | None]] = {}  # phase -> (done, total)
        self._stopped = False

    def _duplicate_stream(self) -> bool:
        """Write to a copy of the stream's descriptor (see the module docstring); False when
        the stream has none (a test's StringIO) and is written to as it is."""
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return False
        encoding = getattr(self.stream, "encoding", None) or "utf-8"
        self.stream = os.fdopen(os.dup(fd), "w", encoding=encoding, errors="replace", buffering=1)
        return True

    @classmethod
    def for_args(cls, args) -> TerminalProgress:
        return cls(wanted(args))

    # -- what the engine calls -------------------------------------------------------

    def hashing(self, done: int, total: int) -> None:
        """``Engine(progress=...)``: bytes of the model file hashed so far (after the load)."""
        self.finish("load")
        self.update("hash", done, total)

    def on_progress(self, stage: str, done: int, total: int) -> None:
        """``Engine.generate(on_progress=...)``: stage "restore" or "prefill", in tokens."""
        for earlier in ("hash", "load", "restore"):
            if earlier != stage:
                self.finish(earlier)
        self.update(stage, done, total)

    @contextmanager
    def loading(self):
        """Wrap the model load (no callbacks there): a spinner after DELAY_S."""
        self.update("load", 0, None)
        try:
            yield self
        finally:
            self.finish("load")

    # -- generic -----------------------------------------------------------------------

    def update(self, phase: str, done: int, total: int | None) -> None:
        """Record ``done`` of ``total`` (None: unknown) for ``phase``; draw it once it has
        been running for ``delay_s``."""
        if not self.enabled:
            return
        with self._lock:
            if self._stopped:
                return
            now = time.monotonic()
            if phase not in self._started:  # a new phase: draw it later if it is still running
                self._started[phase] = now
                timer = threading.Timer(self.delay_s, self._draw_if_running, (phase,))
                timer.daemon = True
                timer.start()
            self._state[phase] = (done, total)
            if phase not in self._tasks:
                if now - self._started[phase] < self.delay_s or (total and done >= total):
                    return
                self._start_task(phase)
            self._progress.update(self._tasks[phase], completed=done, total=total,
                                  amount=_amount(phase, done, total))
            self._progress.refresh()  # drawn now, not only by rich's timer (starved on a busy machine)

    def _draw_if_running(self, phase: str) -> None:
        with self._lock:
            if not self._stopped and phase in self._started and phase not in self._tasks:
                self._start_task(phase)
                self._progress.refresh()

    def finish(self, phase: str) -> None:
        """Mark ``phase`` complete (it will not be drawn if it never was)."""
        if not self.enabled:
            return
        with self._lock:
            self._started.pop(phase, None)
            task = self._tasks.get(phase)
            if task is not None and self._progress is not None:
                total = self._state.get(phase, (0, None))[1]
                self._progress.update(task, completed=total or 1, total=total or 1)

    def stop(self) -> None:
        """Erase every bar and draw nothing more (call before the reply is printed)."""
        if not self.enabled:
            return
        with self._lock:
            self._stopped = True
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
            if self._own_stream:
                self._own_stream = False
                with contextlib.suppress(OSError):
                    self.stream.close()

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- drawing -----------------------------------------------------------------------

    def _start_task(self, phase: str) -> None:
        """Create the rich Progress on first use and a task for ``phase`` (lock held)."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        if self._progress is None:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                TextColumn("{task.fields[amount]}"), TimeElapsedColumn(),
                # a terminal: wanted() asked before anything could point descriptor 2 elsewhere
                console=Console(file=self.stream, force_terminal=True),
                transient=True,
                refresh_per_second=8,
            )
            self._progress.start()
        done, total = self._state.get(phase, (0, None))
        self._tasks[phase] = self._progress.add_task(
            LABELS.get(phase, phase), total=total, completed=done, amount=_amount(phase, done, total))


def _amount(phase: str, done: int, total: int | None) -> str:
    """"done / total" in the phase's unit: bytes for hashing, tokens for restore and prefill."""
    if total is None:
        return ""
    if phase == "hash":
        return f"{human_bytes(done)} / {human_bytes(total)}"
    unit = "items" if phase == "import" else "tokens"
    return f"{done:,} / {total:,} {unit}"
