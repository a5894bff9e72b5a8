"""Every chat remembers its model: the model a reply was written with is stored on its
conversation (``ChatStore.models``); opening a chat made with another model says so in a
bar above the transcript, with one click to switch (or the setting "always switch"); a
model file that is gone gets clear words and the choice to pick another. The messages are
never touched: whatever the model, the history stays as it is.

The first screen (the empty chat page) offers "Get a better model" next to the embedded
one (``FirstScreen``), opening the Models window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QCheckBox, QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.session import model_label
from app.window.flows.model_controller import ModelController, ModelState
from app.window.settings.settings_model import SettingsModel
from app.window.shell.plain import isolate, menu_text, plain_label
from app.window.shell.status_bar import StatusBar
from engine.model_file import default_model_path
from storage.chats import ChatStore
from storage.errors import StorageError

log = logging.getLogger(__name__)


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b


class ModelBar(QFrame):
    """The bar above the transcript: ``label`` says which model the chat last ran on;
    ``switch_button`` switches to it, ``always`` is the "always switch" setting,
    ``pick_button`` / ``find_button`` choose another model when its file is gone."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chat_model_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 6, 4)
        self.label = plain_label(QLabel())
        self.label.setObjectName("chat_model_text")
        self.label.setWordWrap(True)
        self.switch_button = QPushButton()
        self.always = QCheckBox("Always switch")
        self.always.setToolTip("Open every chat on the model it last ran on, without asking")
        self.pick_button = QPushButton("Pick another model…")
        self.find_button = QPushButton("Find models…")
        self.close_button = QPushButton("Keep this model")
        lay.addWidget(self.label, 1)
        for w in (self.switch_button, self.always, self.pick_button, self.find_button, self.close_button):
            lay.addWidget(w)
        self.hide()

    def offer_switch(self, chat_model: str, current: str, always: bool) -> None:
        self.label.setText(f"This chat last ran on {isolate(chat_model)}; you are using {isolate(current)}.")
        self.switch_button.setText(menu_text(f"Switch to {isolate(chat_model)}"))
        self.always.setChecked(always)
        for w, shown in ((self.switch_button, True), (self.always, True), (self.pick_button, False),
                         (self.find_button, False), (self.close_button, True)):
            w.setVisible(shown)
        self.show()

    def file_gone(self, chat_model: str, path: str) -> None:
        self.label.setText(f"This chat last ran on {isolate(chat_model)}, but its file {isolate(path)} is no "
                           "longer there. Every "
                           "message is kept; pick another model to go on with the chat.")
        for w, shown in ((self.switch_button, False), (self.always, False), (self.pick_button, True),
                         (self.find_button, True), (self.close_button, True)):
            w.setVisible(shown)
        self.show()


class FirstScreen(QWidget):
    """Under the empty chat page's text: the model in use and "Get a better model…"."""

    def __init__(self, find_models: Callable[[], None], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("first_screen_models")
        lay = QVBoxLayout(self)
        self.label = plain_label(QLabel())
        self.label.setObjectName("first_screen_model")
        self.label.setWordWrap(True)
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.button = QPushButton("Get a better model…")
        self.button.setObjectName("get_better_model")
        self.button.clicked.connect(find_models)
        lay.addWidget(self.label)
        lay.addWidget(self.button, 0, Qt.AlignmentFlag.AlignHCenter)

    def set_model(self, name: str, embedded: bool) -> None:
        self.label.setText(f"Chatting with the embedded {name}, a small model that shows how Branchwise works."
                           if embedded else f"Chatting with {name}.")
        self.button.setText("Get a better model…" if embedded else "Find models…")


class ChatModelFlow(QObject):
    """Remembers each chat's model and offers it back. Collaborators: ``store`` (where it is
    remembered), ``model`` (what is loaded; ``load`` switches), ``settings``
    (``always_switch_model``), ``status`` (a note after an automatic switch), ``bar`` (a
    :class:`ModelBar`, placed by the window), ``find_models`` (opens the Models window).

    Signals: switched(path) (a switch to the chat's model was asked for).
    """

    switched = Signal(str)

    def __init__(self, *, store: ChatStore, model: ModelController, settings: SettingsModel, status: StatusBar,
                 find_models: Callable[[], None], parent: QWidget):
        super().__init__(parent)
        self.store, self.model, self.settings, self.status = store, model, settings, status
        self.bar = ModelBar(parent)
        self.first_screen = FirstScreen(find_models, parent)
        self.first_screen.set_model(model_label(default_model_path()), True)
        self.conversation_id: int | None = None
        self.bar.switch_button.clicked.connect(self.switch)
        self.bar.always.toggled.connect(lambda on: self.settings.update(always_switch_model=bool(on)))
        self.bar.pick_button.clicked.connect(model.open_dialog)
        self.bar.find_button.clicked.connect(find_models)
        self.bar.close_button.clicked.connect(self.bar.hide)
        model.ready.connect(lambda _facts: self._model_changed())

    def _current_path(self) -> str | None:
        """The model file loaded, or being loaded (None: none, or a remote server)."""
        if (self.model.facts or {}).get("remote") or self.settings.remote_engine() is not None:
            return None
        return self.model.path if self.model.state == ModelState.LOADING else (self.model.good_path or self.model.path)

    def reply_saved(self, message_id: int) -> None:
        """A reply was saved: its conversation now runs on the loaded model."""
        if not message_id or self.model.state != ModelState.READY:
            return
        try:
            cid = self.store.get_message(message_id).conversation_id
            self.store.models.remember(cid, self._current_path(), self.model.label)
        except StorageError as exc:  # the reply itself is saved; only the note is missing
            log.warning("could not remember the model of a chat: %s", exc)

    def chat_shown(self, conversation_id: int | None) -> None:
        """A chat was opened: say so when it last ran on another model (or switch)."""
        self.conversation_id = conversation_id
        self._check()

    def _model_changed(self) -> None:
        facts = self.model.facts or {}
        path = self._current_path()
        embedded = _same_file(path, str(default_model_path()))
        self.first_screen.set_model(self.model.label if facts else "model", embedded)
        self._check()

    def _check(self) -> None:
        cid = self.conversation_id
        chat = self.store.models.of(cid) if cid is not None else None
        current = self._current_path()
        if chat is None or not chat.path or current is None or _same_file(chat.path, current):
            self.bar.hide()
            return
        if not Path(chat.path).is_file():
            self.bar.file_gone(chat.name, chat.path)
            return
        if self.settings.always_switch_model:
            self.bar.hide()
            if self.model.state != ModelState.LOADING:
                self.status.flash(f"Switched to {chat.name}, the model this chat last ran on.", 6000)
                self.switch()
            return
        self.bar.offer_switch(chat.name, self.model.label, self.settings.always_switch_model)

    def switch(self) -> None:
        """Load the model the shown chat last ran on."""
        chat = self.store.models.of(self.conversation_id) if self.conversation_id is not None else None
        if chat is None or not chat.path:
            return
        self.bar.hide()
        self.switched.emit(chat.path)
        self.model.load(chat.path)
