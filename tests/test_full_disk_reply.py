"""A disk that fills while a reply streams (issue 30, item 11): the row made at the first
token keeps the part that was saved; every later save fails. The CLI warns once (not once
per token), and every JSON it prints names that row as ``assistant_message_id``, with a
stderr line saying which message holds the kept part."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from app.session.recorder import ReplyRecorder
from storage.chats import ChatStore
from storage.errors import StorageFullError
from storage.paths import CHATS_DB

ENGINE = ["--ctx-size", "512", "--max-tokens", "8", "--temperature", "0", "--no-cache"]


@pytest.fixture
def disk_fills_after_first_token(monkeypatch):
    """Every save after the reply's row was created fails as on a full disk; the recorder
    tries to save at every token. Returns the list of refused saves."""
    refused: list = []

    def update_message(self, message_id, **kw):
        refused.append(message_id)
        raise StorageFullError("The disk holding the test folder is full (0 bytes free).")

    monkeypatch.setattr(ChatStore, "update_message", update_message)
    init = ReplyRecorder.__init__

    def eager(self, *a, **kw):
        init(self, *a, **{**kw, "save_every_s": 0.0})

    monkeypatch.setattr(ReplyRecorder, "__init__", eager)
    monkeypatch.setenv("BRANCHWISE_SUPERVISED", "inline")  # run the command here, not in a child
    return refused


def _assistant_rows(data_dir) -> list[tuple]:
    with closing(sqlite3.connect(data_dir / CHATS_DB)) as conn:
        return conn.execute("SELECT id, content FROM messages WHERE role = 'assistant'").fetchall()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "was not saved" in r.getMessage()]


def test_a_disk_that_fills_mid_reply_warns_once_and_names_the_kept_row(
        tmp_path, capsys, caplog, disk_fills_after_first_token):
    from app import cli

    code = cli.main(["chat", "--json", "--data-dir", str(tmp_path), *ENGINE, "Count from 1 to 20."])
    out, err = capsys.readouterr()
    assert code == 1
    assert len(disk_fills_after_first_token) >= 3  # several token saves failed...
    assert len(_warnings(caplog)) == 1  # ...and were warned about once
    assert err.count("was not saved (the rest") <= 1
    (row,) = _assistant_rows(tmp_path)
    result = json.loads(out)  # one JSON object
    assert "is full" in result["error"]
    assert result["assistant_message_id"] == row[0]
    assert result["saved"]["user_message"] is True and result["saved"]["reply"] is False
    assert f"message {row[0]}" in err and f"{len(row[1]):,} characters" in err
    assert row[1]  # the first token's text is what is kept
    assert result["text"].startswith(row[1]) and len(result["text"]) > len(row[1])  # the rest is not lost
    assert f"({len(result['text']) - len(row[1]):,} were not saved)" in err


def test_a_reply_that_gets_no_row_at_all_is_still_in_the_json_answer(tmp_path, capsys, monkeypatch,
                                                                     disk_fills_after_first_token):
    """A nearly full disk took the user's message, then refused the reply's row: `chat --json`
    exited 1 with "assistant_message_id": null and no text, and the generated reply was lost.
    The JSON answer now carries it, and stderr says none of its characters were saved."""
    from app import cli

    real = ChatStore.add_message

    def add_message(self, conversation_id, parent_id, role, *a, **kw):
        if role == "assistant":
            raise StorageFullError("The disk holding the test folder is full (0 bytes free).")
        return real(self, conversation_id, parent_id, role, *a, **kw)

    monkeypatch.setattr(ChatStore, "add_message", add_message)
    code = cli.main(["chat", "--json", "--data-dir", str(tmp_path), *ENGINE, "Count from 1 to 20."])
    out, err = capsys.readouterr()
    assert code == 1
    assert _assistant_rows(tmp_path) == []
    result = json.loads(out)
    assert "is full" in result["error"] and result["assistant_message_id"] is None
    assert len(result["text"]) >= 4  # 8 tokens were generated
    assert (f"none of the reply's {len(result['text']):,} characters were saved in conversation "
            f"{result['conversation_id']} (the disk is full); the whole reply is in the JSON answer's \"text\"") in err


def test_a_stop_while_the_disk_is_full_names_the_kept_row(tmp_path, capsys, caplog, monkeypatch,
                                                          disk_fills_after_first_token):
    from app import cli
    from engine.core import Engine

    real = Engine.generate

    def generate_then_stop(self, messages, sampling=None, **kw):
        real(self, messages, sampling, **kw)
        raise KeyboardInterrupt  # Ctrl+C just after the last token

    monkeypatch.setattr(Engine, "generate", generate_then_stop)
    code = cli.main(["chat", "--json", "--data-dir", str(tmp_path), *ENGINE, "Count from 1 to 20."])
    out, err = capsys.readouterr()
    assert code == 130
    assert len(_warnings(caplog)) == 1
    (row,) = _assistant_rows(tmp_path)
    result = json.loads(out)
    assert result["error"] == "interrupted" and result["status"] == "stopped"
    assert result["assistant_message_id"] == row[0]
    assert len(result["text"]) > len(row[1])  # only the first part is kept, and it says so
    assert result["saved"]["reply"] is False and result["saved"]["problems"]
    assert f"message {row[0]}" in err and f"{len(row[1]):,} characters" in err


def test_a_full_disk_outside_the_reply_is_named_as_such_not_as_a_damaged_database(tmp_path, capsys, monkeypatch):
    """A breaker's find: on a full disk, `chat --attach` stored the file's text first and
    SQLite's "database or disk is full" reached the CLI's last resort, which told the user
    the database may be damaged and to move chats.sqlite3 away (their chats would vanish).
    It names the full disk now, and says the database is fine by not saying otherwise."""
    import importlib

    from app.cli.commands import conversations

    cli_main = importlib.import_module("app.cli.main")

    def full(_args):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(conversations, "run", full)
    assert cli_main.main(["conversations", "list", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"branchwise: The disk holding {tmp_path} is full (")
    assert "the last change was not saved. Free some space and try again." in err
    assert "damaged" not in err and "move chats.sqlite3" not in err
