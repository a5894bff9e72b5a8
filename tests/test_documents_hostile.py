"""Hostile files: each gets one clear sentence, within its limit, and nothing else happens.

Every file is made in the test's own scratch folder (tmp_path)."""

from __future__ import annotations

import os
import sys
import time
import zipfile
from pathlib import Path

import pytest

from engine.documents import DocumentError, attach_bytes, attach_file
from engine.documents import sandbox
from engine.documents.limits import MAX_FILE_BYTES, MAX_PAGES

DATA = Path(__file__).parent / "data" / "documents"


def _one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message
    assert message.endswith("."), message
    body = message[:-1].replace("e.g.", "")
    assert ". " not in body.replace(".pdf", "").replace(".docx", "").replace(".txt", ""), message


def _encrypted_pdf(password: str) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "The vault combination is 31-07-1969.")
    pdf.set_encryption(owner_password="owner-" + password, user_password=password)
    return bytes(pdf.output())


def test_encrypted_pdf_asks_for_the_password(tmp_path):
    path = tmp_path / "secret.pdf"
    path.write_bytes(_encrypted_pdf("tulip"))
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert err.value.needs_password
    assert str(err.value) == "secret.pdf is encrypted; give its password to attach it."
    with pytest.raises(DocumentError, match=r"^The password for secret\.pdf is not right; try again\.$") as err:
        attach_file(path, password="rose")
    assert err.value.needs_password
    doc = attach_file(path, password="tulip")
    assert doc.extracted.pages == ("The vault combination is 31-07-1969.",)


def test_malformed_pdf(tmp_path):
    good = (DATA / "gettysburg.pdf").read_bytes()
    path = tmp_path / "broken.pdf"
    path.write_bytes(good[:9] + os.urandom(2000))
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert str(err.value).startswith("broken.pdf is a damaged PDF that cannot be read (")
    assert not err.value.needs_password
    _one_sentence(str(err.value))


def test_docx_zip_bomb(tmp_path):
    path = tmp_path / "bomb.docx"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        with z.open("word/document.xml", "w") as f:  # 300 MiB of zeros, ~300 KB zipped
            chunk = b"\0" * (1024**2)
            for _ in range(300):
                f.write(chunk)
    assert path.stat().st_size < 2 * 1024**2
    start = time.monotonic()
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert time.monotonic() - start < 30
    assert str(err.value).startswith("bomb.docx unpacks to 314,572,8")
    assert str(err.value).endswith("it may be a zip bomb.")
    _one_sentence(str(err.value))


def test_two_gigabyte_file_refused_from_its_size(tmp_path):
    path = tmp_path / "huge.pdf"
    with open(path, "wb") as f:
        f.truncate(2 * 1024**3)  # sparse: no disk used
    start = time.monotonic()
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert time.monotonic() - start < 1  # never read
    assert str(err.value) == f"huge.pdf is 2.0 GB, more than Branchwise attaches ({MAX_FILE_BYTES // 1024**2} MB); split it or attach a part."
    with pytest.raises(DocumentError, match="more than Branchwise attaches"):
        attach_bytes(b"x" * (MAX_FILE_BYTES + 1), "big.txt")


def test_ten_thousand_page_pdf_refused_from_its_page_count(tmp_path):
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for _ in range(10_000):
        pdf.new_page(200, 200).close()
    path = tmp_path / "pages.pdf"
    pdf.save(str(path))
    pdf.close()
    start = time.monotonic()
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert time.monotonic() - start < 30
    assert str(err.value) == (f"pages.pdf has 10,000 pages, more than Branchwise attaches ({MAX_PAGES:,}); "
                              "split it into smaller files.")


def test_binary_file_named_txt(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64)
    with pytest.raises(DocumentError) as err:
        attach_file(path)
    assert str(err.value).startswith("notes.txt is not a text file (it holds binary data)")
    _one_sentence(str(err.value))


