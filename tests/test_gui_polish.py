"""A new user's first look at the window (the polish pass): the tree panel's width and
nodes, Settings → App and Tools, the two context figures, a stopped reply's footer, the
status line at 800 px, the Models window's Library and failed search, and the empty states.
In the real window (offscreen), without a model unless a test needs the engine."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint, QRect  # noqa: E402
from PySide6.QtGui import QColor, QFont, QFontMetrics  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402

from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _settle(rounds: int = 8) -> None:
    for _ in range(rounds):
        QApplication.processEvents()


def _resize(w, width: int, height: int = 800) -> None:
    w.resize(width, height)
    _settle()
    w.transcript.finish_building()
    _settle()


def _three_leaves(data_dir) -> dict:
    """A chat whose tree has three leaves (an edited first message and a regenerated reply),
    the user's screenshot 06: the active branch is the leftmost one."""
    (data_dir / "settings.json").write_text(json.dumps({"n_ctx": 8192, "n_threads": 1, "show_tree": True}))
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="Hi! What can you help me with?")
        u1 = s.add_message(conv.id, None, "user", "Hi! What can you help me with?")
        a1 = s.add_message(conv.id, u1.id, "assistant", "I'm glad you're enjoying me as I am! My name is Elena.")
        s.add_message(conv.id, u1.id, "assistant", "I'm here to assist you with anything you need today.")
        u2 = s.add_message(conv.id, a1.id, "user", "Give me three tips for baking bread.")
        a2 = s.add_message(conv.id, u2.id, "assistant", "The most crucial tips for baking bread are these three.")
        other = s.add_message(conv.id, None, "user", "Hello! Can you tell me a story?")
        s.add_message(conv.id, other.id, "assistant", "Once upon a time a dragon lived by the sea.")
        s.set_active_leaf(conv.id, a2.id)
    return {"cid": conv.id, "tips": u2.id}


def _window(open_window, data_dir):
    return open_window(data_dir, wait=False, start_engine=False)


def _contrast(a: QColor, b: QColor) -> float:
    def lum(c: QColor) -> float:
        def ch(v: float) -> float:
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
        return 0.2126 * ch(c.redF()) + 0.7152 * ch(c.greenF()) + 0.0722 * ch(c.blueF())
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _ink_contrast(widget) -> float:
    """The contrast of the most contrasting pixel of ``widget`` against its commonest one
    (the background): the text's colour, drawn."""
    image = widget.grab().toImage()
    counts: dict[int, int] = {}
    for y in range(image.height()):
        for x in range(image.width()):
            rgb = image.pixel(x, y)
            counts[rgb] = counts.get(rgb, 0) + 1
    background = QColor.fromRgb(max(counts, key=counts.get))
    return max(_contrast(QColor.fromRgb(rgb), background) for rgb in counts)


# -- 1. the tree panel ------------------------------------------------------------------------

def test_the_tree_panel_takes_a_quarter_after_any_resize_and_a_drag_is_kept(qtbot, open_window, data_dir):
    _three_leaves(data_dir)
    w = _window(open_window, data_dir)
    _resize(w, 1180)
    w.splitter.setSizes([236, 708, 236])  # a fifth, as the user's window had it (not a drag)
    _settle()
    _resize(w, 1600)
    assert w.tree.width() >= 0.24 * 1600, w.splitter.sizes()
    assert w.tree.width() <= 0.26 * 1600
    total = sum(w.splitter.sizes())
    w.splitter.setSizes([300, total - 300 - 560, 560])  # the user drags the tree panel wider
    w.splitter.splitterMoved.emit(total - 560, 2)
    _resize(w, 1400)
    share = w.splitter.sizes()[2] / sum(w.splitter.sizes())
    assert abs(share - 560 / total) < 0.01, w.splitter.sizes()  # the drag's share, not the default


