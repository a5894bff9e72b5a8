"""The layering rule: app -> engine -> storage, and inside app the Qt-free session layer
(app.session) under both front ends (app.cli, app.window), enforced by import-linter
contracts in pyproject.toml. A broken contract fails this test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_import_contracts_are_kept():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_the_cli_path_does_not_load_qt():
    code = ("import sys, app.cli, app.session, engine.core, storage.prefix_store, storage.chats; "
            "sys.exit(1 if any(m.startswith('PySide6') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
