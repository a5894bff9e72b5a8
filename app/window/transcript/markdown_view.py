"""Markdown to the HTML subset Qt's rich text understands, with Pygments-highlighted code.

Qt labels render a subset of HTML 4 (no CSS classes on spans from a style sheet
we do not control), so code is highlighted with inline styles
(``HtmlFormatter(noclasses=True)``). Each code block is preceded by a
``copy:<n>`` link; ``code_blocks`` returns the raw code of block ``n``.

Every message is hostile text (typed, pasted, or written by a model), so:

* Raw HTML is shown as text, never interpreted (markdown-it ``html: False``).
* **No image is ever loaded.** A Markdown image (``![alt](src)``) is rendered as a link
  labelled "Image: alt", so no ``<img>`` reaches Qt. Qt's ``QTextDocument::loadResource``
  (qtbase ``src/gui/text/qtextdocument.cpp``) would otherwise read a local path with
  ``QFile::readAll`` on the UI thread: ``/dev/zero`` grows without end, a FIFO blocks,
  relative paths resolve against the current folder, and on Windows ``//host/share/x.png``
  opens an SMB connection that can leak the user's login hash. As a second line,
  :class:`SafeTextDocument` (the document of :class:`MarkdownView`) overrides
  ``loadResource`` to answer every URL with an empty image. (``QLabel`` rich text cannot
  be guarded that way, and PySide6 does not bind ``QTextDocument::setResourceProvider``,
  so text from elsewhere must reach a label either through :func:`to_html` or as plain
  text.)
* Entities are not decoded: typing ``&amp;`` shows "&amp;", as typed.
* Links are never opened here: :func:`classify_link` sorts them, and
  :class:`MarkdownView` emits ``external_link_requested(QUrl)`` for http(s) links so the
  window can show the URL in a confirmation dialog before opening the browser.
"""

from __future__ import annotations

import functools

import html
import re
from enum import StrEnum

from markdown_it import MarkdownIt
from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QImage, QTextDocument
from PySide6.QtWidgets import QTextBrowser, QWidget
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from app.window.shell.plain import displayable
from app.window.shell.theme import Colors

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable("table")
_md.enable("strikethrough")
_md.disable("entity")  # `&amp;` stays the five characters the user typed


class LinkKind(StrEnum):
    """What a click on a link in a message does."""

    COPY_CODE = "copy code"  # copy:<n>, the "Copy code" link of code block n
    EXTERNAL = "external"  # http(s): ask the user (the URL shown in full), then open the browser
    IGNORED = "ignored"  # anything else (file:, relative paths, other schemes): nothing


def classify_link(href: str) -> LinkKind:
    """How a link in a rendered message is handled (see :class:`LinkKind`)."""
    h = href.strip()
    if h.startswith("copy:") and h[5:].isdigit():
        return LinkKind.COPY_CODE
    scheme = h.split(":", 1)[0].lower() if ":" in h else ""
    if scheme in ("http", "https") and h[len(scheme) + 1 :].startswith("//"):
        return LinkKind.EXTERNAL
    return LinkKind.IGNORED


def _image_as_link(_renderer, tokens, idx, options, env) -> str:
    """An image becomes a link labelled with its alt text: nothing is fetched or read."""
    tok = tokens[idx]
    src = tok.attrGet("src") or ""
    alt = "".join(t.content for t in (tok.children or []) if t.type in ("text", "code_inline")) or src
    return f'<a href="{html.escape(src)}">Image: {html.escape(alt)}</a>'


_md.add_render_rule("image", _image_as_link)


def code_blocks(text: str) -> list[str]:
    """The raw contents of the fenced/indented code blocks of ``text``, in order."""
    return [t.content for t in _md.parse(text) if t.type in ("fence", "code_block")]


def _lexer(info: str, code: str, guess: bool = True):
    name = (info or "").strip().split(" ")[0]
    if name:
        try:
            return get_lexer_by_name(name)
        except ClassNotFound:
            pass
    if not guess:  # guess_lexer tries every lexer: tens of ms, too slow while streaming
        return TextLexer()
    try:
        return guess_lexer(code) if len(code) > 40 else TextLexer()
    except ClassNotFound:
        return TextLexer()


@functools.lru_cache(maxsize=8)
def _formatter(style: str) -> HtmlFormatter:
    """One Pygments formatter per style (building one takes milliseconds: its stylesheet)."""
    return HtmlFormatter(noclasses=True, nowrap=True, style=style)


LONG_RUN = 40
"""Characters without a break opportunity after which a line may break anyway."""

_TAG_OR_TEXT = re.compile(r"(<[^>]*>)")
_RUN = re.compile(r"(?:&#?\w+;|[^\s<>&\u200b\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef])"
                  "{%d,}" % LONG_RUN)  # CJK breaks between its characters already
_CHAR_OR_ENTITY = re.compile(r"&#?\w+;|.", re.S)


