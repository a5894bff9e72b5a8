"""The window's tool loop over an MCP server (issue #28, item 4), offscreen, on a copy of the
default model with Qwen3's chat template (as tests/test_serve_tools.py makes it). The model
does not call tools by itself: Settings require the first step to be a call, sampled under
the schema grammar; the server is tests/mcp_test_server.py (the SDK, over stdio)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gui_helpers import REPLY_TIMEOUT_MS, new_chat
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.session.mcp_servers import McpHub
from app.window.flows.tool_approval import Approval
from app.window.flows.tool_flow import DENIED
from test_mcp_servers import running_servers  # this process's test-server children

SERVER_SCRIPT = str(Path(__file__).parent / "mcp_test_server.py")
TOOLS = {
    "echo": {"name": "echo", "description": "Answer the text back.",
             "schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    "hang": {"name": "hang", "description": "Sleep for ten minutes.",
             "schema": {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}},
    "crash": {"name": "crash", "description": "End the server.", "schema": {"type": "object", "properties": {}}},
}
SAMPLING = {"max_tokens": 60}
TOOL_TIMEOUT_MS = 240_000  # a Python MCP server takes seconds to start on a loaded machine


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory, model_path) -> Path:
    from tools.tool_loop_bench import tool_model as qwen3_copy

    return qwen3_copy(tmp_path_factory.mktemp("tool-model"), model_path)


def servers(*enabled: str) -> dict:
    """settings.json's ``mcp_servers``: the test server with only ``enabled`` switched on."""
    return {"testing": {"command": sys.executable, "args": [SERVER_SCRIPT], "env": {},
                        "tools": list(TOOLS.values()), "disabled_tools": [t for t in TOOLS if t not in enabled]}}


@pytest.fixture
def tool_window(open_window, data_dir, tool_model):
    def _open(*enabled: str, model: Path = tool_model, fmt: str = "hermes", **settings):
        (data_dir / "settings.json").write_text(json.dumps(
            {"mcp_servers": servers(*enabled), "mcp_first_call_required": True, **settings}))
        w = open_window(data_dir, model_path=str(model))
        assert w.model.facts["tool_format"] == fmt
        return w
    return _open


def where() -> str:
    """The test server's command line as Settings and the question show it."""
    return f"{sys.executable} {SERVER_SCRIPT}"


def answer_with(flow, first: Approval, later: Approval = Approval.DENY) -> list:
    """Answer the first question with ``first`` and any later one with ``later``; returns
    the dialogs asked."""
    asked = []

    def on_asked(dialog):
        asked.append(dialog)
        dialog.buttons[first if len(asked) == 1 else later].click()
    flow.asked.connect(on_asked)
    return asked


def send(qtbot, w, text: str) -> None:
    w.composer.input.setPlainText(text)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)


def settled(w) -> bool:
    """No reply streams, no call is asked or runs, and the branch ends on an answer without calls."""
    if w.chat.streaming or w.chat.tools.busy or not w.chat.conversation_id:
        return False
    leaf = w.store.get_conversation(w.chat.conversation_id).active_leaf_id
    m = w.store.get_message(leaf) if leaf else None
    return m is not None and m.role == "assistant" and m.status != "streaming" and not (m.tool or {}).get("tool_calls")


def loop_over(qtbot, w) -> None:
    qtbot.waitUntil(lambda: settled(w), timeout=REPLY_TIMEOUT_MS + TOOL_TIMEOUT_MS)


def active_path(w) -> list:
    conv = w.store.get_conversation(w.chat.conversation_id)
    return w.store.branches.path_to(conv.active_leaf_id)


