"""Server → Start API server in the real window: ``branchwise serve`` runs as the window's
child process on the window's model and data folder; GET /v1/models answers on loopback
with the key of the settings; the status bar shows the URL; Stop ends it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

import httpx  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from tests.serve_procs import free_port  # noqa: E402

START_TIMEOUT_MS = 300_000


def _settings(data_dir, **values) -> None:
    path = data_dir / "settings.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_start_the_api_server_from_the_menu_and_stop_it(qtbot, open_window, data_dir):
    port = free_port()
    _settings(data_dir, api_port=port, api_key="s3cret-key")
    w = open_window(data_dir, wait=False, start_engine=False)
    start, stop = w.menu_actions["start_api_server"], w.menu_actions["stop_api_server"]
    assert start.isEnabled() and not stop.isEnabled()
    assert not w.status.api_label.isVisible()

    start.trigger()
    assert w.api_server.state == "starting"
    assert "s3cret-key" not in " ".join(w.api_server.argv())  # the key goes in the environment
    qtbot.waitUntil(lambda: w.api_server.state in ("running", "failed"), timeout=START_TIMEOUT_MS)
    assert w.api_server.state == "running", w.api_server.error
    assert w.api_server.url == f"http://127.0.0.1:{port}/v1"
    assert w.status.api_label.text() == f"API: http://127.0.0.1:{port}"
    assert w.status.api_label.isVisible()
    assert stop.isEnabled() and not start.isEnabled()

    denied = httpx.get(f"{w.api_server.url}/models", timeout=30)
    assert denied.status_code == 401
    r = httpx.get(f"{w.api_server.url}/models", headers={"Authorization": "Bearer s3cret-key"}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["SmolLM2-135M-Instruct.Q4_1"]

    with qtbot.waitSignal(w.api_server.state_changed, timeout=START_TIMEOUT_MS,
                          check_params_cb=lambda s: s == "stopped"):
        stop.trigger()
    assert not w.status.api_label.isVisible()
    assert start.isEnabled() and not stop.isEnabled()
    try:
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        refused = False
    except httpx.ConnectError:
        refused = True
    assert refused


def test_a_public_address_without_a_key_is_refused_with_words(qtbot, open_window, data_dir):
    _settings(data_dir, api_host="0.0.0.0", api_key="")
    w = open_window(data_dir, wait=False, start_engine=False)
    w.menu_actions["start_api_server"].trigger()
    assert w.api_server.state == "failed"
    assert "needs an API key" in w.banner.text
    assert w.menu_actions["start_api_server"].isEnabled()


def test_a_port_in_use_fails_with_the_servers_reason(qtbot, open_window, data_dir):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        _settings(data_dir, api_port=busy.getsockname()[1])
        w = open_window(data_dir, wait=False, start_engine=False)
        w.api_server.start()
        qtbot.waitUntil(lambda: w.api_server.state in ("running", "failed"), timeout=START_TIMEOUT_MS)
    assert w.api_server.state == "failed"
    assert w.banner.isVisible() and "did not start" in w.banner.text
    assert "Traceback" not in w.banner.text
    assert not w.status.api_label.isVisible()


def test_the_settings_dialog_sets_address_port_and_key(qtbot, open_window, data_dir):
    from app.window.settings.app_settings import AppSettings

    w = open_window(data_dir, wait=False, start_engine=False)
    assert (w.settings.api_host, w.settings.api_port, w.settings.api_key) == ("127.0.0.1", 8080, "")
    w.open_settings()
    dlg = w.settings_flow.dialog
    tab = next(i for i in range(dlg.tabs.count()) if dlg.tabs.tabText(i) == "API server")
    dlg.tabs.setCurrentIndex(tab)
    assert dlg.api_key.echoMode() == dlg.api_key.EchoMode.Password
    dlg.api_port.setValue(9123)
    qtbot.keyClicks(dlg.api_key, "k-123")
    dlg.accept()
    assert (w.settings.api_port, w.settings.api_key) == (9123, "k-123")
    saved = AppSettings.load(data_dir)
    assert (saved.api_host, saved.api_port, saved.api_key) == ("127.0.0.1", 9123, "k-123")
    assert w.api_server.argv()[w.api_server.argv().index("--port") + 1] == "9123"


def test_the_engine_setting_sends_replies_to_a_server_and_keeps_the_tree_local(qtbot, open_window, data_dir,
                                                                               tmp_path):
    """Settings → Engine: an OpenAI-compatible server (``branchwise serve`` started here). The
    reply equals the server's own answer to the same request; when the server is gone, the
    send shows a banner in words and the user's message stays in the tree."""
    from tests.gui_helpers import new_chat, send_and_wait
    from tests.serve_procs import BranchwiseServe

    (tmp_path / "server").mkdir()
    with BranchwiseServe(tmp_path / "server", "--threads", "1") as server:
        server.start()
        _settings(data_dir, engine_url=server.url)
        w = open_window(data_dir)
        host = server.url.split("//", 1)[1].split("/", 1)[0]
        assert w.status.model_label.text() == f"\u2068SmolLM2-135M-Instruct.Q4_1\u2069 @ \u2068{host}\u2069"
        assert w.settings.recent_models == []  # a server is not a model file to remember
        cid = new_chat(w)
        mid = send_and_wait(qtbot, w, "Name a colour.")
        reply = w.store.get_message(mid)
        assert reply.role == "assistant" and reply.content.strip()
        assert reply.conversation_id == cid
        direct = httpx.post(f"{server.url}/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Name a colour."}],
            "temperature": 0.0, "max_tokens": 24, "seed": 1}).json()
        assert reply.content == direct["choices"][0]["message"]["content"]
    # the server has stopped: the next send fails with a readable banner, the message is kept
    w.composer.input.setPlainText("Still there?")
    with qtbot.waitSignal(w.reply_finished, timeout=120_000):
        qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.banner.isVisible() and w.banner.kind == "error"
    assert host in w.banner.text and "Traceback" not in w.banner.text
    users = [m for m in w.store.branches.path_to(w.store.get_conversation(cid).active_leaf_id) if m.role == "user"]
    assert [m.content for m in users] == ["Name a colour.", "Still there?"]


