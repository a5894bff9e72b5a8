"""The layering rule: app -> engine -> storage, and inside app the layers app.cli ->
app.window -> app.serve -> app.session (the Qt-free session layer under both front ends),
enforced by import-linter contracts in pyproject.toml. A broken contract fails this test."""

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
    assert "5 kept, 0 broken" in result.stdout


def _import_cycles(graph) -> list[list[str]]:
    """The groups of modules that import each other in a circle (Tarjan's strongly
    connected components of ``graph``, a grimp import graph), each sorted. Iterative: an
    explicit stack of (module, its imports still to visit), so a long import chain cannot
    reach Python's recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def enter(module: str) -> tuple[str, list[str]]:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        return module, sorted(graph.find_modules_directly_imported_by(module))

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            module, pending = work[-1]
            if pending:
                imported = pending.pop()
                if imported not in index:
                    work.append(enter(imported))
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_import_cycle_in_the_app():
    """No app module reaches itself through its imports, function-local ones included (grimp
    counts those): the CLI's commands, its supervisor and ``serve`` once imported each other
    from inside functions (issue #26, item 5). Imports under ``if TYPE_CHECKING:`` are left
    out: they never run (the window's flows name ChatController in annotations only)."""
    import grimp

    graph = grimp.build_graph("app", "engine", "storage", exclude_type_checking_imports=True)
    assert "app.cli.opening" in graph.modules and graph.find_modules_directly_imported_by("app.cli.supervisor")
    cycles = [c for c in _import_cycles(graph) if any(m.startswith("app.") for m in c)]
    assert not cycles, cycles

    circle = grimp.ImportGraph()  # the finder finds a circle of three, and not a chain
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        circle.add_import(importer=importer, imported=imported)
    assert _import_cycles(circle) == [["p.a", "p.b", "p.c"]]

    chain = grimp.ImportGraph()  # a chain far deeper than the recursion limit, closed at the end
    depth = sys.getrecursionlimit() * 2
    for i in range(depth):
        chain.add_import(importer=f"q.m{i:05d}", imported=f"q.m{i + 1:05d}")
    chain.add_import(importer=f"q.m{depth:05d}", imported="q.m00000")
    assert [len(c) for c in _import_cycles(chain)] == [depth + 1]


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