def test_allow_once_runs_the_call_and_the_answer_follows_then_a_branch_at_the_tool_step(qtbot, tool_window):
    w = tool_window("echo")
    new_chat(w, SAMPLING)
    asked = answer_with(w.chat.tools, Approval.ONCE)
    send(qtbot, w, "Echo the word hello.")
    loop_over(qtbot, w)
    first = asked[0]
    assert first.question.text() == "The model wants to call the tool “\u2068echo\u2069” of the MCP server “\u2068testing\u2069”."
    assert first.question.textFormat() == Qt.TextFormat.PlainText and SERVER_SCRIPT in first.where.text()
    assert '"text"' in first.arguments.toPlainText()
    path = active_path(w)
    user, call, result = path[0], path[1], path[2]
    assert [m.role for m in path[:3]] == ["user", "assistant", "tool"] and path[-1].role == "assistant"
    (tc,) = call.tool["tool_calls"]
    assert tc["function"]["name"] == "echo" and "<tool_call>" not in call.content
    said = json.loads(tc["function"]["arguments"])["text"]
    assert result.content == f"echo: {said}" and result.tool["tool_call_id"] == tc["id"]
    assert result.tool["server"] == "testing" and result.tool["error"] is None and result.tool["duration_ms"] > 0
    assert path[-1].content.strip()  # the final answer, written after the result
    block = w.transcript.widget_for(result.id).tool_block
    assert block.header.text().startswith("Tool \u2068echo\u2069 · \u2068testing\u2069 · ") and block.details.isHidden()
    block.header.click()
    assert not block.details.isHidden() and f"echo: {said}" in block.details.text()
    assert not block.details.acceptRichText() and block.details.isReadOnly()  # plain text, never HTML

    # a branch at the tool step: another answer under the same result, its prompt holds the step
    final = path[3]
    prompt = w.chat.session.prompt(result.id)
    assert [m.role for m in prompt] == ["user", "assistant", "tool"]
    assert prompt[1].tool_calls[0]["id"] == tc["id"] and prompt[2].tool_call_id == tc["id"]
    with qtbot.waitSignal(w.reply_finished, timeout=REPLY_TIMEOUT_MS):
        w.chat.regenerate(final.id)
    siblings = w.store.branches.siblings(final.id)
    assert len(siblings) == 2 and {s.parent_id for s in siblings} == {result.id}
    assert user.id == path[0].id


def test_a_denied_call_tells_the_model_and_nothing_runs(qtbot, tool_window):
    w = tool_window("echo")
    new_chat(w, SAMPLING)
    asked = answer_with(w.chat.tools, Approval.DENY)
    send(qtbot, w, "Echo the word hello.")
    loop_over(qtbot, w)
    assert len(asked) >= 1
    path = active_path(w)
    result = path[2]
    assert result.role == "tool" and result.content == DENIED and result.tool["error"] == DENIED
    assert w.chat.tools.hub is not None and result.tool["duration_ms"] == 0.0  # it never ran
    assert path[-1].role == "assistant" and path[-1].id != path[1].id


def test_stop_while_a_tool_runs_ends_the_loop(qtbot, tool_window):
    w = tool_window("hang")
    new_chat(w, SAMPLING)
    answer_with(w.chat.tools, Approval.ONCE)
    send(qtbot, w, "Wait a little.")
    qtbot.waitUntil(lambda: w.chat.tools.busy and w.chat.tools.dialog is None, timeout=REPLY_TIMEOUT_MS)
    assert w.composer.button.text() == "Stop"
    w.activateWindow()  # the question's dialog had the keyboard
    qtbot.waitUntil(lambda: QApplication.activeWindow() is w, timeout=10_000)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Escape)  # Esc: Stop reply
    assert not w.chat.tools.busy and w.composer.button.text() == "Send"
    qtbot.wait(500)
    path = active_path(w)
    assert [m.role for m in path] == ["user", "assistant"] and path[1].tool["tool_calls"]
    assert not w.chat.streaming  # no next step started


