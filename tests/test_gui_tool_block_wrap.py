"""A tool result with a long unbroken line (base64, a minified JSON, a URL) wraps inside the
expanded tool block: the transcript never grows wider than its view, so every bubble's
Copy / Regenerate / Fork buttons stay on screen."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint  # noqa: E402

from app.window.shell.theme import LIGHT  # noqa: E402
from app.window.transcript.transcript_view import TranscriptView  # noqa: E402
from storage.chat_records import Message  # noqa: E402

LONG_LINE = "QUJD" * 2_000  # 8,000 characters without a break opportunity


def _message(mid: int, role: str, content: str, parent: int | None, tool: dict | None = None) -> Message:
    return Message(mid, 1, parent, role, content, None, None, "done", None, 0.0, None, tool)


def test_an_expanded_tool_result_with_a_long_line_stays_inside_the_view(qtbot):
    view = TranscriptView()
    qtbot.addWidget(view)
    path = [_message(1, "user", "Fetch it", None),
            _message(2, "assistant", "", 1, {"tool_calls": [{"id": "c1", "function": {"name": "fetch", "arguments": "{}"}}]}),
            _message(3, "tool", LONG_LINE, 2, {"tool_call_id": "c1", "name": "fetch", "server": "web",
                                                "arguments": "{}", "duration_ms": 5.0, "error": None}),
            _message(4, "assistant", "Here it is.", 3)]
    view.set_messages(path, {m.id: (1, 1) for m in path}, LIGHT)
    qtbot.waitUntil(lambda: view.widget_for(4) is not None)
    for width in (800, 1600):
        view.resize(width, 600)
        view.show()
        block = view.widget_for(3).tool_block
        block.header.click() if block.details.isHidden() else None
        qtbot.waitUntil(lambda: block.details.isVisible())
        qtbot.wait(50)
        viewport = view.viewport().width()
        assert view.widget().width() <= viewport
        assert block.details.width() <= viewport and block.details.height() > 5 * block.fontMetrics().height()
        reply = view.widget_for(4)
        for name, button in reply.buttons.items():
            if button.isVisible():
                right = button.mapTo(view.viewport(), QPoint(button.width(), 0)).x()
                assert right <= viewport, (width, name, right, viewport)
        assert block.details.text().endswith(LONG_LINE)


def test_a_long_unbroken_word_in_a_message_wraps_inside_the_view(qtbot):
    """The same for a message's own text: a pasted URL, base64 or a minified JSON in a
    paragraph, inline code, a code block or a table made the transcript as wide as the word
    (62,043 px for 8,000 characters), pushing every bubble's buttons off screen."""
    from app.window.transcript.markdown_view import break_long_runs

    contents = [LONG_LINE, f"see {LONG_LINE} here", f"`{LONG_LINE}`", f"```\n{LONG_LINE}\n```",
                f"| a |\n|---|\n| {LONG_LINE} |", f"<{LONG_LINE}>&amp;{LONG_LINE}"]
    for content in contents:
        view = TranscriptView()
        qtbot.addWidget(view)
        path = [_message(1, "user", content, None), _message(2, "assistant", content, 1),
                _message(3, "assistant", "Done.", 2)]
        view.set_messages(path, {m.id: (1, 1) for m in path}, LIGHT)
        qtbot.waitUntil(lambda: view.widget_for(3) is not None and view.widget_for(1) is not None)
        view.resize(800, 600)
        view.show()
        qtbot.wait(50)
        viewport = view.viewport().width()
        assert view.widget().width() <= viewport, content[:20]
        for mid in (1, 2):
            bubble = view.widget_for(mid)
            right = bubble.mapTo(view.viewport(), QPoint(bubble.width(), 0)).x()
            assert right <= viewport, (content[:20], mid, right, viewport)
            assert LONG_LINE in bubble.body.text().replace("\u200b", "")  # all of it is there
    # the break opportunities go into text only: tags, attributes and entities stay whole
    link = f'<a href="https://example.org/{LONG_LINE}">x&amp;{LONG_LINE}&lt;</a>'
    broken = break_long_runs(link)
    assert broken.startswith(f'<a href="https://example.org/{LONG_LINE}">') and broken.endswith("&lt;</a>")
    assert broken.replace("\u200b", "") == link and "&am\u200b" not in broken
    assert break_long_runs("漢字" * 40) == "漢字" * 40  # CJK breaks between characters already
