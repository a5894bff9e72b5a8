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


def test_every_llama_cpp_load_goes_through_the_repack_decision():
    """A ``llama_cpp.Llama(`` anywhere but engine/cpu.py ``load_llama`` and the engine's own
    load (engine/model.py, under ``model_params_with_repack``) would load without the
    decision that keeps repacking off where it crashes (README, "CPU support"). A load of
    the vocabulary alone (``vocab_only=True``) computes nothing and is allowed."""
    import ast

    allowed = {"engine/cpu.py", "engine/model.py"}
    offenders = []
    for path in sorted(p for top in ("app", "engine", "storage", "tests", "tools", "packaging")
                       for p in (ROOT / top).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            vocab_only = any(k.arg == "vocab_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                             for k in node.keywords)
            if name == "Llama" and not vocab_only:
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"load these through engine.cpu.load_llama: {offenders}"