def test_switching_the_engine_back_to_the_local_model_in_settings(qtbot, open_window, data_dir):
    _settings(data_dir, engine_url="http://127.0.0.1:9/v1", engine_key="k", engine_model="m")
    w = open_window(data_dir, wait=False, start_engine=False)
    w.open_settings()
    dlg = w.settings_flow.dialog
    assert dlg.engine_kind.currentData() == "remote" and dlg.engine_url.isEnabled()
    assert dlg.engine_url.text() == "http://127.0.0.1:9/v1"
    dlg.engine_kind.setCurrentIndex(dlg.engine_kind.findData("local"))
    assert not dlg.engine_url.isEnabled()
    dlg.accept()
    assert (w.settings.engine_url, w.settings.engine_key, w.settings.engine_model) == ("", "", "")
    assert w.settings.remote_engine() is None


def test_an_unreachable_engine_server_says_so_and_offers_settings(qtbot, open_window, data_dir):
    port = free_port()  # nothing listens there
    _settings(data_dir, engine_url=f"http://127.0.0.1:{port}/v1")
    w = open_window(data_dir, wait=False)
    qtbot.waitUntil(lambda: w.model_state in ("ready", "failed", "dead"), timeout=START_TIMEOUT_MS)
    assert w.model_state == "failed"
    assert w.banner.text.startswith("The engine server could not be used.")
    assert f"127.0.0.1:{port}" in w.banner.text and "Traceback" not in w.banner.text
    assert w.banner.button("Settings…") is not None and w.banner.button("Retry") is not None


def test_a_wrong_engine_key_is_a_banner_in_words(qtbot, open_window, data_dir, tmp_path):
    from tests.serve_procs import BranchwiseServe

    (tmp_path / "server").mkdir()
    with BranchwiseServe(tmp_path / "server", "--threads", "1", "--api-key", "right") as server:
        server.start()
        _settings(data_dir, engine_url=server.url, engine_key="k-wrong-7781")
        w = open_window(data_dir, wait=False)
        qtbot.waitUntil(lambda: w.model_state in ("ready", "failed", "dead"), timeout=START_TIMEOUT_MS)
        assert w.model_state == "failed"
        text = w.banner.text
        assert text.startswith("The engine server could not be used.")
        assert "401" in text or "key" in text.lower(), text
        assert "Traceback" not in text and "k-wrong-7781" not in text  # the key itself is never shown
