"""The engine stays split by job (issue #26): a live context, cache strategies chosen by
cache mode, and a ChatEngine protocol both engines implement. No model needed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"

# The modules whose private attributes no other module may touch.
OWNERS = ["engine/core.py", "engine/live_context.py", "engine/prewarm.py", "engine/cache_strategy/base.py",
          "engine/cache_strategy/dense.py", "engine/cache_strategy/checkpointed.py"]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _class(path: Path, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == name)


def test_engine_has_at_most_25_methods_and_does_not_branch_on_the_cache_mode():
    cls = _class(ENGINE / "core.py", "Engine")
    methods = [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert 0 < len(methods) <= 25, methods
    source = ast.unparse(cls)
    assert "mode.checkpoints" not in source and "StateKind" not in source


def test_every_cache_mode_has_a_strategy():
    from engine.cache_strategy import STRATEGIES, Checkpointed, DenseBlocks
    from engine.model import CacheMode

    assert set(STRATEGIES) == set(CacheMode)
    assert STRATEGIES[CacheMode.BLOCKS] is DenseBlocks
    assert all(STRATEGIES[m] is Checkpointed for m in CacheMode if m.checkpoints)
    assert DenseBlocks.cuts_back and not Checkpointed.cuts_back


def _privates(path: Path) -> set[str]:
    """Private names a module defines on its classes: ``def _x`` and ``self._x = ...``."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ClassDef):
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef) and item.name.startswith("_") and not item.name.startswith("__"):
                    names.add(item.name)
                if (isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store)
                        and isinstance(item.value, ast.Name) and item.value.id == "self"
                        and item.attr.startswith("_") and not item.attr.startswith("__")):
                    names.add(item.attr)
    return names


def test_no_module_uses_the_engines_private_attributes():
    """What the prewarmer, the bench and the CLI need is public: the live context's
    position and state, ``Engine.position``, the strategies' restore."""
    owned = {owner: _privates(ROOT / owner) for owner in OWNERS}
    assert owned["engine/core.py"]  # the scan sees Engine's private helpers
    files = [f for folder in ("app", "engine", "tools", "tests") for f in (ROOT / folder).rglob("*.py")]
    for file in files:
        rel = file.relative_to(ROOT).as_posix()
        others = set().union(*(names for owner, names in owned.items() if owner != rel))
        for node in ast.walk(_tree(file)):
            if (isinstance(node, ast.Attribute) and node.attr in others
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                raise AssertionError(f"{rel}:{node.lineno} uses the private {node.attr}")


def test_both_engines_implement_the_chat_engine_protocol():
    from engine.chat_engine import ChatEngine
    from engine.core import Engine
    from engine.remote import RemoteEngine

    remote = RemoteEngine("http://127.0.0.1:9/v1", model="m")  # no connection is made
    try:
        assert isinstance(remote, ChatEngine)
        assert remote.is_remote is True and remote.model_name() == "m"
    finally:
        remote.close()
    members = [n for n in dir(ChatEngine) if not n.startswith("_")] + ["is_remote"]
    for name in members:
        assert hasattr(Engine, name), name
    assert Engine.is_remote is False
    for folder in ("app", "engine"):
        for file in (ROOT / folder).rglob("*.py"):
            assert 'getattr(engine, "remote"' not in file.read_text(encoding="utf-8"), file
