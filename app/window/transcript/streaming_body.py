"""The body of the reply being streamed: ``StreamingBody``.

Redrawing the whole reply at every flush (``FLUSH_MS``) cost in proportion to its length:
a rich-text label lays its whole text out several times per change (30-45 ms for 1.5 KB on
a busy machine, more as the reply grows). Here the reply is cut after its last complete
Markdown block (a blank line outside a fenced code block): the blocks before the cut are
drawn once, each in a label of its own that never changes again, and only the text after
the cut (the block being written) is redrawn at a flush. The saved reply is drawn whole,
as one message, when it ends.
"""

from __future__ import annotations

import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.window.transcript.markdown_view import code_blocks, to_html
from app.window.transcript.message_body import MessageBody
from app.window.shell.theme import Colors

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def stable_end(text: str) -> int:
    """Where the last complete block of ``text`` ends: just after its last blank line that
    is outside a fenced code block (0 when there is none). ``text`` must start outside one."""
    end, fence, pos = 0, "", 0
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m and (not fence or (m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
                                and not line.strip()[len(m.group(1)):].strip())):
            fence = "" if fence else m.group(1)
        elif not fence and not line.strip() and i + 1 < len(lines) and i > 0:
            end = pos + len(line) + 1  # after the blank line's newline
        pos += len(line) + 1
    return end


class StreamingBody(QWidget):
    """Streamed Markdown in labels: finished blocks fixed, the last one redrawn.

    ``set_text(text)`` takes the whole reply so far (it only grows while streaming; other
    text starts over). Signal ``link_activated(href)``: a link in any of the labels (the
    "copy:<n>" links number the code blocks of the whole reply)."""

    link_activated = Signal(str)

    def __init__(self, colors: Colors, parent: QWidget | None = None):
        super().__init__(parent)
        self.colors = colors
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(6)
        self.frozen: list[QLabel] = []  # one per block run drawn once
        self._text = ""  # the text set last
        self._cut = 0  # the frozen labels hold text[:_cut]
        self._codes = 0  # code blocks in text[:_cut]
        self.live = self._label()

    def _label(self) -> QLabel:
        label = MessageBody()  # its height per width kept: the frozen blocks are never laid out again
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        label.setOpenExternalLinks(False)
        label.linkActivated.connect(self.link_activated)
        label.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)
        # Preferred, as a saved message's body: a word-wrapped label's size hint taken as its
        # minimum made the transcript taller than its bubbles (blank space below the reply)
        label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self._lay.addWidget(label)
        return label

    def set_text(self, text: str) -> None:
        if not text.startswith(self._text[:self._cut]):  # not a continuation: start over
            for label in self.frozen:
                label.deleteLater()
            self.frozen, self._cut, self._codes = [], 0, 0
        self._text = text
        cut = self._cut + stable_end(text[self._cut:])
        if cut > self._cut:  # blocks finished since the last flush: drawn once, for good
            chunk = text[self._cut:cut]
            label = self._label()
            self._lay.insertWidget(len(self.frozen), label)
            label.setText(to_html(chunk, self.colors, streaming=True, first_code=self._codes))
            self.frozen.append(label)
            self._cut, self._codes = cut, self._codes + len(code_blocks(chunk))
        tail = text[cut:]
        self.live.setVisible(bool(tail.strip()))
        self.live.setText(to_html(tail, self.colors, streaming=True, first_code=self._codes) if tail.strip() else "")
