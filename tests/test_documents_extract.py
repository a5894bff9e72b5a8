"""Extracting attached files: real PDFs (tests/data/documents), DOCX and PDFs made here,
HTML, text of other encodings; the fixed normal form; passages that lose nothing."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.documents import DocumentError, attach_file
from engine.documents.extract import clean, extract
from engine.documents.passages import PASSAGE_CHARS, cut, cut_page, pages_of, query_terms

DATA = Path(__file__).parent / "data" / "documents"


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 20), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def test_public_domain_pdf_in_a_child_process():
    doc = attach_file(DATA / "gettysburg.pdf")
    e = doc.extracted
    assert (e.kind, e.paged, len(e.pages), e.images, doc.pages) == ("PDF", True, 2, 1, 2)
    assert e.pages[0].startswith("Address delivered at the dedication of the Cemetery at Gettysburg.")
    assert "Four score and seven years ago our fathers brought forth on this continent" in e.pages[0]
    assert e.pages[1].endswith("shall not perish from the earth.\n[Image on page 2 (not read)]")
    assert "[Image" not in e.pages[0]
    # every word of the source text is there (pdfium keeps the words; lines are re-broken)
    source = (DATA / "gettysburg.txt").read_text(encoding="utf-8").split()
    assert " ".join(" ".join(e.pages).split()) == " ".join(source) + " [Image on page 2 (not read)]"
    import hashlib

    assert doc.sha256 == hashlib.sha256((DATA / "gettysburg.pdf").read_bytes()).hexdigest()


def test_pdf_made_here_with_many_pages():
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for n in range(1, 13):
        pdf.add_page()
        pdf.multi_cell(0, 8, f"This is page {n}. The ledger code for it is QX{n:03d}.")
    e = extract(bytes(pdf.output()), "ledger.pdf")
    assert len(e.pages) == 12
    assert [p for p in e.pages] == [f"This is page {n}. The ledger code for it is QX{n:03d}." for n in range(1, 13)]


def test_docx_headings_lists_tables_and_images():
    import docx

    d = docx.Document()
    d.add_heading("Quarterly report", level=1)
    d.add_paragraph("Revenue grew in the north.")
    d.add_paragraph("First point", style="List Bullet")
    table = d.add_table(rows=2, cols=2)
    for r, row in enumerate([("Region", "Sales"), ("North", "42")]):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    d.add_paragraph("After the table.")
    d.add_picture(io.BytesIO(_png()))
    out = io.BytesIO()
    d.save(out)
    e = extract(out.getvalue(), "report.docx")
    assert (e.kind, e.paged, e.images) == ("DOCX", False, 1)
    assert e.pages[0] == ("# Quarterly report\nRevenue grew in the north.\n- First point\nRegion | Sales\n"
                          "North | 42\n\nAfter the table.\n\n[Image (not read)]")


def test_html_to_text_drops_scripts_and_lists_images():
    html = ("<html><head><style>p{color:red}</style><script>alert('x')</script></head><body>"
            "<h2>Hello</h2><p>A <b>bold</b> <a href='https://example.org/'>link</a>.</p>"
            "<img src='cat.png' alt='A cat'><ul><li>one</li><li>two</li></ul></body></html>")
    e = extract(html.encode(), "page.html")
    assert e.kind == "HTML"
    text = e.pages[0]
    assert "alert" not in text and "color" not in text
    assert "## Hello" in text and "A **bold** [link](https://example.org/)." in text
    assert "[Image: A cat (not read)]" in text and "- one\n- two" in text


@pytest.mark.parametrize(("name", "kind"), [("notes.md", "Markdown"), ("t.csv", "CSV"), ("d.json", "JSON"),
                                            ("main.py", "text"), ("README", "text")])
def test_text_kinds(name, kind):
    e = extract(b"a,b\r\n1,2\r\n", name)
    assert (e.kind, e.pages, e.encoding) == (kind, ("a,b\n1,2",), "utf-8")


def test_unknown_encodings_are_found():
    text = "Le café du coin était fermé, hélas ; nous sommes allés à la brasserie près de l'église."
    e = extract(text.encode("cp1252"), "note.txt")
    assert e.pages[0] == text
    assert e.encoding in ("cp1252", "latin_1", "iso8859_15", "cp1250")
    e = extract(text.encode("utf-16"), "note.txt")
    assert e.pages[0] == text and e.encoding.startswith("utf_16")
    assert extract(b"\xef\xbb\xbfhello", "bom.txt").pages == ("hello",)


def test_normal_form_is_fixed():
    assert clean("cafe\u0301  \r\nx\x00y\x1b\n\n\n\n\nend\n\n") == "café\nxy\n\n\nend"
    assert clean(clean("a\r\rb  ")) == clean("a\r\rb  ") == "a\n\nb"


def test_query_terms():
    assert query_terms("What does the document say about the Zephyrine clause, and the zephyrine CLAUSE?") == [
        "zephyrine", "clause"]
    assert query_terms("is it ok?") == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab .\n,;xyz"), max_size=5000), min_size=1, max_size=4),
       st.booleans())
def test_passages_lose_nothing(pages, paged):
    pages = pages if paged else pages[:1]
    passages = cut(pages, paged)
    assert pages_of(passages, paged) == tuple(pages)
    assert [p.number for p in passages] == list(range(1, len(passages) + 1))
    assert all(len(p.text) <= PASSAGE_CHARS for p in passages)
    assert all((p.page is not None) == paged for p in passages)


def test_passages_cut_at_paragraphs():
    para = ("word " * 150).strip()  # 749 characters
    pieces = cut_page("\n\n".join([para] * 4))
    assert pieces[0] == para + "\n\n" and len(pieces) == 4


def test_wrong_extension_is_named():
    with pytest.raises(DocumentError, match=r"^x\.pdf is not a PDF file"):
        extract(b"hello", "x.pdf")
    with pytest.raises(DocumentError, match=r"^x\.docx is not a Word document"):
        extract(b"hello", "x.docx")
