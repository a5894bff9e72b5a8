"""Text out of a file's bytes: PDF, DOCX, HTML, and text of any encoding.

Runs inside the extraction child (``engine.documents.sandbox``), never in the window's or
the CLI's own process: a hostile file can at worst use up that child's time and memory.
Every failure a person can cause is a ``DocumentError`` holding one sentence.

Libraries, chosen by measurement (``python -m tools.pdf_extract_bench``, README "Chat with
your documents"): PDF with pypdfium2 (PDFium, the PDF engine of Chromium: 13-26 times the
pages per second of pypdf here, the same words), DOCX with python-docx, HTML with
markdownify (over BeautifulSoup), text of unknown encoding with charset-normalizer.
"""

from __future__ import annotations

import io
import re
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import PurePath

from engine.documents.limits import MAX_PAGES, MAX_TEXT_CHARS, MAX_UNZIPPED_BYTES


class DocumentError(ValueError):
    """A file that cannot be read as a document; ``str()`` is one sentence for the user.
    ``needs_password`` is True for an encrypted PDF opened without (or with a wrong) password."""

    def __init__(self, message: str, *, needs_password: bool = False) -> None:
        super().__init__(message)
        self.needs_password = needs_password


@dataclass(frozen=True)
class Extracted:
    """What a file holds as text. ``pages`` is one string per PDF page (one string for
    every other kind, ``paged`` False); ``kind`` is the label the rendered block shows
    (``"PDF"``, ``"DOCX"``, ``"HTML"``, ``"Markdown"``, ``"CSV"``, ``"JSON"``, ``"text"``);
    ``encoding`` is the text encoding found (None for PDF/DOCX); ``images`` counts the
    images listed as not read."""

    kind: str
    pages: tuple[str, ...]
    paged: bool
    encoding: str | None = None
    images: int = 0
    notes: tuple[str, ...] = field(default=())


_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")  # C0 controls but tab and newline (CR is gone by then)

TEXT_KINDS = {".md": "Markdown", ".markdown": "Markdown", ".csv": "CSV", ".tsv": "CSV",
              ".json": "JSON", ".jsonl": "JSON", ".htm": "HTML", ".html": "HTML", ".xhtml": "HTML"}


def extract(data: bytes, name: str, password: str | None = None) -> Extracted:
    """Extract the text of ``data`` (the file's bytes; ``name`` gives its extension and
    the sentences' wording). PDFs and DOCX files are recognised by their content, not
    their name.

    Raises:
        DocumentError: encrypted (``needs_password``), malformed, over MAX_PAGES pages,
            a DOCX that unzips to over MAX_UNZIPPED_BYTES, a PDF without a text layer,
            binary data, or over MAX_TEXT_CHARS characters of text.
    """
    suffix = PurePath(name).suffix.lower()
    if data.startswith(b"%PDF-") or (suffix == ".pdf" and b"%PDF-" in data[:1024]):
        result = _pdf(data, name, password)
    elif data.startswith(b"PK\x03\x04") and (suffix == ".docx" or _is_docx(data)):
        result = _docx(data, name)
    elif suffix == ".pdf":
        raise DocumentError(f"{name} is not a PDF file (it has no PDF header); it may be damaged.")
    elif suffix == ".docx":
        raise DocumentError(f"{name} is not a Word document (.docx files are zip archives); it may be damaged.")
    else:
        text, encoding = decode_text(data, name)
        _check_size(len(text), name)  # before any copy is made of it
        kind = TEXT_KINDS.get(suffix, "text")
        if kind == "HTML":
            text = html_to_text(text)
        result = Extracted(kind, (clean(text),), False, encoding)
    _check_size(sum(len(p) for p in result.pages), name)
    return result


def _check_size(total: int, name: str) -> None:
    if total > MAX_TEXT_CHARS:
        raise DocumentError(f"{name} holds {total:,} characters of text, more than Branchwise attaches "
                            f"({MAX_TEXT_CHARS:,}); split it into smaller files.")


def clean(text: str) -> str:
    """The one normal form of extracted text, so the same file always gives the same
    tokens: NFC, ``\\n`` line ends, no NUL or other C0 controls but tab and newline,
    no trailing spaces, at most two blank lines in a row, no blank lines at either end."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROLS.sub("", text)
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    blank = 0
    for line in lines:
        blank = blank + 1 if not line else 0
        if blank <= 2:
            out.append(line)
    return "\n".join(out).strip("\n")


def decode_text(data: bytes, name: str) -> tuple[str, str]:
    """``(text, encoding)``: UTF-8 (with or without BOM) when it decodes, else the
    encoding charset-normalizer finds. Raises DocumentError for binary data (NUL bytes
    outside UTF-16/32, or no encoding that makes sense of it)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
        if "\x00" not in text:
            return text, "utf-8"
    except UnicodeDecodeError:
        pass
    utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    if b"\x00" in data[:65536] and not utf16:
        raise DocumentError(f"{name} is not a text file (it holds binary data); attach text, "
                            "Markdown, PDF, DOCX, HTML, CSV or JSON files.")
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise DocumentError(f"{name} is not a text file (its bytes are no known text encoding); "
                            "attach text, Markdown, PDF, DOCX, HTML, CSV or JSON files.")
    return str(best), best.encoding


