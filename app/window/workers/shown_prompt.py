"""The shown branch's prompt, read off the UI thread once per branch: ``ShownPrompt``.

Four parts of the window need the engine's messages for the branch on screen: the
context figure, the draft's token count, the zero-wait prewarm and the send. Reading them is in proportion to
the conversation (``app.session.packed_prompt``), so it is a job of the window's
``ChatReader``, run when one of them first asks after the branch changed, and its pickled
bytes are shared. A send checks them against the conversation's row (one read) and goes
with them; only when they are not ready or not current does it read the branch itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject

from app.session.packed_prompt import PackedPrompt, read_packed_prompt

log = logging.getLogger(__name__)


class ShownPrompt(QObject):
    """The ``PackedPrompt`` of ``chat``'s shown branch (a ``ChatController``: its
    ``conversation_id`` and ``shown_leaf``), read with ``reader`` (a ``ChatReader``).

    ``current()`` gives it when it was read for the branch shown now; ``want(ready)`` also
    starts the read when it was not, and calls ``ready(packed)`` on the UI thread when it
    arrives, unless the branch changed meanwhile (once, however often it asked while the
    read ran). ``reads`` counts the reads (tests)."""

    def __init__(self, chat, reader, parent: QObject | None = None):
        super().__init__(parent)
        self.chat, self.reader = chat, reader
        self._held: tuple[object, PackedPrompt] | None = None  # (branch key, its prompt)
        self._reading: object | None = None  # the key of the read in flight
        self._waiting: list[Callable[[PackedPrompt], None]] = []
        self.reads = 0
        chat.path_shown.connect(self.path_changed)
        chat.current_changed.connect(lambda _cid: self.path_changed())

    def _key(self):
        return self.chat.conversation_id, self.chat.shown_leaf

    def path_changed(self) -> None:
        """The shown branch changed: what was read is dropped, and so is a read in flight."""
        self._held, self._reading, self._waiting = None, None, []

    def current(self) -> PackedPrompt | None:
        """The prompt of the branch shown now, when it has been read; else None."""
        if self._held is not None and self._held[0] == self._key():
            return self._held[1]
        return None

    def want(self, ready: Callable[[PackedPrompt], None]) -> PackedPrompt | None:
        """``current()``; when it is None (and a chat is shown), ``ready`` is called with the
        prompt once the reader has read it for the branch still shown."""
        packed = self.current()
        if packed is not None or self.chat.conversation_id is None or self.reader.closed:
            return packed
        if ready not in self._waiting:  # a bound method asking twice is called once
            self._waiting.append(ready)
        key = self._key()
        if self._reading == key:
            return None
        self._reading, cid = key, self.chat.conversation_id
        self.reads += 1

        def done(result: PackedPrompt) -> None:
            if self._reading != key or self._key() != key:
                return  # the branch changed meanwhile
            self._reading, self._held = None, (key, result)
            waiting, self._waiting = self._waiting, []
            for fn in waiting:
                fn(result)

        def failed(exc: Exception) -> None:
            if self._reading == key:
                self._reading, self._waiting = None, []
            log.info("the shown branch could not be read: %s", exc)

        self.reader.submit("shown-prompt", lambda store: read_packed_prompt(store, cid), done, failed)
        return None
