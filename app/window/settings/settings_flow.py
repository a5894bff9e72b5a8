"""Settings → OK: what changes, in order, so a bad value never leaves the window stuck.

The dialog validates its values before it closes (``SettingsDialog.accept``); then this
saves them and reloads the model when a load setting changed. A load that fails with the
new settings goes back to the previous model and settings (``ModelController``). At start,
fields of ``settings.json`` that held invalid values are named in a banner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from app.window.flows.model_controller import ModelController
from app.window.settings.app_settings import ENGINE_FIELDS, SETTINGS_FILE
from app.window.settings.kv_switch import PrefillMeter
from app.window.settings.settings_dialog import SettingsDialog
from app.window.settings.settings_model import SettingsModel
from app.window.shell.a11y import name_controls
from app.window.shell.banner import Banner
from storage.chats import ChatStore

if TYPE_CHECKING:
    from app.window.transcript.chat_controller import ChatController

RELOAD_FIELDS = (*ENGINE_FIELDS, "engine_url", "engine_key", "engine_model")
"""Settings whose change reloads the model."""


class SettingsFlow(QObject):
    """Opens the Settings dialog over ``parent`` and applies what it returns: to ``settings``
    (``SettingsModel.update``), to the shown chat of ``chat`` in ``store``, and a reload of
    ``model`` when a load setting changed. ``dialog`` is the dialog while it is open."""

    def __init__(self, *, settings: SettingsModel, store: ChatStore, chat: ChatController, model: ModelController,
                 banner: Banner, parent: QWidget):
        super().__init__(parent)
        self.settings, self.store, self.chat, self.model, self.banner = settings, store, chat, model, banner
        self.parent_widget = parent
        self.dialog: SettingsDialog | None = None
        self.prefill = PrefillMeter(store, self)  # the measured speed a KV precision change is priced at
        chat.reply_finished.connect(self.prefill.reply_saved)

    def report_reset_fields(self) -> None:
        """A banner naming the fields ``AppSettings.load`` reset (nothing when none were)."""
        s = self.settings
        if s.unreadable:
            self.banner.show_message(f"The settings file could not be used. {s.unreadable}", "error",
                                     [("Settings…", self.open)])
        elif s.reset_fields:
            names = ", ".join(s.reset_fields)
            self.banner.show_message(
                f"{s.data_dir / SETTINGS_FILE} held an invalid value for {names}; "
                f"{'that setting is' if len(s.reset_fields) == 1 else 'those settings are'} back to "
                "the default. Your other settings were kept.", "info", [("Settings…", self.open)])

    def open(self) -> None:
        """Open the Settings dialog (window-modal, never waited on)."""
        chat, model = self.chat, self.model
        cid = chat.conversation_id
        conv = self.store.get_conversation(cid) if cid else None
        used = int(getattr(chat.status, "context_used", 0) or 0)  # the shown branch's tokens (status bar)
        self.prefill.seed(w.message.stats for w in reversed(chat.transcript.widgets)
                          if w.message is not None and w.role == "assistant")
        dlg = SettingsDialog(conv, self.settings.values, self.settings.data_dir, model.client, self.parent_widget,
                             new_chat=chat.new_chat_settings(),
                             trained_context=int((model.facts or {}).get("context_length") or 0),
                             facts=model.facts,
                             presets_saved=lambda presets: self.settings.update(prompt_presets=presets),
                             chat_tokens=used if cid and used else None,
                             prefill_rate=self.prefill.rate)
        self.dialog = dlg
        dlg.tools_tab.use_hub(chat.tools.hub)  # listing tools starts the servers the calls then reuse
        name_controls(dlg)
        dlg.finished.connect(lambda result: self._done(dlg, conv, result))
        dlg.open()

    def _done(self, dlg: SettingsDialog, conv, result: int) -> None:
        self.dialog = None
        if result != SettingsDialog.DialogCode.Accepted:
            self.chat.tools.settings_changed()  # a server tried in the dialog but not saved ends
            return
        prompt, sampling = dlg.conversation_values()
        if conv is not None:
            self.store.set_system_prompt(conv.id, prompt)
            self.store.set_sampling(conv.id, sampling)
        elif dlg.chat_changed():  # else the new chat follows the defaults, changed or not
            self.chat.set_new_chat_settings(prompt, sampling)
        changed = self.settings.update(**dlg.app_values(), reset_fields=[])  # the budget: ModelController
        self.chat.tools.settings_changed()  # a removed or changed MCP server's connection ends
        if changed & set(RELOAD_FIELDS) and not self.chat.streaming:
            self.model.reload()
