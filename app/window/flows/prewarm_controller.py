"""Zero-wait turns, the window's side: tell the engine what the next prompt will probably be.

The engine does the work between requests (``engine/prewarm.py``); this controller decides
when to ask, from what the user does:

* a conversation or branch is shown (sidebar, sibling switch, tree click, start, a reply
  ended): the path, restored and prefilled up to the next user header;
* the composer (or an inline editor: the path then ends before the edited message) holds a
  draft: ``IDLE_MS`` after a keystroke, the whole prompt of the draft as it would be sent
  (so that Enter, one key-gap later, finds it ready); and at most every ``PARTIAL_MS``,
  the draft up to its last whitespace, for keys faster than that;
* the pointer enters a reply's Regenerate button: the prompt of its user message.

A newer prewarm replaces an older one in the engine, and any request (Enter) interrupts one
between batches and reuses what it computed. Nothing is asked while the setting is off, no
local model is ready, a reply streams, the cache is off, or the window is hidden or
minimized. Qt has no battery API (PySide6 6.11 has none in QtCore or QtGui), so the
setting is the way to save battery. The shown path's messages are read and pickled once per
path, on the window's reader thread (``ChatController.shown_prompt``: in proportion to the
conversation, a 10,000-message branch took 0.5 s on the UI thread), and every keystroke's
request carries those bytes.
"""

from __future__ import annotations

import logging

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from app.session import ConversationSession
from app.window.flows.model_controller import ModelController, ModelState
from app.window.settings.settings_model import SettingsModel
from app.window.shell.lifetime import Lifetime
from app.window.transcript.composer import Composer
from app.window.transcript.transcript_view import TranscriptView
from app.window.workers.chat_reader import ChatReader
from engine.chat_template import ChatMessage
from engine.events import pack_messages
from engine.prewarm import stable_prefix

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

log = logging.getLogger(__name__)


def _packed(messages: list[ChatMessage]) -> tuple[bytes, int]:
    """``messages`` pickled on the reader thread (``pack_messages``) and how many they are."""
    return pack_messages(messages), len(messages)

PARTIAL_MS = 300  # while typing: the draft's stable part at most this often
_EMPTY = pack_messages([])  # the path of a chat not created yet
IDLE_MS = 30  # after each keystroke (a burst, a paste or auto-repeat coalesced): the whole prompt


