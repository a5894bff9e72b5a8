"""Writes the PDFs of this folder (README.md here says what they are and where the text is from).

    python tests/data/documents/make.py      (needs fpdf2 and Pillow, the dev dependencies)
"""

from __future__ import annotations

import io
from datetime import datetime, timezone
from pathlib import Path

from fpdf import FPDF
from PIL import Image, ImageDraw

HERE = Path(__file__).parent


def _pdf() -> FPDF:
    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime(2024, 1, 1, tzinfo=timezone.utc))  # the same bytes every run
    pdf.set_font("Helvetica", size=11)
    return pdf


def gettysburg() -> None:
    """Two pages of text (the Gettysburg Address) and an image on page 2."""
    paragraphs = (HERE / "gettysburg.txt").read_text(encoding="utf-8").split("\n\n")
    pdf = _pdf()
    pdf.add_page()
    for par in paragraphs[:3]:
        pdf.multi_cell(0, 6, par.strip(), new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    pdf.add_page()
    for par in paragraphs[3:]:
        pdf.multi_cell(0, 6, par.strip(), new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    pdf.image(_picture("Soldiers' National Cemetery"), w=60)
    pdf.output(str(HERE / "gettysburg.pdf"))


def scanned() -> None:
    """One page that is only a picture of text: a scan without a text layer."""
    pdf = _pdf()
    pdf.add_page()
    pdf.image(_picture("Four score and seven years ago", size=(600, 200)), x=10, y=10, w=120)
    pdf.output(str(HERE / "scanned.pdf"))


def _picture(words: str, size: tuple[int, int] = (300, 120)) -> io.BytesIO:
    image = Image.new("L", size, 255)
    ImageDraw.Draw(image).text((10, size[1] // 2 - 6), words, fill=0)
    out = io.BytesIO()
    image.save(out, format="PNG")
    out.seek(0)
    return out


if __name__ == "__main__":
    gettysburg()
    scanned()