def test_a_three_leaf_tree_fits_at_1600_px_and_its_root_stays_in_view_at_800(qtbot, open_window, data_dir):
    _three_leaves(data_dir)
    w = _window(open_window, data_dir)
    wait_for_tree(qtbot, w)
    _resize(w, 1600)
    scroll, canvas = w.tree.scroll, w.tree.canvas
    qtbot.waitUntil(lambda: canvas.width() >= scroll.viewport().width() > 0, timeout=3000)
    assert len(canvas.nodes) == 7
    assert scroll.horizontalScrollBar().maximum() == 0, (canvas.tree_layout.width, scroll.viewport().width())
    _resize(w, 800)
    _settle()
    seen = canvas.visibleRegion().boundingRect()
    assert scroll.horizontalScrollBar().maximum() > 0  # the tree scrolls at 800 px ...
    root = canvas.root_rect().toAlignedRect()
    assert seen.contains(root), (seen, root)  # ... and its root is never cut at the edge
    # the root is an accent pill, not a message's white or blue box
    image = canvas.grab(QRect(QPoint(0, 0), canvas.size())).toImage()
    fill = image.pixelColor(root.left() + 4, root.center().y())
    accent = QColor(w.look.colors.accent)
    assert max(abs(fill.red() - accent.red()), abs(fill.green() - accent.green()),
               abs(fill.blue() - accent.blue())) <= 12, (fill.name(), accent.name())
    assert root.height() < canvas.node_font().pointSize() * 4 and root.height() < 30


def test_a_node_shows_four_or_more_words_on_two_lines(qtbot, open_window, data_dir):
    ids = _three_leaves(data_dir)
    w = _window(open_window, data_dir)
    wait_for_tree(qtbot, w)
    from app.window.tree.tree_layout import NODE_H, NODE_W

    canvas = w.tree.canvas
    font = canvas.node_font()
    bold = QFont(font)
    bold.setBold(True)
    fm = QFontMetrics(font)
    room = NODE_W - 11 - QFontMetrics(bold).horizontalAdvance("U") - 5  # as the node is painted
    lines = canvas.drawn_lines(ids["tips"], room, fm)
    assert 1 <= len(lines) <= 2 and all(fm.horizontalAdvance(line) <= room for line in lines)
    whole = [word for word in " ".join(lines).split() if "…" not in word]
    assert whole[:4] == ["Give", "me", "three", "tips"], lines
    assert 2 * fm.height() <= NODE_H - 9  # two lines fit above the coverage bar


# -- 2. Settings → App and Tools -------------------------------------------------------------

def _settings_dialog(tmp_path, **kw):
    from app.window.settings.app_settings import AppSettings
    from app.window.settings.settings_dialog import SettingsDialog

    dlg = SettingsDialog(None, AppSettings(**kw), tmp_path, None)
    dlg.show()
    dlg.tabs.setCurrentIndex(2)
    _settle()
    return dlg


def test_the_prefix_store_figures_fit_beside_clear_cache_and_server_rows_hide(qtbot, tmp_path):
    dlg = _settings_dialog(tmp_path)
    try:
        dlg._cache_answer(SimpleNamespace(stats={"bytes": 23_800_000, "budget_bytes": 4 << 30, "tokens": 1031,
                                                 "blocks": 18}))
        _settle()
        label = dlg.cache_use
        assert label.text() == "22.7 MB of 4.0 GB · 1,031 tokens in 18 blocks"
        fits_one_line = QFontMetrics(label.font()).horizontalAdvance(label.text()) <= label.contentsRect().width()
        wraps = label.wordWrap() and label.height() >= label.heightForWidth(label.width())
        assert fits_one_line or wraps, (label.width(), label.height())
        button = QRect(dlg.clear_cache.mapTo(dlg, QPoint(0, 0)), dlg.clear_cache.size())
        assert not QRect(label.mapTo(dlg, QPoint(0, 0)), label.size()).intersects(button)
        # a local model file: the server's fields are not shown; a server: they are
        assert not dlg.engine_url.isVisible() and not dlg.engine_key.isVisible() and not dlg.engine_model.isVisible()
        dlg.engine_kind.setCurrentIndex(1)
        _settle()
        assert dlg.engine_url.isVisible() and dlg.engine_url.isEnabled() and dlg.engine_model.isVisible()
    finally:
        dlg.reject()