def test_esc_in_the_question_stops_the_loop(qtbot, tool_window):
    w = tool_window("echo")
    new_chat(w, SAMPLING)
    send(qtbot, w, "Echo hello.")
    with qtbot.waitSignal(w.chat.tools.asked, timeout=REPLY_TIMEOUT_MS) as blocker:
        pass
    qtbot.keyClick(blocker.args[0], Qt.Key.Key_Escape)
    assert not w.chat.tools.busy and w.chat.tools.dialog is None
    assert [m.role for m in active_path(w)] == ["user", "assistant"]


@pytest.mark.parametrize(("tool", "error"), [
    ("hang", "The MCP server 'testing' did not answer the call to hang within 3 s; see its log {log}."),
    ("crash", "The MCP server 'testing' ended during the call to crash (its connection closed); see its log {log}."),
])
def test_a_server_that_hangs_or_dies_is_named_and_the_model_gets_the_error(qtbot, tool_window, tool, error):
    w = tool_window(tool)
    log = w.chat.tools.log_path
    assert log == w.data_dir / "logs" / "mcp-servers.log"
    error = error.format(log=log)
    w.chat.tools.hub = McpHub(call_timeout_s=3, errlog=log)
    new_chat(w, SAMPLING)
    answer_with(w.chat.tools, Approval.ONCE)
    send(qtbot, w, "Use the tool.")
    loop_over(qtbot, w)
    result = active_path(w)[2]
    assert result.role == "tool" and result.content == error and result.tool["error"] == error
    assert w.transcript.widget_for(result.id).tool_block.header.text().endswith(" · failed")


def test_settings_import_mcp_json_list_tools_switch_one_off_and_save(qtbot, open_window, data_dir, tmp_path):
    from PySide6.QtWidgets import QDialogButtonBox

    w = open_window(data_dir)
    mcp_json = tmp_path / "mcp.json"
    mcp_json.write_text(json.dumps({"mcpServers": {
        "testing": {"command": sys.executable, "args": [SERVER_SCRIPT], "env": {"X": "1"}},
        "remote": {"url": "http://127.0.0.1:9/mcp"}}}))
    w.open_settings()
    dlg = w.settings_flow.dialog
    tab = dlg.tools_tab
    assert [dlg.tabs.tabText(i) for i in range(dlg.tabs.count())][-1] == "Tools"
    with qtbot.waitSignals([tab.listed, tab.listed], timeout=TOOL_TIMEOUT_MS):
        assert tab.import_file(mcp_json) == 2
    qtbot.waitUntil(lambda: len(tab.entries["testing"]["tools"]) == 4, timeout=TOOL_TIMEOUT_MS)
    top = tab.tree.topLevelItem(0)
    assert top.text(0) == "testing" and SERVER_SCRIPT in top.text(1)
    names = [top.child(i).text(0) for i in range(top.childCount())]
    assert sorted(names) == ["big", "crash", "echo", "hang"]
    top.child(names.index("crash")).setCheckState(0, Qt.CheckState.Unchecked)
    assert tab.entries["remote"]["tools"] == []  # nothing listens there: named, not frozen
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    saved = json.loads((data_dir / "settings.json").read_text())
    assert (data_dir / "settings.json").stat().st_mode & 0o777 == 0o600
    entry = saved["mcp_servers"]["testing"]
    assert entry["command"] == sys.executable and entry["args"] == [SERVER_SCRIPT] and entry["env"] == {"X": "1"}
    assert entry["disabled_tools"] == ["crash"] and saved["mcp_servers"]["remote"]["url"].endswith("/mcp")
    assert sorted(t.name for t in w.chat.tools.tools()) == ["big", "echo", "hang"]
    assert not w.chat.tools.active()  # the default model's template has no tool support
    assert w.chat.tools.request_args([]) == {}
    # removed in Settings: its process ends when the dialog is saved, not at the window's close
    (pid,) = [p.pid for p in w.chat.tools.hub.processes()]
    w.open_settings()
    dlg = w.settings_flow.dialog
    dlg.tools_tab.tree.setCurrentItem(dlg.tools_tab.tree.topLevelItem(0))
    dlg.tools_tab.remove_button.click()
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert "testing" not in json.loads((data_dir / "settings.json").read_text())["mcp_servers"]
    qtbot.waitUntil(lambda: pid not in running_servers(), timeout=TOOL_TIMEOUT_MS)


