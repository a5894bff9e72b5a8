"""Server → Start API server / Stop: ``branchwise serve`` as a child process of the window.

The window's engine lives in its own child process and serves one conversation; the API
server needs an engine of its own (``app.serve.server.ApiServer`` runs requests on its
own worker thread). So the window starts ``python -m app.cli serve --json`` on the same
model file, context size and data folder: it has its own llama.cpp context and shares
the prefix store (``kvcache.sqlite3``, ``journal_mode=DELETE``, and its block files), so KV the window stored is restored
for a client that sends the same history, and the other way round. The API key is
passed in the environment (``BRANCHWISE_API_KEY``), never on the command line.

``ServerController.state`` is an ``ApiState``; ``state_changed(str)`` fires on every
change; the status bar shows "API: <url>" while it runs. Nothing here blocks the UI
thread: the child is a ``QProcess`` and its start-up line arrives as a signal.
"""

from __future__ import annotations

import json
import logging
import sys
from enum import StrEnum
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from app.window.flows.model_controller import ModelController
from app.window.settings.settings_model import SettingsModel
from app.window.shell.banner import Banner
from app.window.shell.status_bar import StatusBar

log = logging.getLogger(__name__)

STOP_GRACE_MS = 5_000
"""How long a stopping server may take before it is killed (milliseconds)."""
STDERR_KEPT = 4_000
"""Characters of the server's standard error kept for the error message."""


class ApiState(StrEnum):
    """STOPPED → STARTING → RUNNING → STOPPING → STOPPED; FAILED when it could not start or died."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"


class ServerController(QObject):
    """Starts and stops the API server on ``data_dir`` with ``settings`` and ``model``'s model
    file; reports in ``banner`` and ``status``.

    Attributes: ``state`` (ApiState), ``url`` (the ``.../v1`` base URL while running, else
    ""), ``error`` (why it failed, in words). Signals: ``state_changed(str)``.
    """

    state_changed = Signal(str)

    def __init__(self, *, settings: SettingsModel, model: ModelController, banner: Banner, status: StatusBar,
                 data_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.settings, self.model, self.banner, self.status = settings, model, banner, status
        self.data_dir = Path(data_dir)
        self.state = ApiState.STOPPED
        self.url = ""
        self.error = ""
        self._proc: QProcess | None = None
        self._stdout = b""
        self._stderr = b""
        self._kill_timer = QTimer(self, singleShot=True, interval=STOP_GRACE_MS)
        self._kill_timer.timeout.connect(self._kill)

    @property
    def running(self) -> bool:
        return self.state == ApiState.RUNNING

    def argv(self) -> list[str]:
        """The child's arguments (after the Python executable): the window's model file,
        context size and data folder, and the host and port of the settings."""
        s = self.settings
        args = ["-m", "app.cli", "serve", "--json", "--data-dir", str(self.data_dir),
                "--host", s.api_host, "--port", str(s.api_port), "--ctx-size", str(s.n_ctx)]
        model = self.model.good_path or self.model.path
        if model:
            args += ["--model", str(model)]
        if s.n_threads:
            args += ["--threads", str(s.n_threads)]
        return args

    def start(self) -> None:
        """Start the server (no-op while starting or running); the result arrives as
        ``state_changed`` and, on failure, a banner."""
        if self.state in (ApiState.STARTING, ApiState.RUNNING, ApiState.STOPPING):
            return
        s = self.settings
        from app.serve.server import is_loopback  # the server module loads only when used

        if not is_loopback(s.api_host) and not s.api_key:
            self._fail(f"The API server would listen on {s.api_host}, which other machines can reach, "
                       "so it needs an API key: set one in Settings, or use 127.0.0.1.")
            return
        proc = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.remove("BRANCHWISE_API_KEY")
        if s.api_key:
            env.insert("BRANCHWISE_API_KEY", s.api_key)
        proc.setProcessEnvironment(env)
        proc.setWorkingDirectory(str(Path(__file__).resolve().parents[3]))
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._finished)
        proc.errorOccurred.connect(self._process_error)
        self._proc, self._stdout, self._stderr, self.error = proc, b"", b"", ""
        self._set(ApiState.STARTING)
        proc.start(sys.executable, self.argv())

    def stop(self) -> None:
        """Ask the server to stop (SIGTERM: uvicorn finishes and exits); killed after
        ``STOP_GRACE_MS``."""
        if self._proc is None or self.state in (ApiState.STOPPED, ApiState.STOPPING):
            return
        self._set(ApiState.STOPPING)
        self._proc.terminate()
        self._kill_timer.start()

    def shutdown(self) -> None:
        """Stop the server when the window closes (waits for the child, at most the grace time)."""
        proc = self._proc
        if proc is None:
            return
        proc.finished.disconnect(self._finished)
        proc.terminate()
        if not proc.waitForFinished(STOP_GRACE_MS):
            proc.kill()
            proc.waitForFinished(STOP_GRACE_MS)
        self._proc = None
        self._kill_timer.stop()
        self.state, self.url = ApiState.STOPPED, ""

    # -- the child's output ---------------------------------------------------------------

    def _read_stdout(self) -> None:
        self._stdout += bytes(self._proc.readAllStandardOutput())
        if self.state != ApiState.STARTING or b"\n" not in self._stdout:
            return
        line = self._stdout.split(b"\n", 1)[0]
        try:
            self.url = str(json.loads(line)["url"])
        except (ValueError, KeyError, TypeError):
            log.warning("unexpected first line from branchwise serve: %r", line[:200])
            return
        self._set(ApiState.RUNNING)

    def _read_stderr(self) -> None:
        self._stderr = (self._stderr + bytes(self._proc.readAllStandardError()))[-STDERR_KEPT:]

    def _process_error(self, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._proc = None
            self._fail(f"The API server could not be started: {sys.executable} did not run.")

    def _finished(self, code: int, _status) -> None:
        self._kill_timer.stop()
        self._proc = None
        was = self.state
        self.url = ""
        if was == ApiState.STOPPING:
            self._set(ApiState.STOPPED)
            return
        reason = _last_line(self._stderr.decode("utf-8", "replace")) or f"it exited with code {code}"
        if was == ApiState.STARTING:
            self._fail(f"The API server did not start: {reason}")
        else:
            self._fail(f"The API server stopped unexpectedly: {reason}")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    def _fail(self, message: str) -> None:
        self.error = message
        self.url = ""
        self._set(ApiState.FAILED)
        self.banner.show_message(message, "error")

    def _set(self, state: ApiState) -> None:
        self.state = state
        self.status.set_api(state, self.url)
        self.state_changed.emit(str(state))


def _last_line(text: str) -> str:
    """The last non-empty line of ``text`` (a child's standard error), without a traceback's frames."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""