def test_the_tools_tab_explains_an_empty_list_in_plain_words(qtbot, tmp_path):
    dlg = _settings_dialog(tmp_path)
    try:
        tab = dlg.tools_tab
        dlg.tabs.setCurrentWidget(tab)
        _settle()
        assert tab.empty_note.isVisible() and "No tool servers yet" in tab.empty_note.text()
        assert "grammar" not in tab.first_call.text() and "schema" not in tab.first_call.text()
    finally:
        dlg.reject()


def test_speculative_decoding_is_a_choice_and_a_draft_model_needs_its_file(qtbot, tmp_path):
    dlg = _settings_dialog(tmp_path, speculative="draft:/models/small.gguf")
    try:
        row = dlg.speculative
        assert row.kind.currentText() == "Draft model" and row.path.text() == "/models/small.gguf"
        assert row.path.isVisible() and row.browse.isVisible()
        assert dlg.app_values()["speculative"] == "draft:/models/small.gguf" and dlg.problem() == ""
        row.path.setText("")
        assert "needs the draft model's file" in dlg.problem()
        row.kind.setCurrentIndex(row.kind.findText("Prompt lookup"))
        _settle()
        assert not row.path.isVisible() and dlg.app_values()["speculative"] == "lookup" and dlg.problem() == ""
        row.kind.setCurrentIndex(row.kind.findText("Off"))
        assert dlg.app_values()["speculative"] == "none"
    finally:
        dlg.reject()


# -- 3. the draft's figure under the composer ------------------------------------------------

def test_the_draft_figure_says_after_sending_and_is_readable_in_both_themes(qtbot, open_window, data_dir):
    _three_leaves(data_dir)
    w = _window(open_window, data_dir)
    _resize(w, 1200)
    draft = w.extras.draft_count
    w.composer.input.setPlainText("Tell me a long story about a dragon")
    draft.timer.stop()
    try:
        for theme in ("light", "dark"):
            w.look.set_theme(theme)
            _settle()
            draft._answered(SimpleNamespace(message_tokens=(8,), prompt_tokens=38, n_ctx=8192))
            _settle()
            assert draft.label.isVisible()
            assert draft.label.text() == "message 8 tokens · after sending: context 38 / 8,192"
            assert _ink_contrast(draft.label) >= 4.5, theme
    finally:
        w.look.set_theme("light")
        _settle()


# -- 4. a stopped reply ----------------------------------------------------------------------

def test_a_stopped_reply_says_stopped_in_its_footer(qtbot, open_window, data_dir):
    from app.window.transcript.message_widget import stats_line

    stats = {"generated_tokens": 37, "decode_tokens_per_s": 13.0, "ttft_ms": 34.0, "finish_reason": "cancelled"}
    with ChatStore(data_dir / CHATS_DB) as s:
        conv = s.create_conversation(title="A dragon")
        user = s.add_message(conv.id, None, "user", "Tell me a long story about a dragon")
        s.add_message(conv.id, user.id, "assistant", "The tale of a dragon is", stats=stats, status="stopped")
    w = _window(open_window, data_dir)
    w.show_conversation(conv.id)
    _resize(w, 1200)
    footer = w.transcript.widgets[-1].footer.text()
    assert footer.startswith("37 tokens · 13 tok/s · TTFT 34 ms · stopped"), footer
    assert "stopped" not in stats_line({**stats, "finish_reason": "stop"})
    assert "hit max tokens" in stats_line({**stats, "finish_reason": "length"})


# -- 5. the status line ----------------------------------------------------------------------

