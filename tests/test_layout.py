"""Where the files sit: developer tools are not in the shipped package, and the README's
``python -m`` commands name modules that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_developer_tools_are_not_shipped():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert "tools" not in shipped
    for name in ("screenshots", "ui_latency"):
        assert (ROOT / "tools" / f"{name}.py").exists()
        assert not list((ROOT / "app").rglob(f"{name}.py"))
    assert project["project"]["scripts"]["branchwise"] == "app.cli:main"


def test_readme_python_m_commands_exist():
    modules = re.findall(r"python -m ([\w.]+)", (ROOT / "README.md").read_text())
    assert modules
    for mod in modules:
        path = ROOT / Path(*mod.split("."))
        assert path.with_suffix(".py").exists() or (path / "__main__.py").exists(), mod


def test_no_module_over_600_lines_nor_class_over_400():
    """Every package stays split by job (issues #8, #26): no module in app/, engine/, storage/
    or tools/ over 600 lines, no class over 400."""
    import ast

    files = [f for top in ("app", "engine", "storage", "tools") for f in (ROOT / top).rglob("*.py")]
    assert len(files) > 100  # the scan sees the packages
    for file in files:
        text = file.read_text(encoding="utf-8")
        rel = file.relative_to(ROOT)
        assert text.count("\n") <= 600, f"{rel} has {text.count(chr(10))} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                assert length <= 400, f"{rel}: class {node.name} is {length} lines"


def test_the_window_is_in_rooms_and_main_window_only_assembles():
    """Issue #26.4: app/window/ has its rooms and no flat modules; MainWindow has no mixins
    and at most 25 methods; no flow reaches through the window (``self.w``)."""
    import ast

    window = ROOT / "app" / "window"
    assert sorted(p.name for p in window.glob("*.py")) == ["__init__.py"]
    rooms = {p.name for p in window.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"shell", "transcript", "tree", "flows", "workers", "settings"} <= rooms
    tree = ast.parse((window / "shell" / "main_window.py").read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MainWindow")
    assert [ast.unparse(b) for b in main.bases] == ["QMainWindow"]
    methods = [n.name for n in main.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= 25, methods
    for file in window.rglob("*.py"):
        assert not re.search(r"self\.w\b", file.read_text(encoding="utf-8")), file.relative_to(ROOT)
