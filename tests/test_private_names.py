"""No ``_private`` name is used outside the module that defines it (issue #26): across app/,
engine/, storage/ and tools/, a module reads or sets another's private attribute, calls its
private function or imports its private name only through a public one.

What counts as a module's private names: its functions, methods and classes named ``_x``,
the ``self._x`` / ``cls._x`` it assigns, and the ``_x`` it assigns at module or class level.
A use is ``obj._x`` (read, set or deleted), ``getattr/setattr/hasattr/delattr(obj, "_x")``,
or ``from project.module import _x``, where ``obj`` is not ``self``, ``cls`` or ``super()``
(a class reaching its own or its bases' members) and ``_x`` is private to another project
module but not defined by the one that uses it. So a private of a third party (``os._exit``)
is flagged only when the project defines the same name, which is then a collision worth a
look. The tests are not scanned: they may reach into a module to set up a fault.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("app", "engine", "storage", "tools")
PROJECT_PACKAGES = {"app", "engine", "storage", "tools"}
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _names_bound(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _names_bound(element)
    elif isinstance(target, ast.Starred):
        yield from _names_bound(target.value)


def defined_privates(tree: ast.Module) -> set[str]:
    """The private names a module defines (see the module docstring)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _is_private(node.name):
            names.add(node.name)
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and _is_private(node.attr)):
            names.add(node.attr)
    bodies = [tree.body] + [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for statement in body:
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
                targets = [statement.target]
            else:
                continue
            names.update(n for t in targets for n in _names_bound(t) if _is_private(n))
    return names


def private_uses(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """``(line, name, how)`` for every use of a private name through something other than
    ``self``, ``cls`` or ``super()``, and every private name imported from a project module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            yield node.lineno, node.attr, f"{ast.unparse(owner)}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT_PACKAGES:
            for alias in node.names:
                if _is_private(alias.name):
                    yield node.lineno, alias.name, f"from {node.module} import {alias.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
            yield node.lineno, node.args[1].value, f"{node.func.id}(…, {node.args[1].value!r})"


def offences(files: dict[str, ast.Module]) -> list[str]:
    """``path:line: how (private to: owners)`` for each use in ``files`` (relative path ->
    parsed module) of a name private to another of them and not defined where it is used."""
    defined = {rel: defined_privates(tree) for rel, tree in files.items()}
    owners: dict[str, set[str]] = {}
    for rel, names in defined.items():
        for name in names:
            owners.setdefault(name, set()).add(rel)
    found = []
    for rel, tree in sorted(files.items()):
        for line, name, how in sorted(private_uses(tree)):
            if name in owners and name not in defined[rel]:
                found.append(f"{rel}:{line}: {how} (private to {', '.join(sorted(owners[name]))})")
    return found


def _parse(root: Path, folders) -> dict[str, ast.Module]:
    return {path.relative_to(root).as_posix(): ast.parse(path.read_text(encoding="utf-8"), str(path))
            for folder in folders for path in sorted((root / folder).rglob("*.py"))}


def test_no_private_name_is_used_outside_its_module():
    files = _parse(ROOT, SCANNED)
    assert len(files) > 100 and {"app/cli/main.py", "engine/core.py", "storage/paths.py"} <= set(files)
    assert "_model_before_command" in defined_privates(files["app/cli/main.py"])  # the scan sees definitions
    assert offences(files) == []


def test_the_scan_finds_each_kind_of_use(tmp_path):
    """The rule on a small project of its own: each way of reaching another module's private
    is found; a module's own, ``self``'s and a third party's privates are not."""
    pkg = tmp_path / "app"
    pkg.mkdir()
    (pkg / "owner.py").write_text(
        "_TABLE = {}\n"
        "def _helper(): pass\n"
        "class Store:\n"
        "    _shared = 1\n"
        "    def __init__(self):\n"
        "        self._conn = None\n"
        "    def _query(self):\n"
        "        return self._conn\n")
    (pkg / "user.py").write_text(
        "import os\n"
        "from app.owner import _helper\n"
        "from app import owner\n"
        "def use(store):\n"
        "    store._conn = 1\n"
        "    owner._TABLE.clear()\n"
        "    getattr(store, '_query')()\n"
        "    del store._shared\n"
        "    os._exit(0)\n")
    (pkg / "own.py").write_text(
        "class Base:\n"
        "    def _query(self):\n"
        "        return super()._query() or self._conn\n"
        "def _helper(other):\n"
        "    return other._query()\n")
    found = offences(_parse(tmp_path, ["app"]))
    assert [f.split(": ", 1)[1] for f in found] == [
        "from app.owner import _helper (private to app/own.py, app/owner.py)",
        "store._conn (private to app/owner.py)",
        "owner._TABLE (private to app/owner.py)",
        "getattr(…, '_query') (private to app/own.py, app/owner.py)",
        "store._shared (private to app/owner.py)",
    ], found
    assert all(f.startswith("app/user.py:") for f in found)