class PrewarmController(QObject):
    """Prewarms of ``chat``'s shown path on ``model``'s engine, from what ``composer`` and
    ``transcript`` (its inline editors, its Regenerate buttons) report; the shown path is
    ``chat.shown_prompt``, the others are read with ``reader``. Nothing is asked while ``window`` is hidden or minimized, ``lifetime`` is
    closed, ``settings.prewarm`` is off or the chat generates without the cache
    (``chat.use_cache``).

    Signal ``answered(result dict)`` for each prewarm the engine finished or dropped
    (engine.prewarm.PrewarmResult; tools and tests)."""

    answered = Signal(dict)

    def __init__(self, *, chat: ChatController, model: ModelController, settings: SettingsModel,
                 composer: Composer, transcript: TranscriptView, reader: ChatReader, lifetime: Lifetime,
                 window: QWidget):
        super().__init__(window)
        self.chat, self.model, self.settings, self.reader, self.lifetime = chat, model, settings, reader, lifetime
        self.composer, self.transcript, self.visible_in = composer, transcript, window
        self._editing: int | None = None  # the message an inline editor is open on
        self._edit_path: tuple[bytes, int] | None = None  # the path before it, packed (None: being read)
        self._edit_text = ""
        self._last: tuple | None = None  # the last request sent (not repeated)
        self._hovered: int | None = None  # the reply whose Regenerate was prepared (once per path)
        self.requests = 0  # prewarms sent (for tools and tests)
        self.attachments = None  # the composer's files (AttachFlow): a draft is prewarmed with them rendered in
        self.partial = QTimer(self, singleShot=True, interval=PARTIAL_MS)
        self.partial.timeout.connect(lambda: self._draft(complete=False))
        self.idle = QTimer(self, singleShot=True, interval=IDLE_MS)
        self.idle.timeout.connect(lambda: self._draft(complete=True))

    def connect(self) -> None:
        """Follow the composer's and the transcript's signals (after the window's own)."""
        self.composer.input.textChanged.connect(self.draft_changed)
        self.composer.send_requested.connect(lambda _text: self._stop_timers())
        self.transcript.edit_changed.connect(self.edit_changed)
        self.transcript.edit_ended.connect(self.edit_ended)
        self.transcript.regenerate_hovered.connect(self.regenerate_hovered)

    # -- when to ask ---------------------------------------------------------------------

    def active(self) -> bool:
        """Whether a prewarm may be asked for now (see the module docstring)."""
        model = self.model
        return bool(self.settings.prewarm and self.chat.use_cache and not self.lifetime.closed
                    and model.state == ModelState.READY and not (model.facts or {}).get("remote")
                    and not self.chat.streaming and self.visible_in.isVisible() and not self.visible_in.isMinimized())

    def path_changed(self) -> None:
        """The shown path changed (or a reply ended): prewarm it, with the draft if any."""
        self._last = None
        self._hovered = None
        if self._editing is None:
            self._prewarm_shown()

    def _prewarm_shown(self) -> None:
        """Prewarm the shown path with the composer's text (the whole prompt too, shortly)."""
        self._draft(complete=False)
        if self._text().strip():
            self.idle.start()

    def attachments_changed(self) -> None:
        """A file was attached to (or removed from) the draft: prewarm the draft with it at
        once, so the document is prefilled while the question is typed."""
        self._last = None
        if self._editing is None and self.active():
            self._prewarm_shown()

    def draft_changed(self) -> None:
        if not self.active():
            return
        if not self.partial.isActive():
            self.partial.start()
        self.idle.start()

    def edit_changed(self, message_id: int, text: str) -> None:
        """An inline editor on ``message_id`` opened or changed: prewarm up to its parent
        (that path read on the reader thread, once per editor)."""
        self._edit_text = text
        if self._editing != message_id:
            self._editing, self._edit_path, self._last = message_id, None, None

            def done(path: tuple[bytes, int]) -> None:
                if self._editing == message_id:
                    self._edit_path = path
                    self._draft(complete=False)

            self.reader.submit("prewarm-edit", lambda store: _packed(ConversationSession(store).prompt_before(message_id)),
                               done, lambda exc: log.info("no prewarm for the edit: %s", exc))
        self.draft_changed()

    def edit_ended(self, message_id: int) -> None:
        if self._editing == message_id:
            self._editing = None
            self._last = None

    def regenerate_hovered(self, message_id: int) -> None:
        """The pointer entered the Regenerate button of ``message_id``: prewarm the prompt a
        regeneration would send (read on the reader thread)."""
        if not self.active() or message_id == self._hovered:
            return
        self._hovered = message_id

        def job(store):
            session = ConversationSession(store)
            return _packed(session.prompt(session.regenerate_target(message_id)))

        def done(path: tuple[bytes, int]) -> None:
            if self._hovered == message_id and self.active():
                self._send(path[0], None, True, path[1])

        self.reader.submit("prewarm-hover", job, done, lambda exc: log.info("no prewarm for regenerate: %s", exc))

    # -- asking --------------------------------------------------------------------------

    def _stop_timers(self) -> None:
        self.partial.stop()
        self.idle.stop()

    def _text(self) -> str:
        return self._edit_text if self._editing is not None else self.composer.text()

    def _messages(self) -> tuple[list[ChatMessage] | bytes, int] | None:
        """The path the draft goes under, as ``(messages or their pickled bytes, count)``;
        None while the shown path is still being read (``ChatController.shown_prompt``; the
        prewarm starts when it arrives)."""
        if self._editing is not None:
            return self._edit_path
        if self.chat.conversation_id is None:
            return _EMPTY, 0
        packed = self.chat.shown_prompt.want(self._path_read)
        return None if packed is None else (packed.data, packed.count)

    def _path_read(self, _packed) -> None:
        if self._editing is None:
            self._prewarm_shown()

    def _draft(self, complete: bool) -> None:
        if not self.active():
            return
        path = self._messages()
        if path is None:
            return
        messages, count = path
        text = self._text()
        if complete:
            text = text.strip()  # as the composer sends it
            if not text:
                return
        if self._editing is None and self.attachments is not None:
            text = self.attachments.rendered(text)  # the files' blocks, then the draft (as it is sent)
        if not complete and self._last is not None and self._last[1] is not None:
            if stable_prefix(text) == stable_prefix(self._last[1]):
                return  # the last request (a whole prompt too) covers this one: do not replace it
        self._send(messages, text, complete, count)

    def _send(self, messages: list[ChatMessage] | bytes, draft: str | None, complete: bool,
              count: int | None = None) -> None:
        key = (id(messages), draft, complete)
        empty = not (len(messages) if count is None else count)
        if key == self._last or (empty and draft is not None and not draft.strip()):
            return
        handle = self.model.client.prewarm(messages, draft, complete)
        if handle is None:
            return
        self._last = key
        self.requests += 1
        handle.done.connect(lambda event: self.answered.emit(dict(event.result)))