def html_to_text(html: str) -> str:
    """HTML as Markdown-like text (markdownify): headings, lists, links, tables kept;
    scripts, styles and forms dropped; each image a line "[Image: alt (not read)]"."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    class _Converter(MarkdownConverter):
        def convert_img(self, el, text, parent_tags):  # noqa: D102 - markdownify's hook
            alt = " ".join((el.attrs.get("alt") or "").split())
            return f"[Image: {alt} (not read)]" if alt else "[Image (not read)]"

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "iframe", "object", "form"]):
        tag.decompose()
    return _Converter(heading_style="ATX", bullets="-").convert_soup(soup)


def image_note(page: int | None) -> str:
    """The line that stands for an image: "[Image on page 3 (not read)]" (or without page)."""
    return f"[Image on page {page} (not read)]" if page is not None else "[Image (not read)]"


def _pdf(data: bytes, name: str, password: str | None) -> Extracted:
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    try:
        pdf = pdfium.PdfDocument(data, password=password)
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == raw.FPDF_ERR_PASSWORD:
            if password:
                raise DocumentError(f"The password for {name} is not right; try again.",
                                    needs_password=True) from None
            raise DocumentError(f"{name} is encrypted; give its password to attach it.",
                                needs_password=True) from None
        raise DocumentError(f"{name} is a damaged PDF that cannot be read "
                            f"({str(exc).removeprefix('Failed to load document ').strip('().')}).") from None
    try:
        count = len(pdf)
        if count > MAX_PAGES:
            raise DocumentError(f"{name} has {count:,} pages, more than Branchwise attaches ({MAX_PAGES:,}); "
                                "split it into smaller files.")
        if count == 0:
            raise DocumentError(f"{name} has no pages.")
        pages: list[str] = []
        images = 0
        for number in range(1, count + 1):
            page = pdf[number - 1]
            try:
                textpage = page.get_textpage()
                text = clean(textpage.get_text_bounded())
                textpage.close()
                found = sum(1 for _ in page.get_objects(filter=[raw.FPDF_PAGEOBJ_IMAGE], max_depth=4))
            finally:
                page.close()
            images += found
            notes = [image_note(number)] * found
            pages.append("\n".join([text] + notes) if text and notes else (text or "\n".join(notes)))
    finally:
        pdf.close()
    if not any(p.replace(image_note(i + 1), "").strip() for i, p in enumerate(pages)):
        if images:
            raise DocumentError(f"{name} has no text layer (its pages are scanned images); Branchwise does "
                                "not read text from images, so run it through OCR first.")
        raise DocumentError(f"{name} has no text to read (its {count} pages are empty).")
    return Extracted("PDF", tuple(pages), True, None, images)


def _is_docx(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return "word/document.xml" in z.namelist()
    except zipfile.BadZipFile:
        return False


def _docx(data: bytes, name: str) -> Extracted:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except zipfile.BadZipFile:
        raise DocumentError(f"{name} is a damaged Word document that cannot be read.") from None
    unzipped = sum(i.file_size for i in infos)
    if unzipped > MAX_UNZIPPED_BYTES or len(infos) > 10_000:
        raise DocumentError(f"{name} unpacks to {unzipped:,} bytes, more than Branchwise reads "
                            f"({MAX_UNZIPPED_BYTES:,}); it may be a zip bomb.")
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise DocumentError(f"{name} is a damaged Word document that cannot be read ({exc}).") from None
    except Exception as exc:  # noqa: BLE001 - lxml's XMLSyntaxError and the like: still a damaged file
        raise DocumentError(f"{name} is a damaged Word document that cannot be read "
                            f"({type(exc).__name__}).") from None
    lines: list[str] = []
    images = 0
    for block in document.iter_inner_content():
        if hasattr(block, "rows"):  # a table: one line per row, cells joined by " | "
            for row in block.rows:
                lines.append(" | ".join(" ".join(c.text.split()) for c in row.cells))
            lines.append("")
            continue
        style = (block.style.name if block.style is not None else "") or ""
        text = block.text
        if style.startswith("Heading") and style[7:].strip().isdigit() and text.strip():
            text = "#" * min(6, int(style[7:])) + " " + text
        elif style.startswith("List") and text.strip():
            text = "- " + text
        lines.append(text)
        found = len(block._p.xpath(".//pic:pic"))  # noqa: SLF001 - python-docx exposes images only by XML
        images += found
        lines.extend([image_note(None)] * found)
    text = clean("\n".join(lines))
    if not text:
        raise DocumentError(f"{name} has no text to read.")
    return Extracted("DOCX", (text,), False, None, images)