def test_the_status_line_drops_whole_figures_and_never_cuts_a_word(qtbot):
    from app.window.shell.status_bar import fitted_text

    fm = QFontMetrics(QApplication.font())
    text = "prefilled while you typed: 14 tokens · ready before you sent: 220 tokens · nothing left to prefill · 13 tok/s"
    words = set(text.split()) | {"…"}
    for width in range(10, fm.horizontalAdvance(text) + 20, 7):
        shown = fitted_text(text, width, fm)
        assert fm.horizontalAdvance(shown) <= width, (width, shown)
        assert set(shown.split()) <= words, (width, shown)  # whole words only
        if shown != text and fm.horizontalAdvance("… · 13 tok/s") <= width:
            assert shown.endswith("13 tok/s"), (width, shown)


def test_the_status_line_at_800_px_shows_whole_figures(qtbot, open_window, data_dir):
    _three_leaves(data_dir)
    w = _window(open_window, data_dir)
    _resize(w, 800)
    status = w.status
    status.set_context(660, 8192)
    status.model_label.setText("SmolLM2-135M-Instruct.Q4_1 · 135M parameters")
    status.set_api("running", "http://127.0.0.1:8080/v1")  # less room, as in the user's screenshot 25
    status.show_stats({"typed_tokens": 150, "prepared_tokens": 2161, "prefilled_tokens": 0,
                       "decode_tokens_per_s": 11.0, "generated_tokens": 37})
    _settle()
    shown = status.stats_label.shown_text()
    figures = status.stats_label.text().split(" · ")
    assert shown != status.stats_label.text()  # cut at this width ...
    assert all(part in figures + ["…"] for part in shown.split(" · ")), shown  # ... by whole figures
    assert shown.endswith(" · 11 tok/s") and len(shown.split(" · ")) >= 3, shown
    assert status.model_label.width() <= w.statusBar().width() // 4  # the model's label gives way:
    assert status.model_label.shown_text() == "SmolLM2-135M-Instruct.Q4_1"  # its size first, the name whole


# -- 6. and 8. the Models window -------------------------------------------------------------

def test_the_library_lists_the_built_in_model_and_a_failed_search_shows_no_starters(qtbot, open_window, data_dir):
    from engine.model_file import default_model_path

    w = _window(open_window, data_dir)
    mw = w.models.open()
    try:
        fm = mw.files.fontMetrics()
        assert mw.files.columnWidth(1) >= fm.horizontalAdvance("999.9 GB") + 16  # Size
        assert mw.files.columnWidth(2) >= fm.horizontalAdvance("Fits · Recommended") + 16  # Fit
        mw.tabs.setCurrentWidget(mw.library)
        lib = mw.library
        qtbot.waitUntil(lambda: lib.view.topLevelItemCount() == 1, timeout=30_000)
        item = lib.view.topLevelItem(0)
        assert item.text(0).endswith("(built-in)") and item.text(6).startswith("Built-in")
        assert item.toolTip(0) == str(default_model_path())
        lib.view.setCurrentItem(item)
        assert lib.use_button.isEnabled() and not lib.remove_button.isEnabled()
        with qtbot.waitSignal(mw.use_requested, timeout=3000) as used:
            lib.use_button.click()
        assert used.args[0] == str(default_model_path())

        mw.tabs.setCurrentIndex(0)
        assert mw.results.topLevelItemCount() > 0  # the starter list
        mw._search_job += 1
        mw._search_failed(mw._search_job, OSError("huggingface.co could not be reached: check the connection."))
        _settle()
        assert mw.results.topLevelItemCount() == 0  # no starter list under the failed search
        assert "could not be reached" in mw.results_caption.text()
        from app.window.shell.status_bar import OVER_COLOR

        assert OVER_COLOR in mw.results_caption.styleSheet()
    finally:
        mw.close()


# -- 7. the first-run chat list --------------------------------------------------------------

def test_an_empty_chat_list_says_so(qtbot, open_window, data_dir):
    w = _window(open_window, data_dir)
    _resize(w, 800)
    assert w.sidebar.ids() == []
    assert w.sidebar.list.count() == 1 and w.sidebar.list.item(0).text().startswith("No chats yet")