def break_long_runs(rich: str) -> str:
    """``rich`` with a ZERO WIDTH SPACE (U+200B, a line-break opportunity) after every
    ``LONG_RUN // 2`` characters of a run of at least ``LONG_RUN`` characters that holds
    no break opportunity (a pasted URL, base64, a minified JSON), in text only, never inside
    a tag or an entity. Qt's rich text cannot break such a word, so one made the bubble,
    and the whole transcript, as wide as the word (62,043 px for 8,000 characters)."""

    def split(match: re.Match) -> str:
        parts = _CHAR_OR_ENTITY.findall(match.group(0))
        step = LONG_RUN // 2
        return "\u200b".join("".join(parts[i:i + step]) for i in range(0, len(parts), step))

    pieces = _TAG_OR_TEXT.split(rich)
    for i in range(0, len(pieces), 2):  # the even pieces are text between tags
        if len(pieces[i]) >= LONG_RUN:
            pieces[i] = _RUN.sub(split, pieces[i])
    return "".join(pieces)


def to_html(text: str, colors: Colors, streaming: bool = False, first_code: int = 0) -> str:
    """Render ``text`` (Markdown) as Qt rich text, code highlighted in ``colors``' Pygments style.

    Raw HTML in ``text`` is shown as text, never interpreted; images become links (the
    output holds no ``<img>``). While ``streaming``, code without a language tag is not
    guessed at (it is re-rendered many times a second). Code blocks link to ``copy:<n>``,
    numbered from ``first_code`` (``text`` is part of a message after that many blocks).
    """
    tokens = _md.parse(displayable(text))  # no direction control or pile of marks acts on the page
    formatter = _formatter(colors.pygments_style)
    counter = {"n": first_code}

    def fence(tokens, idx, options, env):
        tok = tokens[idx]
        n = counter["n"]
        counter["n"] += 1
        lang = (tok.info or "").strip().split(" ")[0]
        body = highlight(tok.content.rstrip("\n"), _lexer(tok.info, tok.content, guess=not streaming), formatter)
        label = html.escape(lang) if lang else "code"
        return (
            f'<table width="100%" cellspacing="0" cellpadding="6" '
            f'style="background-color:{colors.code_bg}; border:1px solid {colors.border}; margin:4px 0px;">'
            f'<tr><td style="color:{colors.muted}; font-size:small;">{label}'
            f'&nbsp;&nbsp;&nbsp;<a href="copy:{n}" style="color:{colors.accent}; text-decoration:none;">'
            f"Copy code</a></td></tr>"
            f'<tr><td><pre style="white-space:pre-wrap; margin:0px; font-family:monospace;">{body}</pre>'
            f"</td></tr></table>"
        )

    def table_open(tokens, idx, options, env):
        # the grid in the muted text colour: the border colour is too faint on a bubble
        return (f'<table border="1" cellspacing="0" cellpadding="6" style="border-collapse:collapse; '
                f'border-color:{colors.muted}; border-style:solid; margin:4px 0px;">')

    renderer = _md.renderer
    rules = renderer.rules
    saved = (rules.get("fence"), rules.get("code_block"), rules.get("table_open"))
    rules["fence"] = fence
    rules["code_block"] = fence
    rules["table_open"] = table_open
    try:
        body = break_long_runs(renderer.render(tokens, _md.options, {}))
    finally:
        rules["fence"], rules["code_block"], rules["table_open"] = saved
    return (
        f'<style>code {{ background-color:{colors.code_bg}; font-family:monospace; }}'
        f" th {{ background-color:{colors.code_bg}; }}"
        f" a {{ color:{colors.accent}; }} p {{ margin-top:2px; margin-bottom:6px; }}</style>{body}"
    )


# -- Qt: documents and a view that never load a resource ----------------------------------


class SafeTextDocument(QTextDocument):
    """A ``QTextDocument`` that never loads a resource. ``resource_requests`` lists the
    URLs Qt asked ``loadResource`` for (tests assert it stays empty of files)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.resource_requests: list[QUrl] = []

    def loadResource(self, type_: int, url: QUrl):  # noqa: N802 - Qt's name
        self.resource_requests.append(QUrl(url))
        return QImage()


class MarkdownView(QTextBrowser):
    """A read-only view of one message's Markdown (:func:`to_html`) that loads nothing
    and opens nothing by itself.

    Signals:
        external_link_requested(QUrl): an http(s) link was clicked; the window asks the
            user (showing the full URL) before handing it to ``QDesktopServices``.
        copy_code_requested(int): the "Copy code" link of code block n was clicked.
    """

    external_link_requested = Signal(QUrl)
    copy_code_requested = Signal(int)

    def __init__(self, colors: Colors, parent: QWidget | None = None):
        super().__init__(parent)
        self.colors = colors
        self.resource_requests: list[QUrl] = []
        self.setDocument(SafeTextDocument(self))
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setReadOnly(True)
        self.anchorClicked.connect(self._anchor)
        self._text = ""

    def set_markdown(self, text: str, streaming: bool = False) -> None:
        self._text = text
        self.setHtml(to_html(text, self.colors, streaming=streaming))

    def markdown(self) -> str:
        return self._text

    def loadResource(self, type_: int, url: QUrl):  # noqa: N802 - Qt's name
        self.resource_requests.append(QUrl(url))
        return QImage()

    def _anchor(self, url: QUrl) -> None:
        href = url.toString()
        kind = classify_link(href)
        if kind is LinkKind.COPY_CODE:
            self.copy_code_requested.emit(int(href[5:]))
        elif kind is LinkKind.EXTERNAL:
            self.external_link_requested.emit(QUrl(url))
