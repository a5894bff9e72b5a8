"""Settings that cannot trap the user (issue #10.1, #10.7): q8_0 KV precision loads (with
flash attention, by the engine's rule), a failed load goes back to the model that worked,
a refused file leaves the working model in use, a settings file is never half-dropped,
and new chats start from app-wide defaults and presets, editable before the first message."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QDialogButtonBox  # noqa: E402
from gui_helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS  # noqa: E402

from app.window.settings.app_settings import AppSettings  # noqa: E402


def _ok(dlg):
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()


def _app_tab(dlg):
    dlg.tabs.setCurrentIndex(next(i for i in range(dlg.tabs.count()) if dlg.tabs.tabText(i) == "App"))


def test_q8_0_kv_precision_loads_and_is_kept_after_a_restart(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    f16_bytes = w.facts["kv_bytes_per_token"]
    w.open_settings()
    dlg = w.settings_flow.dialog
    _app_tab(dlg)
    dlg.kv.setCurrentIndex(dlg.kv.findText("q8_0 (half the memory)"))
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        _ok(dlg)
    assert w.settings_flow.dialog is None and w.model_state == "ready"
    assert ready.args[0]["kv_bytes_per_token"] < f16_bytes * 0.6  # q8_0: 34 bytes per 32 values
    assert not (w.banner.isVisible() and w.banner.kind == "error"), w.banner.text
    assert "Loading" not in w.status.model_label.text()
    saved = json.loads((data_dir / "settings.json").read_text())
    assert (saved["type_k"], saved["type_v"], saved["n_ctx"], saved["n_threads"]) == ("q8_0", "q8_0", 2048, 1)
    again = AppSettings.load(data_dir)  # the next launch keeps every field
    assert again.reset_fields == [] and (again.type_v, again.n_ctx, again.n_threads) == ("q8_0", 2048, 1)
    assert again.engine_settings().flash_attn


def test_a_file_refused_before_loading_keeps_the_model_in_use(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir)
    label = w.status.model_label.text()
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("these are my notes, not a model\n" * 20)
    with qtbot.waitSignal(w.model_failed, timeout=10_000):
        w.load_model(str(text_file))
    assert w.model_state == "ready" and w.status.model_label.text() == label
    assert "notes.gguf is not a GGUF model file" in w.banner.text and "still loaded and in use" in w.banner.text


def test_a_failed_load_goes_back_to_the_model_that_worked(qtbot, open_window, data_dir, tmp_path):
    w = open_window(data_dir)
    good = w.facts["path"]
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(8192))
    with qtbot.waitSignal(w.model_failed, timeout=LOAD_TIMEOUT_MS):
        w.load_model(str(fake))
    qtbot.waitUntil(lambda: w.model_state in ("ready", "failed", "dead"), timeout=LOAD_TIMEOUT_MS)
    assert w.model_state == "ready" and w.facts["path"] == good
    assert "fake.gguf could not be loaded" in w.banner.text and "Going back to" in w.banner.text
    assert w.banner.text.count("could not be loaded") == 1
    assert AppSettings.load(data_dir).last_model == good


def test_an_invalid_field_resets_only_itself_and_is_named(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text(json.dumps(
        {"n_ctx": 3072, "n_threads": 1, "type_k": "q8_0", "type_v": "q4_9", "theme": "dark", "api_port": 9001}))
    w = open_window(data_dir, wait=False, start_engine=False)
    s = w.settings
    assert (s.n_ctx, s.n_threads, s.type_k, s.type_v, s.theme, s.api_port) == (3072, 1, "q8_0", "f16", "dark", 9001)
    assert w.banner.isVisible() and "type_v" in w.banner.text and "other settings were kept" in w.banner.text


def test_new_chat_settings_before_the_first_message_and_app_wide_defaults(qtbot, open_window, data_dir):
    w = open_window(data_dir)
    # app-wide defaults and a preset, set in the "New chats" tab
    w.open_settings()
    dlg = w.settings_flow.dialog
    assert [dlg.tabs.tabText(i) for i in range(2)] == ["New chat", "New chats"]
    d = dlg.defaults_form
    d.temperature.setValue(0.0)
    d.max_tokens.setValue(8)
    d.system_prompt.setPlainText("You are terse.")
    qtbot.keyClicks(d.preset_name, "Pirate")
    d.system_prompt.setPlainText("Talk like a pirate.")
    qtbot.mouseClick(d.save_preset, Qt.MouseButton.LeftButton)
    d.system_prompt.setPlainText("You are terse.")
    assert dlg.chat_form.preset.findData("Pirate") > 0  # the other form lists it too
    _ok(dlg)
    assert w.settings.prompt_presets == {"Pirate": "Talk like a pirate."}
    assert json.loads((data_dir / "settings.json").read_text())["default_sampling"]["max_tokens"] == 8

    # a new chat starts from the defaults
    w.navigator.new_chat()
    w.open_settings()
    dlg = w.settings_flow.dialog
    assert dlg.chat_form.system_prompt.toPlainText() == "You are terse."
    assert dlg.chat_form.max_tokens.value() == 8
    # ... and is editable before its first message: choose the preset, fewer tokens
    dlg.chat_form.choose_preset("Pirate")
    dlg.chat_form.max_tokens.setValue(5)
    _ok(dlg)
    w.composer.input.setPlainText("Hello")
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS) as done:
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    conv = w.store.get_conversation(w.conversation_id)
    assert conv.system_prompt == "Talk like a pirate."
    assert conv.sampling["max_tokens"] == 5 and conv.sampling["temperature"] == 0.0
    assert w.store.get_message(done.args[0]).stats["generated_tokens"] <= 5

    # the next new chat starts from the defaults again
    w.navigator.new_chat()
    assert w.chat.new_chat_settings()[0] == "You are terse."


def test_automatic_threads_leave_a_core_free(qtbot, open_window, tmp_path):
    from engine.machine import default_threads, physical_cores

    folder = tmp_path / "auto-threads"
    folder.mkdir()
    (folder / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 0}))
    w = open_window(folder)
    assert w.facts["n_threads"] == default_threads() == max(1, physical_cores() - 1)
    w.open_settings()
    dlg = w.settings_flow.dialog
    _app_tab(dlg)
    assert dlg.threads.value() == 0
    assert dlg.threads.specialValueText() == f"automatic ({default_threads()} of {physical_cores()} cores)"
    from engine.limits import check_threads, max_threads

    # the spinner offers no count the engine refuses (engine/limits.py: cores x 4), and stops at it
    assert dlg.threads.maximum() == max_threads() == check_threads(max_threads())
    dlg.threads.setValue(max_threads() + 1)
    assert dlg.threads.value() == max_threads()
    dlg.reject()


def test_ok_refuses_a_seed_that_is_not_a_number_and_a_context_past_the_model_s_training(qtbot, open_window,
                                                                                        data_dir):
    w = open_window(data_dir)
    trained = w.model.facts["context_length"]
    assert trained == 8192  # SmolLM2-135M's GGUF metadata
    for setup, words in (
        (lambda d: d.chat_form.seed.setText("abc"), "the seed must be a whole number"),
        (lambda d: (_app_tab(d), d.n_ctx.setValue(trained * 5)),
         "trained for 8,192 tokens of context, and Branchwise takes at most 4 times that (32,768)"),
    ):
        w.open_settings()
        dlg = w.settings_flow.dialog
        qtbot.keyClicks(dlg.chat_form.seed, "x")  # the field takes digits only
        assert dlg.chat_form.seed.text() == ""
        setup(dlg)
        _ok(dlg)
        assert dlg.isVisible() and words in dlg.error.text() and "Nothing was changed" in dlg.error.text()
        dlg.reject()
        assert w.settings.n_ctx != trained * 5
    w.open_settings()
    dlg = w.settings_flow.dialog
    _app_tab(dlg)
    assert not dlg.ctx_note.isVisible()
    dlg.n_ctx.setValue(trained * 2)  # past the training, within 4 times it: allowed, as on the command line
    assert dlg.ctx_note.isVisible() and "trained for 8,192 tokens" in dlg.ctx_note.text()
    assert dlg.problem() == ""
    dlg.reject()
    w.open_settings()
    w.settings_flow.dialog.chat_form.seed.setText("42")
    _ok(w.settings_flow.dialog)
    assert w.chat.new_chat_settings()[1]["seed"] == 42


def test_an_unreadable_settings_file_is_moved_aside_and_said(qtbot, open_window, data_dir):
    (data_dir / "settings.json").write_text('{"n_ctx": 3072, "theme": "da')  # cut short
    w = open_window(data_dir, wait=False, start_engine=False)
    aside = data_dir / "settings.json.unreadable"
    assert aside.read_text() == '{"n_ctx": 3072, "theme": "da'  # kept for the user
    assert w.settings.n_ctx == AppSettings().n_ctx
    assert w.banner.isVisible() and w.banner.text.startswith(
        f"The settings file could not be used. {data_dir / 'settings.json'}: it could not be read (")
    assert f"it was moved to {aside}. Every setting is back to its default." in w.banner.text
    w.settings.save()
    assert "unreadable" not in json.loads((data_dir / "settings.json").read_text())
    assert aside.read_text() == '{"n_ctx": 3072, "theme": "da'
