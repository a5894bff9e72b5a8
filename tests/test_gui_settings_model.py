"""The window's settings as one object with a change signal (issue #26.4): ``SettingsModel``
saves on ``update``, emits ``changed(names)`` once with only the names whose value changed,
and refuses a setting assigned behind its back. No model is loaded."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from app.window.settings.settings_model import SettingsModel  # noqa: E402


def test_update_saves_and_emits_the_changed_names_once(qtbot, tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"n_ctx": 2048, "theme": "light"}))
    settings = SettingsModel(tmp_path)
    seen = []
    settings.changed.connect(seen.append)
    assert settings.update(n_ctx=4096, theme="light", show_tree=True) == {"n_ctx", "show_tree"}
    assert seen == [frozenset({"n_ctx", "show_tree"})]
    assert (settings.n_ctx, settings.theme, settings.show_tree) == (4096, "light", True)
    saved = json.loads((tmp_path / "settings.json").read_text())
    assert (saved["n_ctx"], saved["theme"], saved["show_tree"]) == (4096, "light", True)
    assert settings.update(n_ctx=4096) == frozenset()
    assert len(seen) == 1  # nothing changed: no signal


def test_remember_model_goes_through_update(qtbot, tmp_path):
    settings = SettingsModel(tmp_path)
    seen = []
    settings.changed.connect(seen.append)
    settings.remember_model("/models/a.gguf")
    settings.remember_model("/models/b.gguf")
    assert settings.recent_models == ["/models/b.gguf", "/models/a.gguf"]
    assert settings.last_model == "/models/b.gguf"
    assert seen == [frozenset({"recent_models", "last_model"})] * 2
    assert json.loads((tmp_path / "settings.json").read_text())["last_model"] == "/models/b.gguf"


def test_a_setting_cannot_be_assigned_or_misspelt_and_values_is_a_copy(qtbot, tmp_path):
    settings = SettingsModel(tmp_path)
    with pytest.raises(AttributeError, match="update"):
        settings.n_ctx = 1
    with pytest.raises(AttributeError, match="n_cxt"):
        settings.update(n_cxt=1)
    assert not (tmp_path / "settings.json").exists()  # a refused update writes nothing
    copy = settings.values
    copy.recent_models.append("/elsewhere.gguf")
    assert settings.recent_models == []
    assert settings.engine_settings().n_ctx == settings.n_ctx  # AppSettings' methods read through


def test_a_write_error_keeps_the_values_and_still_signals(qtbot, tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    settings = SettingsModel(folder)
    folder.rmdir()  # settings.json cannot be written now
    seen = []
    settings.changed.connect(seen.append)
    assert settings.update(theme="dark") == {"theme"}
    assert settings.theme == "dark" and seen == [frozenset({"theme"})]
