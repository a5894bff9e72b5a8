"""Model downloads in the window: each one a task of the window's ``Workers`` running
``engine.hub.download.download`` (resumable, SHA-256 checked, atomic), so a download goes
on while you chat, and ends with the window (its bytes kept for the next attempt).

State of one download (``DownloadState``)::

    RUNNING --done--> DONE
       |  --Cancel--> CANCELLED --Resume--> RUNNING     (the bytes on disk are not fetched again)
       +--error-----> FAILED    --Resume--> RUNNING     (a full disk, a lost connection, a bad hash)

``DownloadFlow`` keeps the downloads by model name and says what happens by signal; the
Models window draws each one's bytes, speed and time left, the status line a small bar.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QProgressBar

from app.window.shell.plain import tooltip
from app.window.workers.tasks import Task, Workers

REPORT_S = 0.1  # at most ten progress reports a second reach the UI thread
SPEED_WINDOW_S = 3.0  # the speed is measured over the last three seconds


class DownloadState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class Download:
    """One model being downloaded: ``name`` (its file name), what to fetch (``files``:
    ``RemoteFile``s, ``extra``: the source note), the repository, and its progress in bytes."""

    name: str
    repo: str
    files: list
    extra: dict
    token: str | None
    state: DownloadState = DownloadState.RUNNING
    done: int = 0
    total: int = 0
    message: str = ""
    paths: list[Path] = field(default_factory=list)
    samples: deque = field(default_factory=lambda: deque(maxlen=64))  # (monotonic s, bytes)
    task: Task | None = None

    @property
    def speed(self) -> float:
        """Bytes a second over the last :data:`SPEED_WINDOW_S` (0 until two samples)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """Seconds to the end at :attr:`speed`; None while the speed is unknown."""
        speed = self.speed
        return (self.total - self.done) / speed if speed > 0 else None


def progress_text(d: Download) -> str:
    """``"41.2 of 98.4 MB · 12.5 MB/s · 5 s left"`` for a running download, else its state's
    sentence (the error is one sentence from the downloader)."""
    if d.state == DownloadState.DONE:
        return f"Downloaded and checked ({d.total / 1e6:,.1f} MB)."
    if d.state != DownloadState.RUNNING:
        return d.message
    text = f"{d.done / 1e6:,.1f} of {d.total / 1e6:,.1f} MB"
    if d.speed > 0:
        text += f" · {d.speed / 1e6:,.1f} MB/s"
    left = d.seconds_left
    if left is not None:
        text += f" · {left:,.0f} s left" if left < 120 else f" · {left / 60:,.0f} min left"
    return text


class DownloadFlow(QObject):
    """The window's model downloads into ``models_dir`` (``<data dir>/models``), each a task
    of ``workers``. ``status_bar`` is the small bar the status line shows while any runs.

    Signals: changed(name) (progress or a new state), finished(name, first part's path),
    failed(name, sentence) (also for Cancel, with the bytes kept).
    """

    changed = Signal(str)
    finished = Signal(str, str)
    failed = Signal(str, str)

    def __init__(self, *, workers: Workers, models_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.workers, self.models_dir = workers, Path(models_dir)
        self.downloads: dict[str, Download] = {}
        self.status_bar = QProgressBar()
        self.status_bar.setObjectName("download_status")
        self.status_bar.setMaximumWidth(180)
        self.status_bar.setRange(0, 1000)
        self.status_bar.setAccessibleName("Model download")
        self.status_bar.hide()

    @property
    def running(self) -> list[Download]:
        return [d for d in self.downloads.values() if d.state == DownloadState.RUNNING]

    def start(self, name: str, repo: str, files: list, extra: dict, token: str | None) -> Download:
        """Download ``files`` (one model, every part) of ``repo`` as ``name``; a download of
        that name already running is returned as it is. Bytes a previous attempt kept are
        not fetched again."""
        old = self.downloads.get(name)
        if old is not None and old.state == DownloadState.RUNNING:
            return old
        d = Download(name=name, repo=repo, files=files, extra=extra, token=token,
                     total=sum(f.size for f in files))
        self.downloads[name] = d
        d.task = self.workers.start(lambda task: self._run(task, d), name=f"download {name}",
                                    success=lambda paths: self._done(d, paths),
                                    failure=lambda exc: self._failed(d, exc),
                                    progress=lambda value: self._progress(d, value))
        if d.task is None:  # the window is closing
            d.state, d.message = DownloadState.CANCELLED, "The window is closing."
        self.changed.emit(name)
        self._update_bar()
        return d

    def resume(self, name: str) -> Download | None:
        """Start ``name`` again after Cancel or an error, from the bytes on disk."""
        d = self.downloads.get(name)
        if d is None or d.state == DownloadState.RUNNING:
            return d
        return self.start(d.name, d.repo, d.files, d.extra, d.token)

    def cancel(self, name: str) -> None:
        """Stop ``name``; its bytes stay for :meth:`resume` (or a later download)."""
        d = self.downloads.get(name)
        if d is not None and d.task is not None and d.state == DownloadState.RUNNING:
            d.task.cancel()

    def _run(self, task: Task, d: Download) -> list[Path]:
        from engine.hub import download

        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= REPORT_S or done >= total:
                last[0] = now
                task.report((now, done, total))

        return download.download(d.files, self.models_dir, d.repo, token=d.token, progress=progress,
                                 cancel=task.cancelled, extra=d.extra)

    def _progress(self, d: Download, value) -> None:
        now, done, total = value
        d.done, d.total = done, total
        d.samples.append((now, done))
        while len(d.samples) > 2 and now - d.samples[0][0] > SPEED_WINDOW_S:
            d.samples.popleft()
        self.changed.emit(d.name)
        self._update_bar()

    def _done(self, d: Download, paths) -> None:
        d.state, d.paths, d.done = DownloadState.DONE, list(paths), d.total
        self.changed.emit(d.name)
        self._update_bar()
        self.finished.emit(d.name, str(paths[0]))

    def _failed(self, d: Download, exc: Exception) -> None:
        from engine.hub.download import Cancelled, DownloadError

        d.state = DownloadState.CANCELLED if isinstance(exc, Cancelled) else DownloadState.FAILED
        if isinstance(exc, DownloadError):
            d.message = str(exc)
        elif isinstance(exc, OSError):
            d.message = f"The download of {d.name} failed: {exc.strerror or exc} ({self.models_dir})."
        else:
            d.message = f"The download of {d.name} failed: {exc}."
        self.changed.emit(d.name)
        self._update_bar()
        self.failed.emit(d.name, d.message)

    def _update_bar(self) -> None:
        """The status line's bar: the bytes of every running download together."""
        running = self.running
        if not running:
            self.status_bar.hide()
            return
        done, total = sum(d.done for d in running), sum(d.total for d in running)
        self.status_bar.setValue(int(1000 * done / total) if total else 0)
        first = running[0].name if len(running) == 1 else f"{len(running)} models"
        self.status_bar.setFormat(f"Downloading {first[:24]}… %p%")
        self.status_bar.setToolTip(tooltip("\n".join(f"{d.name}: {progress_text(d)}" for d in running)))
        self.status_bar.show()
