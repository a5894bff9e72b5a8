"""The Models window (issue #23) offscreen against the fake hub on 127.0.0.1
(tests/fake_hub.py): starters with no network, search, a repository's files with fit
labels, a download with progress in the window and the status line, Cancel and resume,
a gated repository's token, the library's Use and Remove; and every chat reopening on
its own model."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from fake_hub import FakeHub, Repo, RunningHub
from gui_helpers import LOAD_TIMEOUT_MS, new_chat, send_and_wait

SMOL_REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"
GATED_REPO = "meta/Gated-GGUF"
Q41 = "SmolLM2-135M-Instruct-Q4_1.gguf"
Q80 = "SmolLM2-135M-Instruct-Q8_0.gguf"
USER = 0x0100  # Qt.ItemDataRole.UserRole: the row's record


@pytest.fixture
def hub(model_path, monkeypatch):
    repos = {SMOL_REPO: Repo({Q41: model_path, Q80: model_path}, downloads=5000, likes=42),
             GATED_REPO: Repo({Q41: model_path}, licence="llama3.2")}
    with RunningHub(FakeHub(repos, gated={GATED_REPO})) as running:
        monkeypatch.setenv("HF_ENDPOINT", running.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield running


def _items(tree):
    return [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]


def _file_items(mw):
    return [(g.text(0), g.child(j)) for g in _items(mw.files) for j in range(g.childCount())]


def _open_repo(qtbot, mw, repo):
    mw.open_repo(repo)
    qtbot.waitUntil(lambda: mw.files.topLevelItemCount() > 0 or "could not" in mw.files_caption.text()
                    or "gated" in mw.files_caption.text(), timeout=60_000)


def test_find_fit_download_and_use_a_model_without_leaving_the_window(qtbot, open_window, data_dir, hub,
                                                                      model_path):
    from engine.hub import catalog, fit
    from engine.hub.header import read_local

    w = open_window(data_dir)
    first = w.chat_model.first_screen
    assert first.isVisible() and first.button.text() == "Get a better model…"
    assert "embedded SmolLM2-135M-Instruct" in first.label.text()
    first.button.click()  # the first screen opens the Models window
    mw = w.models.window
    assert mw is not None and mw.isVisible()
    assert w.menu_actions["find_models"].shortcut().toString() == "Ctrl+Shift+M"
    assert f"contact 127.0.0.1:{hub.port} (set by HF_ENDPOINT)" in mw.host_label.text()
    starters = catalog.starter_models()
    rows = _items(mw.results)
    assert [r.text(0) for r in rows] == [m["repo"] for m in starters]
    assert {r.text(2) for r in rows} == {"reasoning", "instruct"} and rows[0].text(1).startswith("≈ ")
    assert hub.hub.requests == []  # nothing touched the network before a search

    mw.search_box.setText("smollm2")
    mw.search_button.click()
    qtbot.waitUntil(lambda: "match" in mw.results_caption.text(), timeout=30_000)
    (row,) = _items(mw.results)
    assert [row.text(i) for i in range(5)] == [SMOL_REPO, "5,000", "42", "apache-2.0", "2025-03-04"]
    mw.results.setCurrentItem(row)
    mw.open_button.click()
    qtbot.waitUntil(lambda: mw.files.topLevelItemCount() > 0, timeout=60_000)
    files = _file_items(mw)
    assert [q for q, _ in files] == ["Q4_1", "Q8_0"]
    available = mw.repo_files.files[0].labels["available"]
    facts = read_local(model_path)
    for _q, item in files:
        f = item.data(0, USER)
        lab = f.labels
        assert lab["n_ctx"] == 2048 and lab["needs"] == fit.estimate(facts, f.size, 2048).total
        assert item.text(2).split(" · ")[0] == lab["fit"] == fit.label(lab["needs"], available)
        assert item.text(3) == f"≈ {fit.gb(lab['needs'])} at 2,048 tokens"
    fitting = [item for _q, item in files if item.data(0, USER).labels["fit"] == "Fits"]
    recommended = [item for _q, item in files if "Recommended" in item.text(2)]
    assert len(recommended) == (1 if fitting else 0)
    assert all(r in fitting and r.data(0, USER).size == max(i.data(0, USER).size for i in fitting)
               for r in recommended)
    assert f"127.0.0.1:{hub.port}" in mw.files_caption.text() and "available" in mw.files_caption.text()

    hub.hub.throttle = 40 << 20  # about 2.5 s for the 98 MB file: progress is seen
    q41 = next(item for q, item in files if q == "Q4_1")
    mw.files.setCurrentItem(q41)
    mw.download_button.click()
    bar = w.models.downloads.status_bar
    qtbot.waitUntil(lambda: bar.isVisible() and "MB/s" in mw.downloads_view.topLevelItem(0).text(1),
                    timeout=30_000)
    assert bar.format().startswith(f"Downloading {Q41[:24]}") and "left" in mw.downloads_view.topLevelItem(0).text(1)
    qtbot.waitUntil(lambda: mw.use_download_button.isEnabled(), timeout=120_000)
    assert not bar.isVisible()
    assert mw.downloads_view.topLevelItem(0).text(1).startswith("Downloaded and checked")
    target = data_dir / "models" / "bartowski--SmolLM2-135M-Instruct-GGUF" / Q41
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(
        hub.hub.repos[SMOL_REPO].files[Q41].read_bytes()).digest()

    mw.tabs.setCurrentWidget(mw.library)
    lib = mw.library
    qtbot.waitUntil(lambda: lib.view.topLevelItemCount() == 2, timeout=30_000)  # and the built-in model
    assert lib.view.topLevelItem(1).text(6) == "Built-in (embedded in Branchwise)"
    item = lib.view.topLevelItem(0)
    assert [item.text(i) for i in range(7)] == ["SmolLM2-135M-Instruct-Q4_1", "Q4_1", fit.gb(target.stat().st_size),
                                                "8,192", "llama", "blocks", "Branchwise"]
    lib.view.setCurrentItem(item)
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        lib.use_button.click()
    assert Path(w.model.good_path) == target
    assert w.status.model_label.text().startswith("\u2068SmolLM2-135M-Instruct-Q4_1\u2069 · ")
    assert first.button.text() == "Find models…" and "SmolLM2-135M-Instruct-Q4_1" in first.label.text()

    lib.ask_remove = lambda model: (True, True)  # "Remove and free its KV blocks"
    with qtbot.waitSignal(lib.removed, timeout=60_000) as removed:
        lib.view.setCurrentItem(lib.view.topLevelItem(0))
        lib.remove_button.click()
    assert removed.args[0] == "SmolLM2-135M-Instruct-Q4_1" and removed.args[1] >= 0
    assert not target.exists()
    qtbot.waitUntil(lambda: lib.view.topLevelItemCount() == 1, timeout=30_000)
    assert lib.view.topLevelItem(0).text(0).endswith("(built-in)")  # the embedded model stays listed


def test_cancel_keeps_the_bytes_and_resume_fetches_only_the_rest(qtbot, open_window, data_dir, hub):
    w = open_window(data_dir, start_engine=False, wait=False)
    mw = w.models.open()
    size = hub.hub.repos[SMOL_REPO].files[Q41].stat().st_size
    part = data_dir / "models" / ".partial" / "bartowski--SmolLM2-135M-Instruct-GGUF" / f"{Q41}.part"
    hub.hub.throttle = 16 << 20
    _open_repo(qtbot, mw, SMOL_REPO)
    mw.files.setCurrentItem(next(item for q, item in _file_items(mw) if q == "Q4_1"))
    mw.download_button.click()
    qtbot.waitUntil(lambda: part.exists() and part.stat().st_size >= 0.3 * size, timeout=60_000)
    mw.cancel_button.click()
    qtbot.waitUntil(lambda: mw.resume_button.isEnabled(), timeout=30_000)
    row = mw.downloads_view.topLevelItem(0).text(1)
    assert row.startswith("Download stopped;") and "kept" in row
    assert not w.models.downloads.status_bar.isVisible()
    kept = part.stat().st_size
    assert 0.3 * size <= kept < size
    hub.hub.throttle = 0
    mw.resume_button.click()
    qtbot.waitUntil(lambda: mw.use_download_button.isEnabled(), timeout=120_000)
    first, second = [e for e in hub.hub.log if e[0] == Q41 and e[3]]
    assert first[1] == 0 and second[1] == kept and second[2] == size - kept  # zero bytes fetched twice


def test_a_gated_repository_asks_for_a_token_stored_0600(qtbot, open_window, data_dir, hub):
    w = open_window(data_dir, start_engine=False, wait=False)
    mw = w.models.open()
    asked = []
    mw.ask_token = lambda repo: asked.append(repo) or "hf_secret"
    _open_repo(qtbot, mw, GATED_REPO)
    assert asked == [GATED_REPO] and [q for q, _ in _file_items(mw)] == ["Q4_1"]
    token = data_dir / "hub-token"
    assert token.read_text().strip() == "hf_secret" and (os.stat(token).st_mode & 0o777) == 0o600


def test_a_chat_reopens_on_its_own_model(qtbot, open_window, data_dir, model_path, tmp_path):
    other = tmp_path / "models" / "Other-135M.Q4_1.gguf"
    other.parent.mkdir()
    shutil.copyfile(model_path, other)
    w = open_window(data_dir)
    first_chat = new_chat(w)
    send_and_wait(qtbot, w, "Hi")
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        w.load_model(str(other))
    second_chat = new_chat(w)
    send_and_wait(qtbot, w, "Hello")
    assert w.store.models.of(first_chat).name == "SmolLM2-135M-Instruct.Q4_1"
    assert w.store.models.of(second_chat).path == str(other)

    bar = w.chat_model.bar
    w.show_conversation(first_chat)
    assert bar.isVisible()
    assert bar.label.text() == ("This chat last ran on \u2068SmolLM2-135M-Instruct.Q4_1\u2069; you are using "
                                "\u2068Other-135M.Q4_1\u2069.")  # names isolated (a U+202E in one stays inside it)
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        bar.switch_button.click()
    assert Path(w.model.good_path) == Path(model_path) and not bar.isVisible()
    assert w.status.model_label.text().startswith("\u2068SmolLM2-135M-Instruct.Q4_1\u2069 · ")

    w.show_conversation(second_chat)
    bar.always.setChecked(True)  # the setting: from now on, switch without asking
    assert w.settings.always_switch_model
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        bar.switch_button.click()
    assert Path(w.model.good_path) == other
    with qtbot.waitSignal(w.model_ready, timeout=LOAD_TIMEOUT_MS):
        w.show_conversation(first_chat)  # switches by itself
    assert Path(w.model.good_path) == Path(model_path) and not bar.isVisible()

    other.unlink()  # the second chat's model is gone: clear words, another model offered, history kept
    w.show_conversation(second_chat)
    assert bar.isVisible() and bar.pick_button.isVisible() and not bar.switch_button.isVisible()
    assert bar.label.text().startswith(f"This chat last ran on \u2068Other-135M.Q4_1\u2069, but its file "
                                       f"\u2068{other}\u2069 is no longer there.")
    assert [m.content for m in w.store.active_path(second_chat)][0] == "Hello"
    assert len(w.transcript.widgets) == 2 and Path(w.model.good_path) == Path(model_path)


def test_a_wrong_hash_is_one_sentence_in_the_window_and_nothing_in_the_library(qtbot, open_window, data_dir, hub):
    w = open_window(data_dir, start_engine=False, wait=False)
    mw = w.models.open()
    hub.hub.wrong_hash = {Q41}
    _open_repo(qtbot, mw, SMOL_REPO)
    mw.files.setCurrentItem(next(item for q, item in _file_items(mw) if q == "Q4_1"))
    mw.download_button.click()
    qtbot.waitUntil(lambda: mw.resume_button.isEnabled(), timeout=120_000)
    row = mw.downloads_view.topLevelItem(0).text(1)
    assert row.startswith(f"{Q41} does not match the hub's SHA-256") and "deleted" in row and "\n" not in row
    assert not mw.use_download_button.isEnabled() and not w.models.downloads.status_bar.isVisible()
    assert not [p for p in (data_dir / "models").rglob("*") if p.is_file()]


def test_a_missing_model_given_with_model_is_named_as_such_and_the_default_loads(qtbot, open_window, data_dir,
                                                                                  tmp_path):
    missing = tmp_path / "nowhere" / "Missing-7B.Q4_K_M.gguf"
    w = open_window(data_dir, model_path=str(missing))
    assert w.banner.text == (f"Model file not found: {missing} (given with --model). Loading the default model "
                             "instead; Model → Open model… chooses another.")
    assert w.model.good_path and Path(w.model.good_path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    label = w.status.model_label.text().replace("\u2068", "").replace("\u2069", "")
    assert label == "SmolLM2-135M-Instruct.Q4_1 · 135M parameters"
