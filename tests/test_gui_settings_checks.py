"""Issue #29 items 5, 6 and 7 in the real window: a saved preset stays saved when the dialog
is cancelled (and its name field is cleared); a context size out of range is refused with
the range, and the red line goes as soon as the value is corrected; a change of KV
precision says before OK what the next turn recomputes and how long that may take, and the
blocks of the old precision are kept, so switching back restores them."""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication, QDialogButtonBox  # noqa: E402

from gui_helpers import LOAD_TIMEOUT_MS, new_chat, send_and_wait  # noqa: E402

from engine.limits import MAX_CTX, MIN_CTX  # noqa: E402


def _ok(dlg):
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()


def _tab(dlg, name):
    dlg.tabs.setCurrentIndex(next(i for i in range(dlg.tabs.count()) if dlg.tabs.tabText(i) == name))


def _saved(data_dir) -> dict:
    return json.loads((data_dir / "settings.json").read_text())


def _type(qtbot, box, text):
    """Replace what a spin box or line edit shows with ``text``, typed."""
    edit = box.lineEdit() if hasattr(box, "lineEdit") else box
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClick(edit, Qt.Key.Key_Delete)
    qtbot.keyClicks(edit, text)


def test_a_saved_preset_is_kept_on_cancel_and_its_name_field_cleared(qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    w.open_settings()
    dlg = w.settings_flow.dialog
    _tab(dlg, "New chats")
    form = dlg.defaults_form
    form.system_prompt.setPlainText("Translate everything into French.")
    qtbot.keyClicks(form.preset_name, "Translator")
    qtbot.mouseClick(form.save_preset, Qt.MouseButton.LeftButton)
    assert form.preset_name.text() == ""  # ready for the next name
    assert form.preset.currentData() == "Translator"
    assert dlg.chat_form.preset.findData("Translator") > 0  # the other tab lists it too
    dlg.reject()  # Cancel
    assert _saved(data_dir)["prompt_presets"] == {"Translator": "Translate everything into French."}
    assert w.settings.prompt_presets == {"Translator": "Translate everything into French."}
    w.open_settings()  # and it is offered the next time
    dlg = w.settings_flow.dialog
    assert dlg.chat_form.preset.findData("Translator") > 0
    dlg.chat_form.choose_preset("Translator")
    qtbot.mouseClick(dlg.chat_form.delete_preset, Qt.MouseButton.LeftButton)
    dlg.reject()
    assert _saved(data_dir)["prompt_presets"] == {}  # a deleted one is deleted at once too


def test_a_context_size_out_of_range_is_refused_with_the_range_and_the_message_goes_when_fixed(
        qtbot, open_window, data_dir):
    w = open_window(data_dir, wait=False, start_engine=False)
    w.open_settings()
    dlg = w.settings_flow.dialog
    _tab(dlg, "App")
    _type(qtbot, dlg.n_ctx, "12")
    assert dlg.n_ctx.value() == 12  # kept as typed, not put back to the last value
    _ok(dlg)
    assert dlg.isVisible() and w.settings_flow.dialog is dlg  # OK refused
    assert dlg.error.isVisible()
    text = dlg.error.text()
    assert f"{MIN_CTX}" in text and f"{MAX_CTX:,}" in text and "got 12" in text, text
    assert "Nothing was changed" in text
    assert _saved(data_dir)["n_ctx"] == 2048
    _type(qtbot, dlg.n_ctx, "4096")
    assert not dlg.error.isVisible() and dlg.error.text() == ""  # gone at once, before OK
    # leaving a field with a bad value says so without waiting for OK
    dlg.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is dlg, timeout=5_000)
    _type(qtbot, dlg.budget, "10")
    qtbot.waitUntil(dlg.budget.hasFocus, timeout=5_000)
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
    assert not dlg.budget.hasFocus()
    assert dlg.error.isVisible() and "at least 64 MB" in dlg.error.text()
    _type(qtbot, dlg.budget, "512")
    assert not dlg.error.isVisible()
    _ok(dlg)
    assert w.settings_flow.dialog is None
    assert _saved(data_dir)["n_ctx"] == 4096 and _saved(data_dir)["budget_bytes"] == 512 * 1024 * 1024


