"""Attached documents on the real default model: the CLI's ``chat --attach``, the same
tokens in every turn, restores of a follow-up, a restart and a branch equal to ``--no-cache``
at temperature 0, a document too large for the context searched for the question's rare words,
and hostile files that store nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "documents"
PDF = DATA / "gettysburg.pdf"


def bw(data_dir, *args, check=True):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    r = subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=900)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def chat_json(data_dir, *args):
    return json.loads(bw(data_dir, "chat", "--json", "--temperature", "0", "--max-tokens", "12",
                         "--threads", "1", *args).stdout)


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs")
    first = chat_json(d, "--attach", PDF, "Who gave this speech?")
    return d, first


def test_first_turn_reports_the_attachment(attached):
    _, first = attached
    (info,) = first["attachments"]
    assert (info["name"], info["kind"], info["pages"], info["passages"]) == ("gettysburg.pdf", "PDF", 2, None)
    assert 300 < info["tokens"] < 600
    s = first["stats"]
    assert s["prompt_tokens"] > info["tokens"] and s["restored_tokens"] == 0


def test_follow_up_in_a_new_process_restores_the_document(attached):
    d, first = attached
    s1 = first["stats"]
    leaf = first["assistant_message_id"]
    follow = chat_json(d, "--parent", leaf, "In what year?")
    cold = chat_json(d, "--parent", leaf, "--no-cache", "In what year?")
    s = follow["stats"]
    assert s["restored_tokens"] >= s1["prompt_tokens"] + s1["generated_tokens"] - 1
    assert s["prefilled_tokens"] < 20
    assert s["restored_tokens"] + s["prefilled_tokens"] == s["prompt_tokens"] == cold["stats"]["prompt_tokens"]
    assert cold["stats"]["restored_tokens"] == 0
    assert follow["text"] == cold["text"]


def test_branch_from_the_first_question_restores_the_document(attached):
    d, first = attached
    again = json.loads(bw(d, "regenerate", "--json", "--temperature", "0", "--max-tokens", "12", "--threads", "1",
                          first["assistant_message_id"]).stdout)
    s = again["stats"]
    assert s["prompt_tokens"] == first["stats"]["prompt_tokens"]
    assert s["restored_tokens"] >= s["prompt_tokens"] - 2 and s["prefilled_tokens"] <= 2
    assert again["text"] == first["text"]


def test_rendered_prompt_tokens_identical_across_turns(attached, model_path):
    from app.session import ConversationSession
    from engine.core import Engine
    from engine.settings import EngineSettings
    from storage.chats import ChatStore

    d, first = attached
    chats = ChatStore(d / "chats.sqlite3")
    session = ConversationSession(chats)
    engine = Engine(model_path, EngineSettings(n_ctx=2048, n_threads=1), None)
    try:
        turn1 = engine.prompt_tokens(session.prompt(first["user_message_id"]))
        assert len(turn1) == first["stats"]["prompt_tokens"]
        later = [m for m in chats.tree(first["conversation_id"]) if m.role == "user" and m.id != first["user_message_id"]]
        assert later, "the follow-up test stores a second question"
        for m in later:
            turn = engine.prompt_tokens(session.prompt(m.id))
            assert turn[:len(turn1) - 3] == turn1[:-3]  # all but the assistant header: the same ids
        text = session.prompt(first["user_message_id"])[-1].content
        assert text.startswith("[Attached file: gettysburg.pdf (PDF, 2 pages)]\n[Page 1]\nAddress delivered")
        assert text.endswith("[End of gettysburg.pdf]\n\nWho gave this speech?")
    finally:
        engine.close()
        chats.close()


def _long_document() -> str:
    filler = ("The committee met again to review the harbour accounts, the state of the roads and the "
              "price of grain, and adjourned without a decision. ")
    pages = [filler * 6 for _ in range(30)]
    pages[17] = (filler * 2 + "The lighthouse keeper, Ottoline Brackenbury, logged a marmoset aboard the "
                 "schooner Persimmon. " + filler * 2)
    return "\n\n".join(pages)


def test_a_document_that_does_not_fit_is_searched(tmp_path, model_path):
    from app.cli.attach_commands import plan
    from engine.core import Engine
    from engine.documents import attach_bytes
    from engine.settings import EngineSettings
    from storage.chats import ChatStore

    doc = attach_bytes(_long_document().encode(), "minutes.txt")
    chats = ChatStore(tmp_path / "chats.sqlite3")
    engine = Engine(model_path, EngineSettings(n_ctx=1024, n_threads=1), None)
    try:
        args = Namespace(max_tokens=64, search_document=False)
        with pytest.raises(ValueError) as err:
            plan(args, engine, chats, "", [], "Who logged the marmoset?", [doc])
        message = str(err.value)
        assert message.startswith("With the attached files this message is ")
        need = int(message.split(" is ")[1].split(" tokens")[0].replace(",", ""))
        assert need > 4000 and "the context window is 1,024 with 64 kept for the reply" in message
        assert "pass --search-document" in message
        args.search_document = True
        p = plan(args, engine, chats, "", [], "Who logged the marmoset?", [doc])
        (info,) = p.info
        # only one passage has "marmoset" or "logged"; the filler has every other word of the question
        from engine.documents.passages import cut

        (expected,) = [q.number for q in cut(doc.extracted.pages, False) if "marmoset" in q.text]
        assert p.sent == [[expected]] and info["passages"] == [{"number": expected, "page": None}]
        assert p.text.startswith("[Attached file: minutes.txt (text; 1 passage found by search, not the whole "
                                 f"text)]\n[Passage {expected}]\n")
        assert "Ottoline Brackenbury, logged a marmoset" in p.text
        assert len(engine.prompt_tokens([__import__("engine.chat_template").chat_template.ChatMessage(
            "user", p.text)])) <= 1024 - 64
        assert p.footer().startswith("minutes.txt: searched, passages #")
    finally:
        engine.close()
        chats.close()


@pytest.mark.parametrize("make", ["binary", "missing", "encrypted"])
def test_a_hostile_attachment_stores_nothing(tmp_path, make):
    d = tmp_path / "data"
    d.mkdir()
    path = tmp_path / "bad.txt"
    if make == "binary":
        path.write_bytes(bytes(range(256)) * 8)
    elif make == "encrypted":
        from fpdf import FPDF

        pdf = FPDF()
        pdf.set_font("Helvetica", size=12)
        pdf.add_page()
        pdf.cell(0, 8, "secret")
        pdf.set_encryption(owner_password="o", user_password="u")
        path = tmp_path / "locked.pdf"
        path.write_bytes(bytes(pdf.output()))
    r = bw(d, "chat", "--attach", path, "What is in it?", check=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("branchwise: "), r.stderr
    expected = {"binary": "bad.txt is not a text file", "missing": "does not exist",
                "encrypted": "locked.pdf is encrypted; give its password to attach it (pass --attach-password)."}
    assert expected[make] in lines[0]
    listed = bw(d, "conversations", "list", "--json")
    assert json.loads(listed.stdout) == []


def test_deleting_the_chat_forgets_the_document_and_its_kv_blocks(attached):
    from storage.attachments import AttachmentStore

    d, first = attached
    assert AttachmentStore(d / "chats.sqlite3").count() == 1
    out = json.loads(bw(d, "conversations", "delete", first["conversation_id"], "--json").stdout)
    # the blocks of the document's prompt are found (rendered with the file) and dropped
    assert out["kv_blocks_dropped"] >= first["stats"]["prompt_tokens"] // 64
    assert json.loads(bw(d, "cache", "stats", "--json").stdout)["blocks"] == 0
    assert AttachmentStore(d / "chats.sqlite3").count() == 0