def test_the_status_names_a_server_that_cannot_be_reached(qtbot, open_window, data_dir):
    from app.session.mcp_servers import McpServerConfig

    w = open_window(data_dir)
    w.open_settings()
    tab = w.settings_flow.dialog.tools_tab
    with qtbot.waitSignal(tab.listed, timeout=TOOL_TIMEOUT_MS):
        tab.add_server(McpServerConfig("ghost", "/nonexistent/mcp-server"))
    assert tab.status.text().startswith("The MCP server 'ghost' failed during the list of its tools")
    assert tab.status.textFormat() == Qt.TextFormat.PlainText


def test_always_for_this_tool_asks_no_more_for_it(qtbot, tool_window):
    w = tool_window("echo")
    new_chat(w, SAMPLING)
    asked = answer_with(w.chat.tools, Approval.ALWAYS, Approval.ALWAYS)
    send(qtbot, w, "Echo the word hello.")
    loop_over(qtbot, w)
    assert len(asked) == 1 and w.chat.tools.always == {("testing", "echo")}
    first_results, before = [m for m in active_path(w) if m.role == "tool"], len(active_path(w))
    send(qtbot, w, "Echo the word again.")
    qtbot.waitUntil(lambda: len(active_path(w)) > before + 1, timeout=REPLY_TIMEOUT_MS)
    loop_over(qtbot, w)
    results = [m for m in active_path(w) if m.role == "tool"]
    assert len(asked) == 1 and len(results) > len(first_results)  # it ran without asking
    assert results[-1].content.startswith("echo: ") and results[-1].tool["error"] is None
    # kept in settings.json with the command line it was allowed for
    saved = json.loads((w.data_dir / "settings.json").read_text())
    assert saved["mcp_always_allow"] == {"testing": {"echo": where()}}
    # one server process answered both loops, the later call over its open connection
    assert len(running_servers()) == 1
    assert results[-1].tool["duration_ms"] < 1000, [r.tool["duration_ms"] for r in results]


def test_always_allow_survives_a_restart_and_a_changed_command_line_asks_again(qtbot, tool_window, data_dir):
    w = tool_window("echo")
    new_chat(w, SAMPLING)
    asked = answer_with(w.chat.tools, Approval.ALWAYS)
    send(qtbot, w, "Echo the word hello.")
    loop_over(qtbot, w)
    assert len(asked) == 1
    w.close()  # the window's end: its server ends too, within the bound
    qtbot.waitUntil(lambda: not running_servers(), timeout=10_000)

    settings = json.loads((data_dir / "settings.json").read_text())
    w2 = tool_window("echo", mcp_always_allow=settings["mcp_always_allow"])
    assert w2.chat.tools.always == {("testing", "echo")}
    new_chat(w2, SAMPLING)
    asked2 = answer_with(w2.chat.tools, Approval.DENY)
    send(qtbot, w2, "Echo the word again.")
    loop_over(qtbot, w2)
    results = [m for m in active_path(w2) if m.role == "tool"]
    assert asked2 == [] and results and results[0].content.startswith("echo: ")
    w2.close()

    w3 = tool_window("echo", mcp_always_allow={"testing": {"echo": f"{sys.executable} /elsewhere/server.py"}})
    assert w3.chat.tools.always == set()
    new_chat(w3, SAMPLING)
    asked3 = answer_with(w3.chat.tools, Approval.DENY)
    send(qtbot, w3, "Echo the word once more.")
    loop_over(qtbot, w3)
    assert len(asked3) == 1  # the command line changed: it asks again