def test_the_kv_note_prices_the_recompute():
    from app.window.settings.kv_switch import duration_words, kv_switch_note

    note = kv_switch_note("f16", "q8_0", 2560, 85.0)
    assert note == ("Your chats' stored KV was computed at f16; the next turn of this chat recomputes 2,560 tokens "
                    "(about 30 s at the measured 85 tokens/s) at q8_0, unless it was computed at q8_0 before. "
                    "The f16 KV is kept for when you switch back.")
    assert kv_switch_note("f16", "f16", 2560, 85.0) == ""
    assert "no prefill speed measured yet" in kv_switch_note("q8_0", "f16", 300, None)
    assert "each chat recomputes its whole prompt" in kv_switch_note("f16", "q8_0", None, None)
    assert duration_words(0.2) == "about 1 s" and duration_words(600) == "about 10 min"


def _switch_kv(qtbot, w, label: str) -> str:
    """Choose ``label`` in Settings → App → KV cache precision; return the note shown, then OK
    and wait for the reload."""
    w.open_settings()
    dlg = w.settings_flow.dialog
    _tab(dlg, "App")
    dlg.kv.setCurrentIndex(dlg.kv.findText(label))
    qtbot.waitUntil(dlg.kv_note.isVisible, timeout=5_000)
    note = dlg.kv_note.text()
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        _ok(dlg)
    return note


def test_kv_precision_switch_says_what_it_recomputes_and_switching_back_restores(qtbot, open_window, data_dir,
                                                                                tmp_path):
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 2048, "n_threads": 1, "prewarm": False}))
    w = open_window(data_dir)
    new_chat(w, {"max_tokens": 8})
    words = " ".join(f"Point {i}: the river keeps its course through the valley." for i in range(40))
    first = w.store.get_message(send_and_wait(qtbot, w, f"Summarise in one line. {words}"))
    prompt = first.stats["prompt_tokens"]
    assert first.stats["prefilled_tokens"] >= 300  # a real prefill: a speed to price with
    rate = first.stats["prefilled_tokens"] * 1000 / first.stats["prefill_ms"]
    used = w.status.context_used
    assert used == prompt + first.stats["generated_tokens"]

    w.open_settings()
    dlg = w.settings_flow.dialog
    _tab(dlg, "App")
    assert not dlg.kv_note.isVisible()  # nothing said while the precision is unchanged
    dlg.kv.setCurrentIndex(dlg.kv.findText("q8_0 (half the memory)"))
    qtbot.waitUntil(dlg.kv_note.isVisible, timeout=5_000)
    dlg.resize(800, dlg.height())
    dlg.grab().save(str(tmp_path / "kv-note.png"))
    note = dlg.kv_note.text()
    assert note.startswith("Your chats' stored KV was computed at f16; the next turn of this chat recomputes "
                           f"{used:,} tokens (about ")
    assert f"at the measured {rate:,.0f} tokens/s" in note and "The f16 KV is kept" in note
    seconds = re.search(r"about (\d+) s", note)
    assert seconds and int(seconds.group(1)) == max(1, round(used / rate))
    dlg.kv.setCurrentIndex(dlg.kv.findText("f16 (exact)"))
    assert not dlg.kv_note.isVisible()
    dlg.reject()

    _switch_kv(qtbot, w, "q8_0 (half the memory)")
    at_q8 = w.store.get_message(send_and_wait(qtbot, w, "And in French?"))
    assert at_q8.stats["restored_tokens"] < 64  # the f16 blocks are not used at q8_0
    assert _switch_kv(qtbot, w, "f16 (exact)").startswith("Your chats' stored KV was computed at q8_0")
    # back at f16: the first turn's blocks are still there and restored
    back = w.store.get_message(send_and_wait(qtbot, w, "And in Spanish?"))
    assert back.stats["restored_tokens"] >= prompt - 64, (back.stats, prompt)
