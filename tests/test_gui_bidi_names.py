"""Direction controls in untrusted names (U+202E RIGHT-TO-LEFT OVERRIDE...) cannot reverse
the app's own words: every name inside app-composed text is a first-strong isolate
(U+2068 ... U+2069) with its embedding, override and isolate controls shown as "[U+202E]"."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import unicodedata  # noqa: E402

from app.window.shell.plain import isolate  # noqa: E402

FSI, PDI = "\u2068", "\u2069"


def _only_closed_isolates(text: str) -> bool:
    """No embedding/override control, and every FSI closed by a PDI in order."""
    depth = 0
    for ch in text:
        if unicodedata.bidirectional(ch) in ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI"):
            return False
        depth += ch == FSI
        depth -= ch == PDI
        if depth < 0:
            return False
    return depth == 0


def test_isolate_shows_controls_and_cannot_be_closed_early():
    assert isolate("rtl\u202eloh.txt.html") == f"{FSI}rtl[U+202E]loh.txt.html{PDI}"
    assert isolate("a\u2069\u202eb\u2066") == f"{FSI}a[U+2069][U+202E]b[U+2066]{PDI}"
    assert isolate("שלום\u200f") == f"{FSI}שלום\u200f{PDI}"  # letters and marks stay


def test_the_attachment_chip_isolates_the_file_name():
    from app.window.transcript.attachment_chip import chip_text

    text = chip_text("rtl\u202eloh.txt.html", None, 17, "HTML")
    assert text == f"{FSI}rtl[U+202E]loh.txt.html{PDI} · HTML · 17 tokens" and _only_closed_isolates(text)


def test_the_tool_header_isolates_tool_and_server():
    from app.window.transcript.tool_call_block import tool_header

    text = tool_header({"name": "ec\u202eho", "server": "ev\u202eil", "duration_ms": 12.0}, "tool")
    assert text == f"Tool {FSI}ec[U+202E]ho{PDI} · {FSI}ev[U+202E]il{PDI} · 12 ms" and _only_closed_isolates(text)
    calls = tool_header({"tool_calls": [{"function": {"name": "a\u202eb"}}]}, "assistant")
    assert calls == f"Calls: {FSI}a[U+202E]b{PDI}"


def test_the_approval_dialog_isolates_the_server_name(qtbot):
    from PySide6.QtCore import Qt

    from app.window.flows.tool_approval import ToolApprovalDialog

    dialog = ToolApprovalDialog("echo", "ev\u202eil<b>srv</b>", "python3 srv\u202e.py", "{}")
    qtbot.addWidget(dialog)
    assert dialog.question.text() == (f"The model wants to call the tool “{FSI}echo{PDI}” of the MCP server "
                                      f"“{FSI}ev[U+202E]il<b>srv</b>{PDI}”.")
    assert dialog.question.textFormat() == Qt.TextFormat.PlainText
    assert dialog.where.text() == f"Server: {FSI}python3 srv[U+202E].py{PDI}"
