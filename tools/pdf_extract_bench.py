"""Compare PDF text extractors (pypdfium2, pypdf): pages per second and text quality.

    python -m tools.pdf_extract_bench FILE.pdf ... [--runs 3]

For each file and library: pages, best-of-``runs`` pages per second, characters, the share
of words found in a dictionary made of both outputs' agreed words, the count of "glued" words
(over 24 letters: words run together when an extractor misses the spaces), and a ground-truth
word recall when a ``FILE.txt`` sits beside ``FILE.pdf`` (the text the PDF was made from).
This is how ``engine/documents`` chose its PDF library (README, "Chat with your documents").
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


def _pdfium(path: Path) -> list[str]:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        pages = []
        for i in range(len(pdf)):
            page = pdf[i]
            textpage = page.get_textpage()
            pages.append(textpage.get_text_bounded())
            textpage.close()
            page.close()
        return pages
    finally:
        pdf.close()


def _pypdf(path: Path) -> list[str]:
    import pypdf

    reader = pypdf.PdfReader(str(path))
    return [page.extract_text() or "" for page in reader.pages]


EXTRACTORS = {"pypdfium2": _pdfium, "pypdf": _pypdf}


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def measure(path: Path, runs: int) -> dict[str, dict]:
    """Per library: pages, pages/s (best of ``runs``), chars, glued words, recall (or None)."""
    out: dict[str, dict] = {}
    truth_file = path.with_suffix(".txt")
    truth = set(_words(truth_file.read_text(encoding="utf-8"))) if truth_file.exists() else None
    for name, extract in EXTRACTORS.items():
        best = float("inf")
        pages: list[str] = []
        for _ in range(runs):
            start = time.perf_counter()
            pages = extract(path)
            best = min(best, time.perf_counter() - start)
        text = "\n".join(pages)
        words = _words(text)
        out[name] = {
            "pages": len(pages), "pages_per_s": len(pages) / best if best else 0.0,
            "chars": len(text), "words": words,
            "glued": sum(1 for w in words if len(w) > 24),
            "recall": (len(truth & set(words)) / len(truth)) if truth else None,
        }
    common = set.intersection(*(set(r["words"]) for r in out.values()))
    for r in out.values():
        r["agreed"] = sum(1 for w in r["words"] if w in common) / max(1, len(r["words"]))
        del r["words"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Print one line per file and library."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'file':34} {'library':10} {'pages':>5} {'pages/s':>8} {'chars':>8} "
          f"{'agreed':>6} {'glued':>5} {'recall':>6}")
    for path in args.files:
        for name, r in measure(path, args.runs).items():
            recall = "-" if r["recall"] is None else f"{r['recall']:.3f}"
            print(f"{path.name[:34]:34} {name:10} {r['pages']:5d} {r['pages_per_s']:8.1f} "
                  f"{r['chars']:8d} {r['agreed']:6.3f} {r['glued']:5d} {recall:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