def test_file_that_vanishes(tmp_path, monkeypatch):
    path = tmp_path / "gone.txt"
    path.write_text("here now")
    path.unlink()
    with pytest.raises(DocumentError, match=r"gone\.txt does not exist \(it may have been moved or deleted\)\.$"):
        attach_file(path)
    # deleted (or cut short) between the size check and the end of the read
    path.write_text("here now, then truncated by another program")
    real = os.fstat
    calls = []

    def fstat(fd):
        st = real(fd)
        calls.append(st)
        if len(calls) == 2:
            path.write_text("")  # cut short while being read
            return real(fd)
        return st

    monkeypatch.setattr(sandbox.os, "fstat", fstat)
    with pytest.raises(DocumentError, match=r"gone\.txt changed or vanished while it was being read; attach it again\.$"):
        attach_file(path)


def test_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "pipe.txt")
    with pytest.raises(DocumentError, match=r"pipe\.txt is not a regular file, so it cannot be attached\.$"):
        attach_file(tmp_path / "pipe.txt")


def test_scanned_pdf_has_no_text_layer():
    with pytest.raises(DocumentError) as err:
        attach_file(DATA / "scanned.pdf")
    assert str(err.value) == ("scanned.pdf has no text layer (its pages are scanned images); Branchwise does "
                              "not read text from images, so run it through OCR first.")


def test_time_and_memory_limits_end_the_child():
    data = (DATA / "gettysburg.pdf").read_bytes()
    with pytest.raises(DocumentError, match=r"^Reading g\.pdf took longer than 0 s, so it was stopped"):
        attach_bytes(data, "g.pdf", time_limit_s=0.001)
    # a memory limit below what the reader needs (RLIMIT_AS, Linux): stopped, one sentence
    if sys.platform.startswith("linux"):
        limit = 64 * 1024**2
        assert attach_bytes(b"small enough", "s.txt", memory_limit_bytes=limit).extracted.pages == ("small enough",)
        big = b"ab\n" * 1_290_000  # under the text cap; its lines need over 64 MB
        with pytest.raises(DocumentError) as err:
            attach_bytes(big, "big.txt", memory_limit_bytes=limit)
        assert str(err.value) == ("Reading big.txt needed more than 64 MB of memory, so it was stopped; "
                                  "it may be a zip bomb or a damaged file.")


def test_text_over_the_character_cap():
    from engine.documents.limits import MAX_TEXT_CHARS

    with pytest.raises(DocumentError, match=r"^t\.txt holds 4,000,001 characters of text, more than Branchwise "
                                            r"attaches \(4,000,000\); split it into smaller files\.$"):
        attach_bytes(b"x" * (MAX_TEXT_CHARS + 1), "t.txt")


def test_the_same_file_given_twice_is_attached_once(tmp_path, capsys):
    """``chat --attach a.txt --attach a.txt`` (and ./a.txt, or a copy with the same bytes):
    one Document, so the prompt holds its text once, and one line on stderr saying so."""
    from argparse import Namespace

    from app.cli.attach_commands import read_attachments

    a = tmp_path / "a.txt"
    a.write_text("The ledger of Lower Wick.\n")
    (tmp_path / "same.txt").write_text("The ledger of Lower Wick.\n")
    (tmp_path / "b.txt").write_text("Another file.\n")
    args = Namespace(attach=[str(a), str(tmp_path / "b.txt"), str(tmp_path / "." / "a.txt"),
                             str(tmp_path / "same.txt")], attach_password=None)
    docs = read_attachments(args)
    assert [d.name for d in docs] == ["a.txt", "b.txt"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err == ("branchwise: a.txt was given twice and same.txt has the same contents as a.txt; "
                   "each file is attached once.\n")
    args.attach = [str(a)] * 3
    assert len(read_attachments(args)) == 1
    assert capsys.readouterr().err == "branchwise: a.txt was given 3 times; each file is attached once.\n"
    args.attach = [str(a), str(tmp_path / "b.txt")]
    assert [d.name for d in read_attachments(args)] == ["a.txt", "b.txt"]
    assert capsys.readouterr().err == ""
