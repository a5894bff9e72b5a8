"""Markdown to the HTML subset Qt's rich text understands, with Pygments-highlighted code.

Qt labels render a subset of HTML 4 (no CSS classes on spans from a style sheet
we do not control), so code is highlighted with inline styles
(``HtmlFormatter(noclasses=True)``). Each code block is preceded by a
``copy:<n>`` link; ``code_blocks`` returns the raw code of block ``n``.
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from app.window.theme import Colors

_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable("table")
_md.enable("strikethrough")


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


def to_html(text: str, colors: Colors, streaming: bool = False) -> str:
    """Render ``text`` (Markdown) as Qt rich text, code highlighted in ``colors``' Pygments style.

    Raw HTML in ``text`` is shown as text, never interpreted. While ``streaming``, code
    without a language tag is not guessed at (it is re-rendered many times a second).
    """
    tokens = _md.parse(text)
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=colors.pygments_style)
    counter = {"n": 0}

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

    renderer = _md.renderer
    rules = renderer.rules
    saved = (rules.get("fence"), rules.get("code_block"))
    rules["fence"] = fence
    rules["code_block"] = fence
    try:
        body = renderer.render(tokens, _md.options, {})
    finally:
        rules["fence"], rules["code_block"] = saved
    return (
        f'<style>code {{ background-color:{colors.code_bg}; font-family:monospace; }}'
        f" a {{ color:{colors.accent}; }} p {{ margin-top:2px; margin-bottom:6px; }}</style>{body}"
    )
