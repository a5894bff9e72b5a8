"""File → Import… and dropping files on the real window (no model): the import runs on a
worker thread, a summary dialog reports it, the sidebar and search show the imported chats,
a bad file changes nothing, and a message sent during an import waits for it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402
import sqlite3  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import QApplication, QFileDialog, QPushButton  # noqa: E402

from app.window.flows import import_dialog  # noqa: E402
from storage.importers import import_files  # noqa: E402
from storage.importers import run as import_run  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

SAMPLES = Path(__file__).parent / "data" / "import"
TIMEOUT_MS = 60_000


def _window(open_window, data_dir):
    return open_window(data_dir, wait=False, start_engine=False)


def _dump(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return (conn.execute("SELECT id, title FROM conversations ORDER BY id").fetchall()
                + conn.execute("SELECT id, parent_id, role, content FROM messages ORDER BY id").fetchall())


def _drop(window, paths: list[Path]) -> bool:
    """Drag ``paths`` over the window and drop them, as a file manager does; returns
    whether the window accepted the drag."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    enter = QDragEnterEvent(QPoint(100, 100), Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter.ignore()
    QApplication.sendEvent(window, enter)
    if not enter.isAccepted():
        return False
    event = QDropEvent(QPointF(100, 100), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, event)
    return True


def test_import_menu_imports_every_sample_and_search_finds_it(qtbot, open_window, data_dir, tmp_path, monkeypatch):
    files = sorted(SAMPLES.iterdir())
    expected = import_files(files, tmp_path / "dry.sqlite3", dry_run=True)  # the same reader, counting only
    assert expected.conversations >= 5 and not expected.failed
    w = _window(open_window, data_dir)
    assert w.sidebar.ids() == []
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(f) for f in files], ""))

    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as done:
        w.menu_actions["import_chats"].trigger()
        assert w.importer.running  # returned at once: the worker thread reads the files
    summary = done.args[0]

    assert summary.conversations == expected.conversations
    assert summary.messages == expected.messages
    assert summary.branches == expected.branches
    box = w.importer.summary_box
    assert box is not None and box.isVisible()
    assert box.textFormat() == Qt.TextFormat.PlainText
    text = box.text()
    assert (f"Imported {expected.conversations} conversations, {expected.messages} messages, "
            f"{expected.branches} branches.") in text
    assert "no KV cache yet" in text
    skipped = [s for f in expected.files for s in f.skipped]
    if skipped:
        assert f"{skipped[0].where}: {skipped[0].reason}" in box.detailedText()
    assert len(w.sidebar.ids()) == expected.conversations
    assert w.conversation_id in w.sidebar.ids()  # the first imported chat is shown

    w.sidebar.search.setText("whiskers")  # text of a ChatGPT reply on a branch
    qtbot.waitUntil(lambda: len(w.sidebar.ids()) == 1, timeout=TIMEOUT_MS)
    found = w.store.get_conversation(w.sidebar.ids()[0])
    assert found.id in summary.files[0].conversation_ids or any(
        found.id in f.conversation_ids for f in summary.files if "chatgpt" in f.path)
    box.accept()

    # importing the same files again adds nothing
    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as again:
        w.menu_actions["import_chats"].trigger()
    assert again.args[0].conversations == 0 and again.args[0].messages == 0
    assert "already imported" in w.importer.summary_box.text()


def test_a_dropped_bad_file_changes_nothing_and_says_why(qtbot, open_window, data_dir, tmp_path):
    w = _window(open_window, data_dir)
    w.store.add_message(w.store.create_conversation(title="Mine").id, None, "user", "keep me")
    w.sidebar.refresh()
    before = _dump(data_dir / CHATS_DB)
    bad = tmp_path / "broken.json"
    bad.write_text('[{"title": "x", "mapping": {"a": {"id": "a", "parent": "missing", ', encoding="utf-8")
    orphan = tmp_path / "orphan.json"  # a node whose parent is missing
    doc = json.loads((SAMPLES / "chatgpt_conversations.json").read_text(encoding="utf-8"))
    first = doc[0]
    node = next(k for k, v in first["mapping"].items() if v.get("parent"))
    first["mapping"][node]["parent"] = "no-such-node"
    orphan.write_text(json.dumps([first]), encoding="utf-8")

    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as done:
        assert _drop(w, [bad, orphan])
    summary = done.args[0]
    assert [f.status for f in summary.files] == ["failed", "failed"]
    text = w.importer.summary_box.text()
    assert "Nothing was imported from broken.json:" in text
    assert "Nothing was imported from orphan.json:" in text
    assert "no-such-node" in text or node in text  # names the node at fault
    assert "no KV cache yet" not in text
    assert w.importer.summary_box.icon() == w.importer.summary_box.Icon.Warning
    assert _dump(data_dir / CHATS_DB) == before
    assert len(w.sidebar.ids()) == 1


def test_drop_ignores_other_files_and_remote_urls(qtbot, open_window, data_dir, tmp_path):
    w = _window(open_window, data_dir)
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    urls = [QUrl.fromLocalFile(str(txt)), QUrl("https://example.com/conversations.json")]
    assert import_dialog.droppable_paths(urls) == []
    assert not _drop(w, [txt])
    assert not w.importer.running and w.importer.summary_box is None