def test_settings_show_the_tools_always_allowed_and_revoke_one(qtbot, open_window, data_dir):
    from PySide6.QtWidgets import QDialogButtonBox

    (data_dir / "settings.json").write_text(json.dumps({
        "mcp_servers": servers("echo"),
        "mcp_always_allow": {"testing": {"echo": where(), "hang": "/old/command"}}}))
    w = open_window(data_dir)
    w.open_settings()
    dlg = w.settings_flow.dialog
    tab = dlg.tools_tab
    assert tab.hub is w.chat.tools.hub  # one set of connections for the window
    shown = [tab.allowed.item(i).text() for i in range(tab.allowed.count())]
    assert shown == [f"echo · testing · {where()}",
                     "hang · testing · /old/command (asks again: its command line changed)"]
    tab.allowed.setCurrentRow(0)
    tab.revoke_button.click()
    assert [tab.allowed.item(i).text() for i in range(tab.allowed.count())] == [shown[1]]
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    saved = json.loads((data_dir / "settings.json").read_text())
    assert saved["mcp_always_allow"] == {"testing": {"hang": "/old/command"}}
    assert w.chat.tools.always == set()


MISTRAL_TEMPLATE = Path(__file__).parent / "data" / "tool_templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
TOOL_CALLS_ID = 16  # SmolLM2's unused control token <empty_output>, renamed [TOOL_CALLS] in the copy


@pytest.fixture(scope="module")
def mistral_model(tmp_path_factory, model_path) -> Path:
    """The default model with Mistral Nemo's template, ``[TOOL_CALLS]`` one control token (as
    in Mistral's own vocabularies): the reply's text leaves it out."""
    from tools.tool_loop_bench import tool_model as template_copy

    return template_copy(tmp_path_factory.mktemp("mistral-model"), model_path, MISTRAL_TEMPLATE,
                         {TOOL_CALLS_ID: "[TOOL_CALLS]"})


def test_a_mistral_call_whose_marker_is_a_control_token_runs(qtbot, tool_window, mistral_model, monkeypatch):
    """The calls are read from the reply's token ids with control tokens shown (as serve
    reads them); the reply's text alone holds no ``[TOOL_CALLS]``."""
    import engine.tool_grammar

    made = engine.tool_grammar.tool_call_grammar

    def forcing_the_token(*args, **kwargs):  # the grammar's literal as the control token itself
        grammar = made(*args, **kwargs)
        assert '"[TOOL_CALLS]["' in grammar
        return grammar.replace('"[TOOL_CALLS]["', f'<[{TOOL_CALLS_ID}]> "["')
    monkeypatch.setattr(engine.tool_grammar, "tool_call_grammar", forcing_the_token)
    w = tool_window("echo", model=mistral_model, fmt="mistral")
    new_chat(w, SAMPLING)
    asked = answer_with(w.chat.tools, Approval.ONCE)
    texts = []  # each saved reply's text as the engine sent it, and with control tokens shown
    w.chat.reply_finished.connect(lambda _mid: texts.append((w.chat.last_done.text, w.chat.last_done.tool_text)))
    send(qtbot, w, "Echo the word hello.")
    loop_over(qtbot, w)
    assert len(asked) == 1 and asked[0].question.text().startswith("The model wants to call the tool “\u2068echo\u2069”")
    path = active_path(w)
    call, result = path[1], path[2]
    assert [m.role for m in path[:3]] == ["user", "assistant", "tool"]
    assert call.token_ids[0] == TOOL_CALLS_ID  # the grammar made the marker the control token
    shown, with_controls = texts[0]
    assert shown.startswith("[{") and "[TOOL_CALLS]" not in shown and with_controls == "[TOOL_CALLS]" + shown
    (tc,) = call.tool["tool_calls"]
    said = json.loads(tc["function"]["arguments"])["text"]
    assert tc["function"]["name"] == "echo" and call.content == ""
    assert result.content == f"echo: {said}" and result.tool["tool_call_id"] == tc["id"]
    assert path[-1].role == "assistant" and path[-1].id != call.id
