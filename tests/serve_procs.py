"""Real servers in child processes for tests/test_serve.py and tests/test_remote.py:
``branchwise serve`` and llama-cpp-python's own ``python -m llama_cpp.server``, both on
a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server process; ``url`` is its ``.../v1`` base URL once :meth:`start` returns."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.argv, self.env = argv, {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.stderr_path = None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class BranchwiseServe(ServerProcess):
    """``branchwise serve --json --port 0 ...``: the first stdout line names the URL."""

    def __init__(self, data_dir, *args, log_path=None):
        super().__init__([sys.executable, "-m", "app.cli", "serve", "--json", "--port", "0", "--data-dir",
                          str(data_dir), "--ctx-size", "4096", *map(str, args)], {"BRANCHWISE_LOG": "INFO"})
        data_dir = Path(data_dir)  # the log sits beside the data folder: a file of its own in it is refused
        self.stderr_path = log_path or data_dir.parent / f"{data_dir.name}-serve-stderr.log"

    def start(self) -> "BranchwiseServe":
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE,
                                     stderr=self.stderr_path.open("a"), text=True)
        line = self.proc.stdout.readline()
        assert line, f"branchwise serve exited: {self.stderr()}"
        self.url = json.loads(line)["url"]
        return self


class LlamaCppServer(ServerProcess):
    """llama-cpp-python's OpenAI-compatible server (an independent implementation)."""

    def __init__(self, model_path, log_dir, n_ctx: int = 4096):
        self.port = free_port()
        super().__init__([sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host",
                          "127.0.0.1", "--port", str(self.port), "--n_ctx", str(n_ctx)])
        self.stderr_path = log_dir / "llama-cpp-server.log"

    def start(self) -> "LlamaCppServer":
        out = self.stderr_path.open("a")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=out)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with httpx.Client(trust_env=False) as client:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, f"llama_cpp.server exited: {self.stderr()}"
                try:
                    if client.get(self.url + "/models", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"llama_cpp.server did not start: {self.stderr()}")
