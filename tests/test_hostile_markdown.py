"""Messages are hostile text: rendering one never loads a file or a URL (issue #16.1).

`![z](/dev/zero)` once made Qt read /dev/zero as an image until the window was killed,
on every launch; a FIFO froze the UI thread; `//host/share/x.png` would open SMB."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QImage, QTextDocument
from PySide6.QtWidgets import QLabel

from app.window.transcript.markdown_view import LinkKind, MarkdownView, SafeTextDocument, classify_link, to_html
from app.window.shell.theme import LIGHT

HOSTILE_IMAGES = [
    "![z](/dev/zero)",
    "![z](file:///dev/zero)",
    "![rel](images/x.png)",
    "![unc](//host/share/x.png)",
    "![unc](\\\\host\\share\\x.png)",
    "![web](http://127.0.0.1:9/x.png)",
    "![data](data:image/png;base64,iVBORw0KGgo=)",
    '![t](/dev/zero "title")',
    "[![nested](/dev/zero)](https://example.com)",
    "<img src=/dev/zero>",
    '<img src="/dev/zero">',
    "![ref][r]\n\n[r]: /dev/zero",
]


@pytest.mark.parametrize("text", HOSTILE_IMAGES)
def test_rendered_messages_hold_no_image(text):
    out = to_html(text, LIGHT)
    assert "<img" not in out.lower()


def test_image_becomes_a_link_labelled_with_its_alt_text():
    out = to_html("see ![the chart](/dev/zero)", LIGHT)
    assert '<a href="/dev/zero">Image: the chart</a>' in out


def test_view_never_asks_for_a_resource(qtbot):
    view = MarkdownView(LIGHT)
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    for text in HOSTILE_IMAGES:
        view.set_markdown(text)
        view.document().size()  # lays the document out
    assert view.resource_requests == []
    assert isinstance(view.document(), SafeTextDocument)
    assert view.document().resource_requests == []


def test_raw_img_html_in_the_safe_document_loads_nothing(qtbot, tmp_path):
    """The second line of defence: even HTML that bypasses to_html gets nothing from disk
    in a SafeTextDocument, while a plain QTextDocument reads the very same file."""
    png = tmp_path / "pic.png"
    img = QImage(64, 32, QImage.Format.Format_RGB32)
    img.fill(0xFF0000)
    assert img.save(str(png))
    url = QUrl.fromLocalFile(str(png))
    kind = QTextDocument.ResourceType.ImageResource.value
    plain = QTextDocument()
    plain.setHtml(f'<p>x<img src="{png}"></p>')
    plain.size()
    assert plain.resource(kind, url)  # Qt read the PNG: the danger is real
    safe = SafeTextDocument()
    safe.setHtml(f'<p>x<img src="{png}"></p>')
    safe.size()
    got = safe.resource(kind, url)
    assert isinstance(got, QImage) and got.isNull()
    assert safe.resource_requests  # Qt asked, and was answered with nothing


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_images_pointing_at_a_fifo_do_not_block(qtbot, tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    # If anything opened the FIFO for reading it would block; this writer unblocks it
    # after 20 s so a regression fails the asserts below instead of hanging the suite.
    done = threading.Event()
    reached = []

    def unblock():
        if not done.wait(20):
            reached.append(True)
            with open(fifo, "wb"):
                pass

    threading.Thread(target=unblock, daemon=True).start()
    label = QLabel(to_html(f"![p]({fifo}) and ![q](pipe.png)", LIGHT))
    qtbot.addWidget(label)
    label.show()
    label.sizeHint()
    view = MarkdownView(LIGHT)
    qtbot.addWidget(view)
    view.set_markdown(f"![p]({fifo})")
    view.setHtml(f'<img src="{fifo}">')
    view.document().size()
    done.set()
    assert reached == []


def test_dev_zero_image_renders_in_bounded_memory(tmp_path):
    """A child process capped at 2 GB of address space renders `![z](/dev/zero)` in a
    label (through to_html) and raw `<img src=/dev/zero>` in the message view; reading
    /dev/zero would exhaust the cap and kill it."""
    script = textwrap.dedent("""
        import os, resource, sys
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from PySide6.QtWidgets import QApplication, QLabel
        from app.window.transcript.markdown_view import to_html
        from app.window.shell.theme import LIGHT
        app = QApplication([])
        from app.window.transcript.markdown_view import MarkdownView, SafeTextDocument
        label = QLabel(to_html("![z](/dev/zero) ![y](file:///dev/zero)", LIGHT))
        label.show()
        label.sizeHint()
        view = MarkdownView(LIGHT)
        view.set_markdown("![z](/dev/zero)")
        view.setHtml('<img src="/dev/zero"><img src=file:///dev/zero>')
        view.show()
        doc = SafeTextDocument()
        doc.setHtml('<img src="/dev/zero">')
        doc.size()
        app.processEvents()
        print("rendered")
    """)
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS is Linux-only here")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0 and "rendered" in r.stdout, r.stderr[-2000:]


def test_typed_entities_show_as_typed():
    doc = QTextDocument()
    doc.setHtml(to_html("Tom &amp; Jerry &lt;b&gt; &copy; &#65;", LIGHT))
    assert "Tom &amp; Jerry &lt;b&gt; &copy; &#65;" in doc.toPlainText()


def test_tables_have_borders_and_padding():
    out = to_html("| a | b |\n|---|---|\n| 1 | 2 |", LIGHT)
    assert '<table border="1" cellspacing="0" cellpadding="6"' in out
    doc = QTextDocument()
    doc.setHtml(out)
    table = next(f for f in doc.rootFrame().childFrames())
    assert table.format().border() >= 1 and table.format().cellPadding() == 6


@pytest.mark.parametrize(("href", "kind"), [
    ("https://example.com/a?b=1", LinkKind.EXTERNAL),
    ("http://example.com", LinkKind.EXTERNAL),
    ("copy:3", LinkKind.COPY_CODE),
    ("/dev/zero", LinkKind.IGNORED),
    ("file:///etc/passwd", LinkKind.IGNORED),
    ("//host/share/x.png", LinkKind.IGNORED),
    ("javascript:alert(1)", LinkKind.IGNORED),
    ("https:no-slashes", LinkKind.IGNORED),
    ("smb://host/share", LinkKind.IGNORED),
])
def test_link_classification(href, kind):
    assert classify_link(href) is kind


def test_https_link_goes_to_the_hook_not_the_browser(qtbot, monkeypatch):
    from PySide6.QtGui import QDesktopServices

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    view = MarkdownView(LIGHT)
    qtbot.addWidget(view)
    view.set_markdown("[a site](https://example.com/path?q=1) and ![img](/dev/zero) and ```\ncode\n```")
    with qtbot.waitSignal(view.external_link_requested, timeout=2000) as sig:
        view.anchorClicked.emit(QUrl("https://example.com/path?q=1"))
    assert sig.args[0].toString() == "https://example.com/path?q=1"
    with qtbot.waitSignal(view.copy_code_requested, timeout=2000) as sig:
        view.anchorClicked.emit(QUrl("copy:0"))
    assert sig.args == [0]
    with qtbot.assertNotEmitted(view.external_link_requested):
        view.anchorClicked.emit(QUrl("/dev/zero"))
        view.anchorClicked.emit(QUrl("file:///dev/zero"))
    assert opened == [] and view.source().isEmpty()


def test_direction_controls_in_a_message_show_and_do_not_reorder_it():
    """An override (U+202E) in a body drew "see \u202eexe.live" as "see evil.exe"."""
    out = to_html("see \u202eexe.live\u202c and \u2067hidden\u2069", LIGHT)
    assert "\u202e" not in out and "\u2067" not in out
    assert "[U+202E]exe.live[U+202C]" in out and "[U+2067]hidden[U+2069]" in out


def test_a_letter_with_dozens_of_marks_keeps_four():
    out = to_html("Z" + "\u0301" * 30 + " Việt", LIGHT)
    assert "Z" + "\u0301" * 4 + " " in out and "\u0301" * 5 not in out
    assert "Vi\u1ec7t" in out or "Việt" in out  # real text with its marks is untouched