def test_progress_shows_and_a_send_during_the_import_waits_for_it(qtbot, open_window, data_dir, monkeypatch):
    """A slow import (held by a gate): the progress dialog shows, a message sent meanwhile is kept
    (not written under the importer's lock) and sent when the import finishes."""
    gate = threading.Event()
    real = import_run.import_files

    def gated(*args, **kwargs):
        gate.wait(TIMEOUT_MS / 1000)
        return real(*args, **kwargs)

    monkeypatch.setattr(import_run, "import_files", gated)
    monkeypatch.setattr(import_dialog, "SHOW_PROGRESS_MS", 0)
    w = _window(open_window, data_dir)
    assert w.importer.start([SAMPLES / "claude_conversations.json"])
    qtbot.waitUntil(lambda: w.importer.progress_dialog is not None and w.importer.progress_dialog.isVisible(),
                    timeout=TIMEOUT_MS)
    assert w.importer.start([SAMPLES / "claude_conversations.json"]) is False  # one at a time

    w.composer.input.setPlainText("sent during the import")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert "will be sent as soon as it finishes" in w.banner.text
    assert w.store.list_conversations() == []  # nothing written while the import runs

    forked = []
    monkeypatch.setattr(w.chat, "fork", forked.append)
    w.commands.fork(1234)  # a fork (as the transcript's Fork button asks) is held too, after the send
    assert "the fork will be made as soon as it finishes" in w.banner.text
    assert forked == []

    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS):
        gate.set()
    assert forked == [1234]
    # no model is loaded, so the held message goes back to the composer, as any send would
    assert w.composer.text() == "sent during the import"
    assert w.importer.progress_dialog is None
    assert not w.importer.running


def test_cancel_from_the_progress_dialog_rolls_back(qtbot, open_window, data_dir, monkeypatch):
    """Cancel while the file is being read (held at its first progress report): nothing stays."""
    gate = threading.Event()
    real = import_run.import_files

    def gated(*args, progress=None, **kwargs):
        def report(p):
            progress(p)
            gate.wait(TIMEOUT_MS / 1000)
        return real(*args, progress=report, **kwargs)

    monkeypatch.setattr(import_run, "import_files", gated)
    monkeypatch.setattr(import_dialog, "SHOW_PROGRESS_MS", 0)
    w = _window(open_window, data_dir)
    w.importer.start([SAMPLES / "chatgpt_conversations.json"])
    qtbot.waitUntil(lambda: w.importer.progress_dialog is not None, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as done:
        button = w.importer.progress_dialog.findChild(QPushButton)
        assert button.text() == "Cancel"
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        gate.set()
    assert done.args[0].cancelled
    assert w.store.list_conversations() == []
    assert "cancelled" in w.importer.summary_box.text()


def test_an_import_asked_for_during_a_reply_starts_when_the_reply_ends(qtbot, open_window, data_dir, monkeypatch):
    """A streaming reply writes to the database as it goes, so the import waits for it."""
    w = _window(open_window, data_dir)
    streaming = {"on": True}
    monkeypatch.setattr(type(w.chat), "streaming", property(lambda _self: streaming["on"]))
    assert w.importer.start([SAMPLES / "openwebui_chat-export.json"])
    assert not w.importer.running
    assert w.banner.text == "The import starts when this reply finishes."
    streaming["on"] = False
    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as done:
        w.chat.reply_finished.emit(0)
    assert done.args[0].conversations == 1
    assert len(w.sidebar.ids()) == 1


def test_a_dropped_zip_with_a_hostile_name_imports_and_shows_its_name_as_text(qtbot, open_window, data_dir,
                                                                               tmp_path, monkeypatch):
    """The export .zip as ChatGPT mails it, named like markup: the progress label and the
    summary show the name as plain text; the conversations are those of the JSON inside."""
    import zipfile

    archive = tmp_path / "<img src=x>export.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(SAMPLES / "chatgpt_conversations.json", "conversations.json")
        zf.writestr("user.json", '{"id": "user-1"}')
    expected = import_files([SAMPLES / "chatgpt_conversations.json"], tmp_path / "dry.sqlite3", dry_run=True)
    gate = threading.Event()
    real = import_run.import_files

    def gated(*args, progress=None, **kwargs):
        def report(p):
            progress(p)
            gate.wait(TIMEOUT_MS / 1000)
        return real(*args, progress=report, **kwargs)

    monkeypatch.setattr(import_run, "import_files", gated)
    monkeypatch.setattr(import_dialog, "SHOW_PROGRESS_MS", 0)
    w = _window(open_window, data_dir)
    assert _drop(w, [archive])
    qtbot.waitUntil(lambda: w.importer.progress_label is not None
                    and "<img src=x>export.zip" in w.importer.progress_label.text(), timeout=TIMEOUT_MS)
    assert w.importer.progress_label.textFormat() == Qt.TextFormat.PlainText
    with qtbot.waitSignal(w.importer.finished, timeout=TIMEOUT_MS) as done:
        gate.set()
    summary = done.args[0]
    assert (summary.conversations, summary.messages, summary.branches) == (
        expected.conversations, expected.messages, expected.branches)
    assert summary.files[0].status == "imported"
    assert w.importer.summary_box.textFormat() == Qt.TextFormat.PlainText
    assert len(w.sidebar.ids()) == expected.conversations
