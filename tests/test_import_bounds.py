"""Import bounds (storage/importers/bounded.py, run.py): one message's text is capped, a
larger one is named in the report; a zip that unpacks to gigabytes is refused before it
is read; a lone surrogate escape and a list of non-objects get the right words."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import ijson
import pytest

from storage.chats import ChatStore
from storage.importers import bounded, import_files


def chatgpt_export(texts: list[str]) -> list[dict]:
    """One ChatGPT conversation: a chain of messages with ``texts``, user first."""
    mapping = {"root": {"id": "root", "parent": None, "children": ["m0"], "message": None}}
    for i, text in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        mapping[f"m{i}"] = {"id": f"m{i}", "parent": "root" if i == 0 else f"m{i - 1}",
                            "children": [f"m{i + 1}"] if i + 1 < len(texts) else [],
                            "message": {"id": f"m{i}", "author": {"role": role},
                                        "content": {"content_type": "text", "parts": [text]},
                                        "create_time": 1700000000 + i}}
    return [{"title": "Big", "id": "c1", "create_time": 1700000000, "update_time": 1700000100,
             "mapping": mapping, "current_node": f"m{len(texts) - 1}"}]


def contents(db: Path) -> list[str]:
    with ChatStore(db) as chats:
        return [m.content for c in chats.list_conversations() for m in chats.tree(c.id)]


def test_a_message_over_the_cap_is_kept_as_a_line_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(bounded, "MAX_STRING_BYTES", 1 << 20)  # the real cap is 64 MiB
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(["Hello", "x" * (3 << 20), "After the big one"])))
    summary = import_files([path], tmp_path / "chats.sqlite3")
    report = summary.files[0]
    assert report.error is None and report.messages == 3
    stored = contents(tmp_path / "chats.sqlite3")
    assert stored[0] == "Hello" and stored[2] == "After the big one"
    assert stored[1] == "[A text of 3 MiB was not imported: one message may hold at most 1 MiB]"
    [skip] = report.skipped
    assert skip.where.endswith("conversations.json: conversation 'Big' (id c1)")
    assert "a message text of 3 MiB, over the" in skip.reason


def test_a_long_message_under_the_cap_is_imported_whole(tmp_path):
    text = "é" * (1 << 20) + "\n\"quoted\" \\ end 😀"  # 2 MiB with escapes: taken aside, then put back
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(["Hi", text])))
    report = import_files([path], tmp_path / "chats.sqlite3").files[0]
    assert report.error is None and not report.skipped
    assert contents(tmp_path / "chats.sqlite3") == ["Hi", text]


@pytest.mark.parametrize("read_bytes", [5, 64, 4096])
def test_the_filter_gives_ijson_the_same_values_at_any_read_size(monkeypatch, read_bytes):
    monkeypatch.setattr(bounded, "READ_BYTES", read_bytes)
    monkeypatch.setattr(bounded, "INLINE_BYTES", 8)  # so short strings take the slow path too
    doc = [{"a": "x" * 40, "b": ["\n\"\\", "😀é", "ok"], "n": [1, 2.5, None, True]}, {"k" * 30: "tail"}]
    r = bounded.BoundedReader(io.BytesIO(json.dumps(doc).encode()))
    assert [r.resolve(v) for v in ijson.items(r, "item", use_float=True)] == doc


def test_a_zip_bomb_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "export.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("conversations.json", "w") as f:
        f.write(b'[{"title": "t", "mapping": {"a": {"message": {"content": {"parts": ["')
        block = b"a" * (1 << 20)
        for _ in range(300):  # 300 MiB that pack into about 300 KB
            f.write(block)
        f.write(b'"]}}}}}]')
    assert path.stat().st_size < 2 << 20
    report = import_files([path], tmp_path / "chats.sqlite3").files[0]
    assert report.status == "failed" and "conversations.json unpacks to 0.3 GiB from 0.3 MiB" in report.error
    assert "which no chat export does" in report.error and "it was not read" in report.error


def test_a_lone_surrogate_escape_in_an_ascii_file_is_not_called_non_utf8(tmp_path):
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(["Hi \ud800 there", "ok"])))  # ensure_ascii: "\\ud800"
    assert b"\\ud800" in path.read_bytes() and path.read_bytes().isascii()
    report = import_files([path], tmp_path / "chats.sqlite3").files[0]
    assert report.error is None, report.error
    assert contents(tmp_path / "chats.sqlite3")[0] == "Hi \ufffd there"


def test_a_list_of_non_objects_is_not_called_empty(tmp_path):
    path = tmp_path / "list.json"
    path.write_text('[1,"a",null]')
    report = import_files([path], tmp_path / "chats.sqlite3").files[0]
    assert report.status == "failed"
    assert "empty list" not in report.error
    assert "a list whose first item is a number, not a conversation object" in report.error
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert "holds no conversations (an empty list)" in import_files([empty], tmp_path / "c.sqlite3").files[0].error
