"""Settings → OK: what changes, in order, so a bad value never leaves the window stuck.

The dialog validates its values before it closes (``SettingsDialog.accept``); then this
saves them and reloads the model when a load setting changed. A load that fails with the
new settings goes back to the previous model and settings (``ModelController``). At start,
fields of ``settings.json`` that held invalid values are named in a banner.
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from app.window.shell.a11y import name_controls
from app.window.settings.app_settings import ENGINE_FIELDS, SETTINGS_FILE
from app.window.settings.settings_dialog import SettingsDialog

RELOAD_FIELDS = (*ENGINE_FIELDS, "engine_url", "engine_key", "engine_model")
"""Settings whose change reloads the model."""


class SettingsFlow(QObject):
    """Opens the Settings dialog for ``window`` (a MainWindow) and applies what it returns."""

    def __init__(self, window):
        super().__init__(window)
        self.w = window

    def report_reset_fields(self) -> None:
        """A banner naming the fields ``AppSettings.load`` reset (nothing when none were)."""
        w = self.w
        if w.settings.unreadable:
            w.banner.show_message(f"The settings file could not be used. {w.settings.unreadable}", "error",
                                  [("Settings…", w.open_settings)])
        elif w.settings.reset_fields:
            names = ", ".join(w.settings.reset_fields)
            w.banner.show_message(
                f"{w.data_dir / SETTINGS_FILE} held an invalid value for {names}; "
                f"{'that setting is' if len(w.settings.reset_fields) == 1 else 'those settings are'} back to "
                "the default. Your other settings were kept.", "info", [("Settings…", w.open_settings)])

    def open(self) -> None:
        w = self.w
        cid = w.chat.conversation_id
        conv = w.store.get_conversation(cid) if cid else None
        dlg = SettingsDialog(conv, w.settings.values, w.data_dir, w.client, w, new_chat=w.chat.new_chat_settings(),
                             trained_context=int((w.model.facts or {}).get("context_length") or 0))
        w.settings_dialog = dlg
        name_controls(dlg)
        dlg.finished.connect(lambda result: self._done(dlg, conv, result))
        dlg.open()

    def _done(self, dlg: SettingsDialog, conv, result: int) -> None:
        w = self.w
        w.settings_dialog = None
        if result != SettingsDialog.DialogCode.Accepted:
            return
        prompt, sampling = dlg.conversation_values()
        if conv is not None:
            w.store.set_system_prompt(conv.id, prompt)
            w.store.set_sampling(conv.id, sampling)
        elif dlg.chat_changed():  # else the new chat follows the defaults, changed or not
            w.chat.set_new_chat_settings(prompt, sampling)
        changed = w.settings.update(**dlg.app_values(), reset_fields=[])  # the budget: ModelController
        if changed & set(RELOAD_FIELDS) and not w.chat.streaming:
            w.model.reload()
