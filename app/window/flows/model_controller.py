"""The model and the engine process: start, load, restart, the model's facts, and what the
window says when a load fails or the engine process dies.

State (``ModelState``)::

    NONE --load--> LOADING --loaded--> READY
                      |                  |
                      +--load_failed--> FAILED        (any) --process died--> DEAD --restart--> LOADING
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.session import model_label
from app.window.flows.crash import crash_name, describe_exit
from app.window.flows.model_dialog import open_model_dialog
from app.window.settings.settings_dialog import human_bytes
from app.window.settings.settings_model import SettingsModel
from app.window.shell.banner import Banner
from app.window.shell.plain import isolate, menu_text, tooltip
from app.window.shell.status_bar import StatusBar
from app.window.workers.engine_client import EngineClient, EngineExit
from app.window.workers.tasks import Workers
from engine.cpu import remember_crash
from engine.errors import ModelLoadError
from engine.events import CacheAction
from engine.model_file import check_gguf, default_model_path

log = logging.getLogger(__name__)


class ModelState(StrEnum):
    NONE = "none"        # nothing asked for yet
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"    # the model could not be loaded; the engine process still runs
    DEAD = "dead"        # the engine process ended


def facts_text(f: dict) -> str:
    """The Model info text for a ModelFacts dict (sizes in bytes, context in tokens)."""
    return "\n".join([
        f"Name: {f.get('name', '')}",
        f"File: {f.get('path', '')}",
        f"Architecture: {f.get('architecture', '')}",
        f"Parameters: {int(f.get('parameters') or 0):,}",
        f"Quantization: {f.get('quantization', '')}",
        f"File size: {human_bytes(int(f.get('size_bytes') or 0))}",
        f"Trained context: {int(f.get('context_length') or 0):,} tokens",
        f"Context in use: {int(f.get('n_ctx') or 0):,} tokens",
        f"CPU threads: {int(f.get('n_threads') or 0)}",
        f"KV cache per token: {human_bytes(int(f.get('kv_bytes_per_token') or 0))}",
        f"Prefix store: {'on' if f.get('cache_policy') == 'full' else f.get('cache_policy')}",
    ])


class ModelController(QObject):
    """Owns ``EngineClient`` (its reader a task of ``workers``) and the model's lifecycle:
    loads with ``settings``, reports in ``banner`` and ``status``, opens its dialogs over
    ``parent``; ``data_dir`` holds the crash record, ``logs_dir`` the engine's log.
    ``explicit_model``: the model file asked for on the command line (None: the settings').

    Signals: ready(facts), failed(message), died(message), settings_requested() (a banner's
    "Settings…" was clicked).
    """

    ready = Signal(dict)
    failed = Signal(str)
    died = Signal(str)
    settings_requested = Signal()

    def __init__(self, *, settings: SettingsModel, banner: Banner, status: StatusBar, workers: Workers,
                 data_dir: Path, logs_dir: Path, parent: QWidget, explicit_model: str | None = None):
        super().__init__(parent)
        self.settings, self.banner, self.status, self.parent_widget = settings, banner, status, parent
        self.data_dir, self.logs_dir = Path(data_dir), Path(logs_dir)
        self.client = EngineClient(self.data_dir, self.logs_dir / "engine.log", self, workers)
        self.state = ModelState.NONE
        self.facts: dict | None = None
        self.death: tuple[str, Callable[[], None]] | None = None
        """While DEAD: what the crash banner said and its Restart action (which records a
        native crash for the repacking decision), for a later banner to repeat."""
        self.path: str | None = None  # the model asked for
        self.good_path: str | None = None  # the last model that loaded
        self.good_engine: dict | None = None  # AppSettings.engine_fields() of the last model that loaded
        self.after_load = None  # called once when the next load succeeds
        self.dialog: QFileDialog | None = None  # Open model, while it is open
        self._falling_back = False  # loading the previous model after a failed load
        self._explicit = explicit_model
        self.client.load_progress.connect(lambda done, total: status.loading(done, total))
        self.client.loaded.connect(self._loaded)
        self.client.load_failed.connect(self._load_failed)
        self.client.died.connect(self._died)
        settings.changed.connect(self._settings_changed)

    def _settings_changed(self, names: frozenset[str]) -> None:
        """A new prefix-store budget goes to the engine at once (the others apply at the next load)."""
        if "budget_bytes" in names and self.client.is_running():
            self.client.cache(CacheAction.SET_BUDGET, self.settings.budget_bytes)

    @property
    def log_file(self) -> Path:
        return self.logs_dir / "engine.log"

    def start(self) -> None:
        """Start the engine process and load the model chosen at start-up."""
        self.client.start()
        path = self._explicit or self.settings.last_model
        if path and not Path(path).exists():
            which = "given with --model" if self._explicit else "last used"
            then = ("Replies come from the server set in Settings." if self.settings.remote_engine() is not None
                    else "Loading the default model instead; Model → Open model… chooses another.")
            self.banner.show_message(f"Model file not found: {path} ({which}). {then}", "info")
            path = None
        self.load(path)

    def say_not_ready(self, held: str = "") -> None:
        """Say in the banner why no reply can start (the model loads, the engine is down, no
        model is loaded), with what to do. ``held``: what of the user's is kept meanwhile
        ("your message was not sent and is still in the box"), said first; after a crash the
        crash's own words and Restart follow again."""
        if self.state == ModelState.LOADING:
            self.banner.show_message("The model is still loading; send again in a moment.", "info")
        elif self.state == ModelState.DEAD:  # no reply streams: restarting has nothing to save first
            said, restart = self.death or ("The engine is not running. Restart it to go on.", self.restart)
            first = f"{held[:1].upper()}{held[1:]}. " if held else ""
            self.banner.show_message(f"{first}{said}", "error", [("Restart engine", restart)])
        else:
            self.banner.show_message("No model is loaded. Open a GGUF model file to chat.", "error",
                                     [("Open model…", self.open_dialog), ("Load default model", lambda: self.load(None))])

    def restart(self) -> None:
        """A fresh engine process, reloading the last model that loaded (or the default)."""
        self.death = None
        self.banner.hide()
        self.client.start()
        self.load(self.good_path or self.path)

    def load(self, path: str | None) -> None:
        """Load ``path`` (None: the embedded default model) in the background; with an
        engine URL in the settings, connect to that server instead."""
        remote = self.settings.remote_engine()
        if remote is not None:
            self._load_remote(remote)
            return
        s = self.settings
        try:
            p = str(check_gguf(path if path else default_model_path()))
            engine = s.engine_settings()
        except (ModelLoadError, ValueError) as exc:
            self._refused(str(exc))
            return
        if not self.client.is_running():
            self.client.start()
        self.path = p
        self.state = ModelState.LOADING
        self.status.model_label.setText(f"Loading {isolate(Path(p).name)}…")
        self.status.loading()
        self.client.load(p, engine.to_dict(), s.budget_bytes)

    def _refused(self, message: str) -> None:
        """A file or settings refused before the engine was asked: the model in use (if any)
        stays loaded and in use."""
        if self.state != ModelState.READY or self.facts is None:
            self._load_failed(message)
            return
        name = Path(self.good_path).name if self.good_path else "The current model"
        self.banner.show_message(f"{message} {name} is still loaded and in use.", "error",
                                 [("Open model…", self.open_dialog)], topic="model")
        self.failed.emit(message)

    def _load_remote(self, remote: dict) -> None:
        if not self.client.is_running():
            self.client.start()
        self.state = ModelState.LOADING
        self.status.model_label.setText(f"Connecting to {remote['url']}…")
        self.status.loading()
        s = self.settings
        self.client.load("", s.engine_settings().to_dict(), s.budget_bytes, remote)

    def reload(self) -> None:
        self.load(self.good_path or self.path)

    @property
    def label(self) -> str:
        """The label stored on replies (``app.session.model_label``; a remote engine's model name)."""
        if (self.facts or {}).get("remote"):
            return str(self.facts.get("name") or "model")
        return model_label(self.path, self.facts)

    def _loaded(self, facts: dict) -> None:
        self.facts = facts
        self.state = ModelState.READY
        self.status.progress.hide()
        if facts.get("remote"):  # an OpenAI-compatible server: not a model file to remember
            self.status.model_label.setText(f"{isolate(facts.get('name') or 'model')} @ {isolate(str(facts.get('server', '')))}")
            self.status.model_label.setToolTip(tooltip(f"Replies come from the server at {facts['remote']}"))
        else:
            self.good_path = facts.get("path") or self.path
            self.good_engine = self.settings.engine_fields()
            self.settings.remember_model(self.good_path)
            params = facts.get("parameters") or 0
            size = (f" · {params / 1e9:.1f}B parameters" if params >= 1e9
                    else f" · {params / 1e6:.0f}M parameters" if params else "")
            self.status.model_label.setText(f"{isolate(model_label(self.good_path, facts))}{size}")
            self.status.model_label.setToolTip(tooltip(facts_text(facts)))
        fell_back, self._falling_back = self._falling_back, False
        if facts.get("cache_policy", "full") != "full":
            self.banner.show_message(f"The prefix store is off for this model: {facts['cache_policy']}", "info",
                                     topic="model")
        elif (self.banner.isVisible() and (self.banner.kind == "error" or self.banner.topic == "model")
              and not fell_back):
            self.banner.hide()  # after a fall-back it says why this model is back (until the next reply)
        self.ready.emit(facts)
        after, self.after_load = self.after_load, None
        if after is not None:
            after()

    def _load_failed(self, message: str) -> None:
        if self._fall_back(message):
            return
        self._falling_back = False
        self.state = ModelState.FAILED
        self.facts = None
        self.status.progress.hide()
        self.status.model_label.setText("No model")
        self.after_load = None
        if self.settings.remote_engine() is not None:  # the server could not be reached
            self.banner.show_message(f"The engine server could not be used. {message}", "error",
                                            [("Retry", self.reload), ("Settings…", self.settings_requested.emit)])
            self.failed.emit(message)
            return
        actions = [("Open model…", self.open_dialog)]
        if self.good_path and self.good_path != self.path:
            actions.append(("Load previous model", lambda: self.load(self.good_path)))
        else:
            actions.append(("Load default model", lambda: self.load(None)))
        said = message if "could not be loaded" in message else f"The model could not be loaded. {message}"
        self.banner.show_message(said, "error", actions, topic="model")
        self.failed.emit(message)

    def _fall_back(self, message: str) -> bool:
        """After a failed load of a new model or with new settings: load the last model that
        loaded, with the settings it loaded with, and say so. False when there is none (or
        that was the load that failed)."""
        if (self._falling_back or not self.good_path or self.good_engine is None
                or self.settings.remote_engine() is not None
                or (self.path == self.good_path and self.settings.engine_fields() == self.good_engine)):
            return False
        changed = [k for k, v in self.good_engine.items() if getattr(self.settings, k) != v]
        self.settings.update(**self.good_engine)
        self._falling_back, self.facts, self.after_load = True, None, None
        said = message.strip() if message.strip().endswith(".") else message.strip() + "."
        if "could not be loaded" not in said:
            said = f"{Path(self.path or '').name or 'The model'} could not be loaded: {said}"
        if changed:
            said = f"With the new settings ({', '.join(changed)}): {said}"
        self.banner.show_message(
            f"{said} Going back to {Path(self.good_path).name}{' with the settings that worked' if changed else ''}. "
            f"Details: {self.log_file}", "error",
            [("Open model…", self.open_dialog), ("Settings…", self.settings_requested.emit)], topic="model")
        self.failed.emit(message)
        self.load(self.good_path)
        return True

    def _died(self, exit_info: EngineExit) -> None:
        if exit_info.unresponsive:
            self._restart_unresponsive()
            return
        loaded_off = str((self.facts or {}).get("repack", "")).startswith("off")  # e.g. a K-quant model
        report = describe_exit(exit_info.exitcode, self.log_file,
                               early=exit_info.during_load or exit_info.during_first_reply,
                               repack="off" if loaded_off else self.settings.repack)
        log.warning("engine died: %s", report.message)
        self.state = ModelState.DEAD
        self.facts = None
        self.after_load = None
        self.status.progress.hide()
        self.status.model_label.setText("Engine stopped")
        self.died.emit(report.message)  # the transcript saves a reply in progress first

        def restart() -> None:
            if report.safe_restart:
                remember_crash(self.data_dir, crash_name(exit_info.exitcode) or "a crash")
                if self.settings.repack == "on":  # "auto" follows the remembered crash (engine/cpu.py)
                    self.settings.update(repack="off")
            self.restart()  # a reply in progress was saved when ``died`` was handled

        self.death = (report.message, restart)
        self.banner.show_message(report.message, "error", [("Restart engine", restart)])

    def _restart_unresponsive(self) -> None:
        """The watchdog behind Stop ended an engine that did not answer: say so, keep the
        reply up to where it stopped, and start a new engine at once."""
        log.warning("engine ended after Stop went unanswered")
        self.state = ModelState.DEAD
        self.death = None
        self.facts = None
        self.after_load = None
        self.died.emit("The engine did not answer Stop.")  # the transcript saves the reply first
        self.restart()  # a reply in progress was saved when ``died`` was handled
        self.banner.show_message(
            "The engine did not answer Stop, so Branchwise ended it and is starting a new one (the model "
            f"reloads). The reply was kept up to where it stopped. The details are in {self.log_file}.",
            "info")

    def dialog_folder(self) -> Path:
        """Where Open model starts: the folder of the last model opened from a file (not the
        embedded default's, inside the Python packages), else the library's ``models/`` in
        the data folder when it exists, else the home folder."""
        default = default_model_path().resolve()
        for p in [self.good_path, *self.settings.recent_models]:
            if p and Path(p).resolve() != default and Path(p).parent.is_dir():
                return Path(p).parent
        library = self.data_dir / "models"
        return library if library.is_dir() else Path.home()

    def open_dialog(self) -> None:
        """The Open model dialog (``self.dialog`` while it is open; ``model_dialog.py``), in
        ``dialog_folder``; choosing a file loads it."""
        self.dialog = open_model_dialog(self.parent_widget, self.dialog_folder(), self.load)
        self.dialog.finished.connect(lambda _r: setattr(self, "dialog", None))

    def fill_recent(self, menu) -> None:
        """The File → Recent models menu: each model file once (however its path was written;
        the embedded default model only as the last entry, "Default model")."""
        menu.clear()
        seen: set[Path] = {default_model_path().resolve()}
        for p in self.settings.recent_models:
            if Path(p).resolve() in seen:
                continue
            seen.add(Path(p).resolve())
            a = menu.addAction(menu_text(Path(p).name), lambda _c=False, q=p: self.load(q))
            a.setToolTip(tooltip(p))
        if len(seen) == 1:
            menu.addAction("(none yet)").setEnabled(False)
        menu.addSeparator()
        menu.addAction("Default model (SmolLM2-135M)", lambda: self.load(None))

    def show_info(self) -> None:
        box = QMessageBox(self.parent_widget)
        box.setWindowTitle("Model info")
        box.setTextFormat(Qt.TextFormat.PlainText)  # general.name etc. come from the model file
        box.setText(facts_text(self.facts) if self.facts else "No model is loaded.")
        box.open()
