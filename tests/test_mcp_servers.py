"""The MCP client side (app/session/mcp_servers.py) against a test server written with the
SDK (tests/mcp_test_server.py, over stdio): tools listed, a call answered, a hang and a
death named, a 10 MB result bounded, the mcp.json shape read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.session.mcp_servers import MAX_RESULT_BYTES, McpHub, McpServerConfig, bounded_text, servers_from_mcp_json

SERVER = McpServerConfig("testing", sys.executable, (str(Path(__file__).parent / "mcp_test_server.py"),))
WAIT = 120  # the machine is shared: a Python server takes seconds to start under load


@pytest.fixture(scope="module")
def hub():
    h = McpHub(call_timeout_s=4)
    yield h
    h.close()


def test_tools_are_listed_with_their_schemas(hub):
    tools = {t.name: t for t in hub.list_tools(SERVER).result(WAIT)}
    assert set(tools) == {"echo", "hang", "big", "crash"}
    assert tools["echo"].schema["properties"]["text"]["type"] == "string"
    assert tools["echo"].to_openai()["function"]["name"] == "echo"
    assert tools["echo"].server == "testing"


def test_a_call_comes_back_with_its_text_and_duration(hub):
    out = hub.call_tool(SERVER, "echo", {"text": "<b>hi</b>"}).result(WAIT)
    assert out.text == "echo: <b>hi</b>" and out.error is None and out.duration_ms > 0


def test_a_hang_is_named_and_ends_in_the_timeout(hub):
    out = hub.call_tool(SERVER, "hang", {"note": "n"}).result(WAIT)
    assert out.error == "The MCP server 'testing' did not answer the call to hang within 4 s."
    assert out.text == out.error  # what the model gets back


def test_a_death_is_named(hub):
    out = hub.call_tool(SERVER, "crash", {}).result(WAIT)
    assert out.error == "The MCP server 'testing' ended during the call to crash (its connection closed)."


def test_ten_megabytes_enter_the_prompt_cut_to_32_kb():
    roomy = McpHub(call_timeout_s=90)  # 10 MB of JSON takes seconds to cross the pipe under load
    try:
        out = roomy.call_tool(SERVER, "big", {"megabytes": 10}).result(WAIT)
    finally:
        roomy.close()
    assert out.error is None and out.cut_bytes == 10 * 1024 * 1024 - MAX_RESULT_BYTES
    assert len(out.text.encode()) < MAX_RESULT_BYTES + 200 and out.text.endswith("bytes were left out.]")


def test_a_server_that_cannot_start_is_named(hub):
    bad = McpServerConfig("nothing-here", "/nonexistent/mcp-server")
    with pytest.raises(RuntimeError, match="^The MCP server 'nothing-here' failed during the list of its tools"):
        hub.list_tools(bad).result(WAIT)


def test_bounded_text_keeps_whole_characters():
    text, cut = bounded_text("é" * 10, limit=5)
    assert text.startswith("éé\n[The result was cut") and cut == 16


def test_the_mcp_json_shape_is_read():
    servers = servers_from_mcp_json({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp/x"],
                  "env": {"A": "1"}},
        "web": {"url": "http://127.0.0.1:8931/mcp"}}})
    assert [s.name for s in servers] == ["files", "web"]
    assert servers[0].args[0] == "-y" and servers[0].env == {"A": "1"} and servers[1].url.endswith("/mcp")
    assert McpServerConfig.from_dict("files", servers[0].to_dict()) == servers[0]
    with pytest.raises(ValueError, match="needs a \"command\" or a \"url\""):
        servers_from_mcp_json({"mcpServers": {"x": {"args": []}}})
    with pytest.raises(ValueError, match="mcpServers"):
        servers_from_mcp_json({"servers": {}})
