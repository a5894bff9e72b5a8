"""The app settings as one Qt object with a change signal: ``SettingsModel``.

The window reads a setting as an attribute of the model (``settings.n_ctx``, and
``AppSettings``' methods such as ``settings.engine_settings()``) and changes settings only
with ``update(**values)``: that writes ``settings.json`` and emits ``changed(names)`` once
with the names whose value changed. Whoever depends on a setting connects to ``changed``
(the theme, the tree panel's visibility, the prefix store's budget in the engine) instead
of being called by whoever changed it.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import fields
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.window.settings.app_settings import AppSettings

log = logging.getLogger(__name__)

FIELDS = frozenset(f.name for f in fields(AppSettings))
"""The names ``update`` accepts (the fields of ``AppSettings``)."""


class SettingsModel(QObject):
    """The ``AppSettings`` of the data folder ``data_dir`` (read from its ``settings.json``
    unless ``values`` is given).

    Signal ``changed(names)``: ``names`` is a ``frozenset[str]`` of the fields whose value
    an ``update`` changed (never empty). Assigning a field (``settings.n_ctx = 1``) raises
    AttributeError: use ``update``."""

    changed = Signal(object)

    def __init__(self, data_dir: Path, values: AppSettings | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.data_dir = Path(data_dir)
        self._values = AppSettings.load(self.data_dir) if values is None else values

    def __getattr__(self, name: str):
        """A field or method of the settings (called only for names the model lacks)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._values, name)

    def __setattr__(self, name: str, value) -> None:
        if name in FIELDS:
            raise AttributeError(f"settings change through SettingsModel.update({name}=...)")
        super().__setattr__(name, value)

    @property
    def values(self) -> AppSettings:
        """A copy of the current settings (changing it changes nothing)."""
        return copy.deepcopy(self._values)

    def update(self, save: bool = True, **values) -> frozenset[str]:
        """Set the fields in ``values`` (names of ``AppSettings`` fields), write
        ``settings.json`` (unless ``save`` is False; a write error is logged, the values are
        kept in memory) and emit ``changed`` with the names whose value changed, if any.
        Returns those names.

        Raises:
            AttributeError: a name is not a settings field (nothing is changed).
        """
        unknown = set(values) - FIELDS
        if unknown:
            raise AttributeError(f"not a setting: {', '.join(sorted(unknown))}")
        names = frozenset(k for k, v in values.items() if getattr(self._values, k) != v)
        for k, v in values.items():
            setattr(self._values, k, copy.deepcopy(v))
        if save:
            self.save()
        if names:
            self.changed.emit(names)
        return names

    def remember_model(self, path: str) -> frozenset[str]:
        """Put ``path`` first in the recent models and make it the model loaded at start
        (``AppSettings.remember_model``), through ``update``."""
        after = copy.deepcopy(self._values)
        after.remember_model(path)
        return self.update(recent_models=after.recent_models, last_model=after.last_model)

    def save(self) -> None:
        """Write ``settings.json`` now; a write error (a read-only folder) is logged, not raised."""
        try:
            self._values.save(self.data_dir)
        except OSError as exc:
            log.warning("could not save settings: %s", exc)
