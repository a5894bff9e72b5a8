"""Attachments in chats.sqlite3: stored once by SHA-256, searchable by file and page, in the
prompt in their fixed form, exported and imported, and gone from every file with their last chat."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.session import ConversationSession
from engine.documents import Document
from engine.documents.attach import link, store
from engine.documents.extract import extract
from storage.attachments import for_chats
from storage.chats import ChatStore

DATA = Path(__file__).parent / "data" / "documents"
RARE = "Quillfeatherstone"


def _doc(data: bytes, name: str) -> Document:
    return Document(name, hashlib.sha256(data).hexdigest(), len(data), extract(data, name), data)


def _pdf() -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for n in range(1, 4):
        pdf.add_page()
        pdf.multi_cell(0, 8, f"Page {n} of the charter."
                       + (f" The keeper of the seal is {RARE} of Lower Wick." if n == 3 else ""))
    return bytes(pdf.output())


def _send_with(chats, conversation_id, text, docs):
    user = ConversationSession(chats).send(conversation_id, text)
    for d in docs:
        store(chats, d)
    link(chats, user.id, docs)
    return user


def test_stored_once_shared_searched_rendered(tmp_path):
    chats = ChatStore(tmp_path / "chats.sqlite3")
    doc = _doc(_pdf(), "charter.pdf")
    a = chats.create_conversation()
    b = chats.create_conversation()
    ua = _send_with(chats, a.id, "Who keeps the seal?", [doc])
    ub = _send_with(chats, b.id, "Summarise it.", [doc])
    att = for_chats(chats)
    assert att.count() == 1  # the same bytes twice: one row
    assert att.original(doc.sha256) == doc.data
    found = att.of_messages([ua.id, ub.id])
    assert [x.sha256 for x in found[ua.id]] == [doc.sha256] == [x.sha256 for x in found[ub.id]]
    assert found[ua.id][0].pages == 3
    # the stored message is what the person typed; the prompt holds the block before it
    assert chats.get_message(ua.id).content == "Who keeps the seal?"
    prompt = ConversationSession(chats).prompt(ua.id)
    assert prompt[-1].content == (
        "[Attached file: charter.pdf (PDF, 3 pages)]\n[Page 1]\nPage 1 of the charter.\n[Page 2]\n"
        "Page 2 of the charter.\n[Page 3]\nPage 3 of the charter. The keeper of the seal is "
        f"{RARE} of Lower Wick.\n[End of charter.pdf]\n\nWho keeps the seal?")
    # the search hit names the file and the page
    hits = att.search(RARE.lower())
    assert {(h.conversation_id, h.message_id, h.name, h.page) for h in hits} == {
        (a.id, ua.id, "charter.pdf", 3), (b.id, ub.id, "charter.pdf", 3)}
    assert RARE in hits[0].snippet
    assert att.search("nothing-like-this") == []
    chats.close()


def test_deleting_the_last_chat_leaves_nothing_in_the_files(tmp_path):
    path = tmp_path / "chats.sqlite3"
    chats = ChatStore(path)
    doc = _doc(_pdf(), "charter.pdf")
    text = _doc(f"The {RARE} ledger, in plain text.".encode(), "ledger.txt")
    a = chats.create_conversation()
    b = chats.create_conversation()
    _send_with(chats, a.id, "one", [doc, text])
    ub = _send_with(chats, b.id, "two", [doc])
    att = for_chats(chats)
    assert att.count() == 2
    chats.delete_conversation(a.id)
    assert att.count() == 1  # the PDF is still used by b; the text file went with a
    assert [h.name for h in att.search(RARE)] == ["charter.pdf"]
    chats.deletion.delete_subtree(ub.id)  # deleting the message alone also lets the file go
    assert att.count() == 0
    chats.deletion.forget_deleted()
    assert att.search(RARE) == []
    chats.close()
    att.close()
    for f in tmp_path.iterdir():
        blob = f.read_bytes()
        for needle in (RARE.encode(), RARE.lower().encode(), b"Lower Wick", b"ledger, in plain", doc.data[:200]):
            assert needle not in blob, (f.name, needle)


def test_export_holds_the_text_and_import_restores_it(tmp_path):
    from storage.importers.branchwise import conversation_json
    from storage.importers import import_files

    chats = ChatStore(tmp_path / "a.sqlite3")
    doc = _doc(_pdf(), "charter.pdf")
    conv = chats.create_conversation()
    user = _send_with(chats, conv.id, "Who keeps the seal?", [doc])
    chats.add_message(conv.id, user.id, "assistant", "The keeper.")
    data = conversation_json(chats, conv.id)
    exported = data["messages"][0]["attachments"]
    assert [(x["name"], x["sha256"], x["kind"], x["sent"]) for x in exported] == [
        ("charter.pdf", doc.sha256, "PDF", None)]
    assert RARE in json.dumps(exported)
    from app.session.markdown_export import conversation_markdown

    md = conversation_markdown(data)
    assert "## User · message 1\n\n*Attached: charter.pdf (PDF, 3 pages)*\n\n```text\nWho keeps" in md
    before = ConversationSession(chats).prompt(user.id)
    out = tmp_path / "export.json"
    out.write_text(json.dumps(data))
    other = ChatStore(tmp_path / "b.sqlite3")
    summary = import_files([out], other.path)
    assert summary.conversations == 1, summary.to_dict()
    (new,) = other.list_conversations()
    path = other.active_path(new.id)
    after = ConversationSession(other).prompt(path[0].id)
    assert [m.content for m in after] == [m.content for m in before]
    assert for_chats(other).original(doc.sha256) is None  # the export holds the text, not the file
    # importing again adds nothing, and a bad attachment fails the file as a whole
    assert import_files([out], other.path).messages == 0
    data["messages"][0]["attachments"][0]["passages"] = [["x"]]
    data["id"] = 999
    out.write_text(json.dumps(data))
    bad = import_files([out], other.path)
    assert bad.failed and "passage that is not [number, page, text]" in json.dumps(bad.to_dict())
    assert len(other.list_conversations()) == 1
    chats.close()
    other.close()


def test_unlinked_files_are_dropped(tmp_path):
    chats = ChatStore(tmp_path / "chats.sqlite3")
    store(chats, _doc(b"orphan text", "o.txt"))
    att = for_chats(chats)
    assert att.count() == 1
    assert att.drop_unlinked() == 1 and att.count() == 0
    with pytest.raises(Exception, match="FOREIGN KEY"):
        att.link(12345, [("0" * 64, "x", None)])
    chats.close()


def test_summaries_passages_and_dropping_an_unsent_file(tmp_path):
    """What the window reads of a sent file without its text (the chips), the passages it
    shows, and a file attached then removed before sending (deleted unless a message holds it)."""
    chats = ChatStore(tmp_path / "chats.sqlite3")
    doc = _doc(_pdf(), "charter.pdf")
    other = _doc(b"just notes\n", "notes.md")
    user = _send_with(chats, chats.create_conversation().id, "Who keeps the seal?", [doc])
    att = for_chats(chats)
    store(chats, other)  # attached, never sent
    assert att.count() == 2
    assert att.drop_if_unlinked(doc.sha256) is False and att.count() == 2  # a message holds it
    assert att.drop_if_unlinked(other.sha256) is True and att.count() == 1
    (s,) = att.summaries([user.id, user.id + 1000])[user.id]
    assert (s.name, s.sha256, s.kind, s.pages, s.sent) == ("charter.pdf", doc.sha256, "PDF", 3, None)
    every = att.passages(doc.sha256)
    assert [p.page for p in every] == [1, 2, 3] and RARE in every[2].text
    assert [p.number for p in att.passages(doc.sha256, [3, 1, 99])] == [1, 3]
    assert att.passages("0" * 64) == []


def test_a_window_that_ended_before_sending_leaves_no_file_at_the_next_start(qtbot, tmp_path):
    """A breaker's find: the window stores a file as soon as it is read; a window ended by a
    crash or kill -9 before sending left its text in chats.sqlite3 for good, held by no
    chat. The next window drops what is older than ``UNSENT_KEPT_S`` (a younger one may be
    on another window's composer) and truncates the WAL: no byte of it is left."""
    import sqlite3

    from app.window.flows.attach_flow import UNSENT_KEPT_S, AttachFlow
    from app.window.workers.tasks import Workers

    path = tmp_path / "chats.sqlite3"
    chats = ChatStore(path)
    old, young = _doc(f"The {RARE} memorandum.".encode(), "old.txt"), _doc(b"A draft on the composer.", "young.txt")
    store(chats, old)
    store(chats, young)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE attachments SET created_at = created_at - ? WHERE sha256 = ?", (UNSENT_KEPT_S + 60, old.sha256))
    db.close()
    workers = Workers()

    class Model:  # what the flow reads of the model controller before a model is loaded
        ready = type("Signal", (), {"connect": staticmethod(lambda _fn: None)})()

    AttachFlow(store=chats, workers=workers, model=Model(), bar=None, lifetime=None, parent=None)
    att = for_chats(chats)
    qtbot.waitUntil(lambda: att.count() == 1 and not workers.running, timeout=10_000)  # dropped, WAL cleared
    assert att.summaries([]) == {} and att.count() == 1  # the young one stays
    chats.close()
    att.close()
    left = [f.name for f in tmp_path.iterdir() if RARE.encode() in f.read_bytes()]
    assert left == []
    workers.shutdown()


def test_a_fork_and_a_new_branch_keep_the_attachment_links(tmp_path):
    """Fork, duplicate and "Continue on a new branch" link the same stored file (no second row),
    so the copy's prompt is the source's, token for token (the prefix store restores it)."""
    chats = ChatStore(tmp_path / "chats.sqlite3")
    session = ConversationSession(chats)
    doc = _doc(_pdf(), "charter.pdf")
    conv = chats.create_conversation(system_prompt="Be brief.")
    old = session.send(conv.id, "An old question " + "z" * 6000)  # too long to keep on a new branch
    chats.add_message(conv.id, old.id, "assistant", "Fine.")
    user = _send_with(chats, conv.id, "Who keeps the seal?", [doc])
    reply = chats.add_message(conv.id, user.id, "assistant", "The keeper.", token_ids=[5, 6, 7])
    second = session.send(conv.id, "And who before them? " + "x" * 2000)
    att = for_chats(chats)
    source = session.prompt(user.id)
    assert "[Attached file: charter.pdf" in source[-1].content

    fork = session.fork(reply.id)
    fork_user = chats.active_path(fork.id)[2]
    assert session.prompt(fork_user.id) == source
    assert [x.sha256 for x in att.of_messages([fork_user.id])[fork_user.id]] == [doc.sha256]
    copy = chats.copies.duplicate_conversation(conv.id)
    copy_user = chats.active_path(copy.id)[2]
    assert session.prompt(copy_user.id) == source
    assert att.count() == 1  # links to the one stored file, not a duplicate

    # a new branch that keeps the attached turn: the copy holds the file as the source does
    new_id = session.branch_dropping_oldest(second.id, n_ctx=4096, costs={second.id: 600})
    kept = chats.branches.path_to(new_id)
    assert [m.content for m in kept] == ["Who keeps the seal?", "The keeper.", second.content]
    assert kept[0].parent_id is None and kept[0].id != user.id
    whole = session.prompt(second.id)  # system, the old turn, the attached turn, the new question
    assert session.prompt(new_id) == [whole[0]] + whole[3:]
    assert list(kept[1].token_ids) == [5, 6, 7]
    assert chats.get_conversation(conv.id).active_leaf_id == new_id
    assert att.count() == 1

    chats.delete_conversation(conv.id)  # the copies still link the file: it stays
    assert att.count() == 1
    assert session.prompt(fork_user.id) == source
    chats.close()
    att.close()
