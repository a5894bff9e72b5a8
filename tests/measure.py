"""Run ``branchwise`` in a fresh interpreter and measure its peak memory, for the bounds
tests (tests/test_limits.py, tests/test_remote_bounds.py): they assert the error line and
the memory a refusal took, not wall-clock time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PEAK_RSS_LIMIT_KB = 400 * 1024
"""Far below what a 24 GB KV cache, a 4.7 GB line or any model load takes."""

_SCRIPT = textwrap.dedent("""
    import json, resource, subprocess, sys
    r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    print(json.dumps({"rc": r.returncode, "out": r.stdout, "err": r.stderr,
                      "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


def run_measured(tmp_path, *args, env: dict | None = None, python: str | None = None,
                 timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """``branchwise args`` (or, with ``python``, that script with ``args``) run under a
    fresh interpreter that reports its children's peak resident memory
    (getrusage(RUSAGE_CHILDREN).ru_maxrss, KiB on Linux): the command and its supervised
    child, nothing of this test process. Returns (the command's result, peak KiB)."""
    command = [sys.executable, "-c", python, *map(str, args)] if python else \
        [sys.executable, "-m", "app.cli", *map(str, args)]
    full_env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path / "data"), **(env or {})}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, *command], capture_output=True, text=True,
                       env=full_env, timeout=timeout)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    return subprocess.CompletedProcess(args, d["rc"], d["out"], d["err"]), d["rss"]


def one_line(r) -> str:
    """The command's stderr, asserted to be one line and no traceback."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr
