"""Chat with your documents in the window (issue #25): a PDF dropped on the composer becomes a
chip (name, pages, tokens), is sent with the message as ``branchwise chat --attach`` sends it,
and its follow-up restores the document from the store; hostile files give their sentence and
keep the draft; a document searched because it does not fit lists its passages in the reply's
footer. Real default model (SmolLM2-135M), offscreen."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from gui_helpers import REPLY_TIMEOUT_MS, new_chat  # noqa: E402

DOCS = Path(__file__).resolve().parent / "data" / "documents"
READ_TIMEOUT_MS = 60_000


def drop_files(widget, *paths: Path) -> QDropEvent:
    """Drag ``paths`` (file URLs) onto ``widget`` and drop them, as a file manager does."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(Path(p).resolve())) for p in paths])
    at = widget.rect().center()
    enter = QDragEnterEvent(at, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(at), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
    return drop


def chips(w) -> list[str]:
    return [c.text for c in w.attachments_bar.row.chips]


def attach_and_count(qtbot, w, path: Path) -> int:
    """Drop ``path`` on the composer's box and wait for its chip's token count; returns it."""
    drop = drop_files(w.composer.input.viewport(), path)
    assert drop.isAccepted()
    qtbot.waitUntil(lambda: bool(w.attach.ready) and w.attach.ready[-1].tokens is not None, timeout=READ_TIMEOUT_MS)
    return w.attach.ready[-1].tokens


def test_a_pdf_dropped_on_the_composer_is_a_chip_with_name_pages_and_tokens(qtbot, open_window, data_dir):
    from storage.attachments import for_chats

    w = open_window(data_dir)
    new_chat(w)
    w.composer.set_text("What is this speech about?")
    drop = drop_files(w.composer.input.viewport(), DOCS / "gettysburg.pdf")
    assert drop.isAccepted()
    assert chips(w) == ["\u2068gettysburg.pdf\u2069 · reading…"]  # at once, while the sandbox child reads it
    qtbot.waitUntil(lambda: bool(w.attach.ready) and w.attach.ready[0].tokens is not None, timeout=READ_TIMEOUT_MS)
    tokens = w.attach.ready[0].tokens
    assert 300 < tokens < 700  # the address (1,470 characters) and its page markers
    assert chips(w) == [f"\u2068gettysburg.pdf\u2069 · 2 pages · {tokens:,} tokens"]
    assert w.composer.text() == "What is this speech about?"  # the drop inserted no URL text
    assert for_chats(w.store).count() == 1  # stored once, off the UI thread, to be linked on send
    chip = w.attachments_bar.row.chips[0]
    chip.opened.emit()  # its extracted text, read-only
    assert w.attach.viewer.view.isReadOnly()
    assert "Four score and seven years ago" in w.attach.viewer.view.toPlainText()
    w.attach.viewer.close()
    qtbot.mouseClick(chip.remove_button, Qt.MouseButton.LeftButton)  # × before sending
    assert chips(w) == [] and not w.attachments_bar.isVisible()
    assert for_chats(w.store).count() == 0  # never sent: not kept
    assert w.composer.text() == "What is this speech about?"


def test_sent_with_the_message_and_the_follow_up_restores_the_document(qtbot, open_window, data_dir):
    from engine.documents import attach_file
    from engine.documents.attach import attached_text
    from engine.documents.render import render_message
    from storage.attachments import for_chats

    w = open_window(data_dir)
    cid = new_chat(w)
    tokens = attach_and_count(qtbot, w, DOCS / "gettysburg.pdf")
    question = "Who gave this address?"
    w.composer.input.setPlainText(question)
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as first:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    user, reply = w.store.active_path(cid)
    assert user.content == question  # the message keeps what was typed; the file is beside it
    linked = for_chats(w.store).of_messages([user.id])[user.id]
    assert [(a.name, a.pages, a.sent) for a in linked] == [("gettysburg.pdf", 2, None)]
    # the stored message renders exactly what the CLI's --attach sends (the same tokens)
    doc = attach_file(DOCS / "gettysburg.pdf")
    assert w.chat.session.prompt(user.id)[-1].content == render_message(question, [attached_text(doc)])
    assert chips(w) == [] and w.composer.text() == ""
    bubble = w.transcript.widget_for(user.id)
    assert [c.text for c in bubble.attachment_row.chips] == [f"\u2068gettysburg.pdf\u2069 · 2 pages · {tokens:,} tokens"]
    assert w.store.get_message(first.args[0]).stats["prompt_tokens"] > tokens

    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as follow:
        w.composer.input.setPlainText("In which year?")
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    stats = w.store.get_message(follow.args[0]).stats
    assert stats["restored_tokens"] > tokens  # the document (and the first turn) restored, not computed
    assert 0 < stats["prefilled_tokens"] <= 40  # only the new question and its headers
    assert stats["restored_tokens"] + stats["prefilled_tokens"] == stats["prompt_tokens"]

    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as branch:  # edit the first question
        w.commands.edit(user.id, "Summarise the address in one sentence.")
    edited = w.store.get_message(w.store.get_message(branch.args[0]).parent_id)
    assert edited.id != user.id and edited.parent_id == user.parent_id  # a sibling: a new branch
    assert [a.name for a in for_chats(w.store).of_messages([edited.id])[edited.id]] == ["gettysburg.pdf"]
    stats = w.store.get_message(branch.args[0]).stats
    assert stats["restored_tokens"] >= tokens and stats["prefilled_tokens"] <= 40  # the document restored


def test_an_attached_document_is_prewarmed_at_once(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    new_chat(w)
    warmed = []
    w.prewarm.answered.connect(warmed.append)
    tokens = attach_and_count(qtbot, w, DOCS / "gettysburg.pdf")  # nothing typed yet
    qtbot.waitUntil(lambda: any(r["finished"] and r["ready_tokens"] > tokens for r in warmed),
                    timeout=REPLY_TIMEOUT_MS)
    w.composer.input.setPlainText("Who gave this address?")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    stats = w.store.get_message(done.args[0]).stats
    assert stats["restore_source"] == "context" and stats["restored_tokens"] > tokens
    assert stats["prefilled_tokens"] < 40  # the first question is answered without prefilling the document


def _encrypted_pdf(path: Path, password: str) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "The vault combination is 31-07-1969.")
    pdf.set_encryption(owner_password="owner-" + password, user_password=password)
    path.write_bytes(bytes(pdf.output()))
    return path


def test_hostile_files_give_their_sentence_keep_the_draft_and_store_nothing(qtbot, open_window, data_dir,
                                                                           tmp_path):
    from storage.attachments import for_chats

    w = open_window(data_dir, start_engine=False, wait=False)  # nothing here needs the model
    binary = tmp_path / "notes.txt"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64)
    w.composer.set_text("my draft, kept")
    drop_files(w.composer.input.viewport(), binary)
    qtbot.waitUntil(lambda: w.attachments_bar.note.isVisible(), timeout=READ_TIMEOUT_MS)
    assert w.attachments_bar.note.text() == ("notes.txt is not a text file (it holds binary data); attach text, "
                                             "Markdown, PDF, DOCX, HTML, CSV or JSON files.")
    assert w.attachments_bar.note.textFormat() == Qt.TextFormat.PlainText
    assert chips(w) == [] and w.composer.text() == "my draft, kept" and for_chats(w.store).count() == 0

    secret = _encrypted_pdf(tmp_path / "secret.pdf", "tulip")
    drop_files(w.composer, secret)  # on the composer itself, beside the box
    qtbot.waitUntil(lambda: w.attach.password_box is not None, timeout=READ_TIMEOUT_MS)
    box = w.attach.password_box
    assert box.labelText() == "secret.pdf is encrypted; give its password to attach it."
    from PySide6.QtWidgets import QLabel

    assert all(label.textFormat() == Qt.TextFormat.PlainText for label in box.findChildren(QLabel))
    box.setTextValue("wrong")
    box.accept()  # a wrong one: asked again, with its sentence
    qtbot.waitUntil(lambda: w.attach.password_box is not None and w.attach.password_box is not box,
                    timeout=READ_TIMEOUT_MS)
    box = w.attach.password_box
    assert box.labelText() == "The password for secret.pdf is not right; try again."
    box.reject()  # given up: the sentence stays under the composer, nothing stored
    assert w.attachments_bar.note.text() == "The password for secret.pdf is not right; try again."
    assert chips(w) == [] and w.composer.text() == "my draft, kept" and for_chats(w.store).count() == 0

    drop_files(w.composer.input.viewport(), secret)  # the right password: attached
    qtbot.waitUntil(lambda: w.attach.password_box is not None, timeout=READ_TIMEOUT_MS)
    w.attach.password_box.setTextValue("tulip")
    w.attach.password_box.accept()
    qtbot.waitUntil(lambda: bool(w.attach.ready), timeout=READ_TIMEOUT_MS)
    assert chips(w) == ["\u2068secret.pdf\u2069 · 1 page · counting tokens…"]  # no engine here to count it
    assert not w.attachments_bar.note.isVisible()
    copied = QMimeData()  # a file manager's Copy, pasted with Ctrl+V: attached, no URL typed
    copied.setUrls([QUrl.fromLocalFile(str(DOCS / "gettysburg.pdf"))])
    QApplication.clipboard().setMimeData(copied)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(w.attach.ready) == 2, timeout=READ_TIMEOUT_MS)
    assert chips(w)[1] == "\u2068gettysburg.pdf\u2069 · 2 pages · counting tokens…"
    assert w.composer.text() == "my draft, kept"
    QApplication.clipboard().clear()  # no mime data of this test left for the application's exit
    gone = tmp_path / "vanished.pdf"  # moved or deleted between the drag and the read
    drop_files(w.composer.input.viewport(), gone)
    qtbot.waitUntil(lambda: "does not exist" in w.attachments_bar.note.text(), timeout=READ_TIMEOUT_MS)
    assert w.attachments_bar.note.text() == f"{gone} does not exist (it may have been moved or deleted)."


def _long_pdf(path: Path) -> Path:
    """A PDF of about 3,500 tokens: numbered minutes about a harbour, one about a marmoset."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    pdf.add_page()
    for n in range(1, 81):
        line = (f"Minute {n}. The harbour committee met on day {n} and reviewed the accounts of the lighthouse, "
                f"the pier repairs (estimate {n * 37} pounds) and the ferry timetable; nothing was decided.")
        if n == 57:
            line = "Minute 57. A marmoset escaped from the ferry and was found asleep in the lighthouse lamp room."
        pdf.multi_cell(0, 5, line, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(2)
    pdf.output(str(path))
    return path


def test_a_document_too_long_is_searched_and_the_reply_lists_its_passages(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir)  # a 2,048-token context
    cid = new_chat(w, {"max_tokens": 8})
    tokens = attach_and_count(qtbot, w, _long_pdf(tmp_path / "minutes.pdf"))
    assert tokens > 2048
    w.composer.input.setPlainText("Where was the marmoset found?")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(),
                    timeout=REPLY_TIMEOUT_MS)
    box = w.overflow_flow.box
    assert f"The attached files take {tokens:,} of them." in box.text() and "the context holds 2,048" in box.text()
    labels = [b.text() for b in box.buttons()]
    assert "Search the document" in labels and "Continue on a new branch" not in labels
    assert "The largest context this model and this computer's memory allow is" in box.informativeText()
    assert w.store.active_path(cid) == []  # nothing stored before a choice
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
        qtbot.mouseClick(next(b for b in box.buttons() if b.text() == "Search the document"),
                         Qt.MouseButton.LeftButton)
    user, reply = w.store.active_path(cid)
    sent = user.stats["attachments"][0]["passages"]
    assert 1 <= len(sent) < 20  # the passages that match the question's words, not the whole text
    assert reply.id == done.args[0] and reply.stats["prompt_tokens"] <= 2048
    prompt = " ".join(w.chat.session.prompt(user.id)[-1].content.split())  # the PDF's lines wrap
    assert "A marmoset escaped from the ferry" in prompt and "found by search, not the whole text" in prompt
    assert prompt.count("[Passage ") == len(sent) and "Minute 12." not in prompt  # only what matched
    n = len(sent)
    chip = w.transcript.widget_for(user.id).attachment_row.chips[0]
    assert chip.text == (f"\u2068minutes.pdf\u2069 · 4 pages · {n} passage{'s' if n != 1 else ''} searched · "
                         f"{user.stats['attachments'][0]['tokens']:,} tokens")
    assert 0 < user.stats["attachments"][0]["tokens"] < tokens
    footer = w.transcript.widget_for(reply.id).passages_footer
    expected = "Passages used: minutes.pdf " + ", ".join(f"#{p['number']} (page {p['page']})" for p in sent)
    assert footer.text() == expected and footer.textFormat() == Qt.TextFormat.PlainText
    footer.clicked.emit()
    qtbot.waitUntil(lambda: w.attachment_marks.viewer is not None, timeout=10_000)
    shown = " ".join(w.attachment_marks.viewer.view.toPlainText().split())
    assert "A marmoset escaped from the ferry" in shown
    assert shown.count("[Passage ") == len(sent)


def test_a_note_about_a_file_goes_once_the_message_is_sent(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir, start_engine=False, wait=False)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    drop_files(w.composer.input.viewport(), binary)
    qtbot.waitUntil(lambda: w.attachments_bar.note.isVisible(), timeout=READ_TIMEOUT_MS)
    w.attach.stored(1)  # a message with no file was stored (AttachingSession.send calls it for each)
    assert not w.attachments_bar.note.isVisible() and w.attachments_bar.note.text() == ""
