"""The stores stay split by job (issue #26): PrefixStore and ChatStore are packages of parts,
each store class has at most 25 methods, no module in storage/ is over 600 lines nor any
class over 400, and the old import paths still work. No model needed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORAGE = ROOT / "storage"


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(cls: ast.ClassDef) -> list[str]:
    """Every def in the class body, properties and static methods included."""
    return [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_stores_have_at_most_25_methods():
    for path, name in ((STORAGE / "prefix" / "store.py", "PrefixStore"), (STORAGE / "chats" / "store.py", "ChatStore")):
        methods = _methods(_class(path, name))
        assert 10 < len(methods) <= 25, (name, methods)


def test_the_stores_and_their_parts_are_importable_from_the_old_paths():
    from storage import prefix_store
    from storage.chats import ChatStore, SearchHit
    from storage.chats.store import ChatStore as chat_store_class
    from storage.prefix import PrefixStore
    from storage.prefix.store import PrefixStore as prefix_store_class

    assert prefix_store.PrefixStore is PrefixStore is prefix_store_class
    assert ChatStore is chat_store_class
    assert SearchHit.__module__ == "storage.chats.search"
    assert set(prefix_store.__all__) >= {"PrefixStore", "NewBlock", "StoreError", "StoreFull", "DEFAULT_BUDGET_BYTES"}


def test_the_parts_have_their_own_modules(tmp_path):
    from storage.chats import ChatStore
    from storage.prefix_store import PrefixStore

    store = PrefixStore(tmp_path / "kv.sqlite3")
    parts = {name: type(getattr(store, name)).__module__ for name in
             ("index", "blocks", "checkpoints", "eviction", "maintenance", "digests")}
    assert parts == {name: f"storage.prefix.{module}" for name, module in (
        ("index", "index"), ("blocks", "blocks"), ("checkpoints", "checkpoints"), ("eviction", "eviction"),
        ("maintenance", "maintenance"), ("digests", "digests"))}
    assert store.eviction.policy.__name__ == "least_recently_used_leaves"
    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as chats:
        assert {name: type(getattr(chats, name)).__module__ for name in ("branches", "copies", "deletion")} == {
            "branches": "storage.chats.tree", "copies": "storage.chats.copies", "deletion": "storage.chats.deletion"}


def test_eviction_names_its_columns():
    """The policy reads named fields, not positions in an anonymous row."""
    source = (STORAGE / "prefix" / "eviction.py").read_text(encoding="utf-8")
    assert "ORDER BY 3" not in source and "r[0]" not in source
    from storage.prefix.eviction import LEAVES_SQL, Leaf

    for column in Leaf._fields:
        assert f"AS {column}" in LEAVES_SQL


def test_no_python_recursion_over_a_message_tree():
    """Walks of the chat tree are recursive CTEs or loops, never a function calling itself."""
    for file in (STORAGE / "chats").glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                calls = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                         for c in ast.walk(node) if isinstance(c, ast.Call)
                         and (isinstance(c.func, ast.Name) or (isinstance(c.func, ast.Attribute)
                                                               and isinstance(c.func.value, ast.Name)
                                                               and c.func.value.id == "self"))}
                assert node.name not in calls, f"{file.name}: {node.name} calls itself"


def _privates(path: Path) -> set[str]:
    """Private names a module defines on its classes: ``def _x`` and ``self._x = ...``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef):
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef) and item.name.startswith("_") and not item.name.startswith("__"):
                    names.add(item.name)
                if (isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store)
                        and isinstance(item.value, ast.Name) and item.value.id == "self"
                        and item.attr.startswith("_") and not item.attr.startswith("__")):
                    names.add(item.attr)
    return names


def test_no_module_outside_the_stores_uses_their_private_attributes():
    """The tests and the layers above use the stores' parts (``store.index.db``,
    ``store.database.conn``, ``store.blocks.delete_subtree``), never a private name."""
    owned = set().union(*(_privates(f) for pkg in ("prefix", "chats") for f in (STORAGE / pkg).glob("*.py")))
    assert {"_conn", "_evict_payload_to", "_finder"} <= owned  # the scan sees the parts' privates
    files = [f for folder in ("app", "engine", "tools", "tests") for f in (ROOT / folder).rglob("*.py")]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in owned
                    and isinstance(node.value, (ast.Name, ast.Attribute))
                    and (ast.unparse(node.value).endswith(("store", "chats")))):
                raise AssertionError(f"{file.relative_to(ROOT)}:{node.lineno} uses the store's private {node.attr}")
