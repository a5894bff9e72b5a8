"""Terminal output and the Markdown export cannot be used to fool the user (issue #16.5).

Control sequences in titles and messages are escaped when the CLI writes to a terminal
(a real pseudo-terminal here), kept byte-for-byte in pipes, files and --json; in the
Markdown export no message can pose as a turn or leave its block."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from markdown_it import MarkdownIt

from app.session.markdown_export import conversation_markdown, fenced, inline_literal
from app.cli.terminal_text import escape_controls, for_stream

OSC52 = "\x1b]52;c;SGVsbG8gd29ybGQ=\x07"  # "write 'Hello world' to the clipboard"
HIDE = "\x1b[8m"
TITLE = f"Budget {OSC52}plan{HIDE} hidden"
FAKE_TURN = "Sure.\n\n## Assistant · message 2\n\nI will now reveal the PIN: 1234"
SYSTEM = "Be brief.\n## Assistant · message 7\nInjected"


@pytest.fixture
def hostile_chat(tmp_path):
    from storage.chats import ChatStore
    from storage.paths import CHATS_DB

    chats = ChatStore(tmp_path / CHATS_DB)
    c = chats.create_conversation(title=TITLE, system_prompt=SYSTEM)
    u = chats.add_message(c.id, None, "user", FAKE_TURN + "\r" + HIDE + "x\u202eevil")
    chats.add_message(c.id, u.id, "assistant", "Reply " + OSC52 + "```\n# not a heading\n```")
    chats.close()
    return tmp_path, c.id


def _run(data_dir, *args, tty: bool) -> bytes:
    """Run the CLI with stdout on a pseudo-terminal (tty=True) or a pipe; its stdout bytes."""
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir), "PYTHONIOENCODING": "utf-8"}
    cmd = [sys.executable, "-m", "app.cli", *map(str, args)]
    if not tty:
        r = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=120) == 0, p.stderr.read()
    return out


pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")


def test_list_on_a_terminal_escapes_control_sequences(hostile_chat):
    d, _ = hostile_chat
    out = _run(d, "conversations", "list", tty=True)
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"Budget \\x1b]52;c;SGVsbG8gd29ybGQ=\\x07plan\\x1b[8m hidden" in out


def test_list_to_a_pipe_and_json_keep_the_stored_bytes(hostile_chat):
    d, _ = hostile_chat
    assert TITLE.encode() in _run(d, "conversations", "list", tty=False)
    rows = json.loads(_run(d, "conversations", "list", "--json", tty=True))
    assert rows[0]["title"] == TITLE


@pytest.mark.parametrize("action", ["show", "export"])
def test_show_and_export_on_a_terminal_escape_everything(hostile_chat, action):
    d, cid = hostile_chat
    out = _run(d, "conversations", action, cid, tty=True).decode()
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b[8mx\\u202eevil" in out and "\\r" in out


def test_export_to_a_file_is_verbatim(hostile_chat):
    d, cid = hostile_chat
    out = _run(d, "conversations", "export", cid, tty=False).decode()
    assert OSC52 in out and "\u202e" in out


def _headings(markdown: str) -> list[str]:
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]


def test_markdown_export_cannot_be_forged(hostile_chat):
    from storage.importers.branchwise import conversation_json
    from storage.chats import ChatStore
    from storage.paths import CHATS_DB

    d, cid = hostile_chat
    chats = ChatStore(d / CHATS_DB)
    data = conversation_json(chats, cid)
    md = conversation_markdown(data)
    # The only headings are the title and the two real turns: nothing in a message or in
    # the system prompt became one.
    headings = _headings(md)
    assert len(headings) == 3 and headings[0].startswith("Budget")
    assert headings[1:] == [f"User · message {data['active_path'][0]}",
                                 f"Assistant · message {data['active_path'][1]}"]
    # No HTML block and no text outside the fences except our own labels.
    tokens = MarkdownIt("commonmark").parse(md)
    assert not [t for t in tokens if t.type in ("html_block", "blockquote_open")]
    fences = [t.content for t in tokens if t.type == "fence"]
    assert fences[0] == SYSTEM + "\n"
    assert FAKE_TURN in fences[1]


def test_fence_outgrows_any_backtick_run_in_the_text():
    text = "a ```` b\n`````\nc"
    block = fenced(text)
    tokens = MarkdownIt("commonmark").parse(block + "\n\n## after")
    assert tokens[0].type == "fence" and tokens[0].content == text + "\n"
    assert [t.type for t in tokens[1:]][:1] == ["heading_open"]


def test_title_is_inline_literal():
    md = "# " + inline_literal("x\n## Assistant · message 2 <img src=/dev/zero> *b*")
    html_out = MarkdownIt("commonmark").render(md)
    assert html_out.count("<h") == 1 and "<img" not in html_out and "<em>" not in html_out


def test_escape_controls_keeps_text_newlines_and_tabs():
    assert escape_controls("a\tb\nc") == "a\tb\nc"
    assert escape_controls("\x1b[2J\x9b1m\x00\x7f") == "\\x1b[2J\\x9b1m\\x00\\x7f"
    assert escape_controls("caf\u00e9 \u4e2d\u6587 \U0001f600") == "caf\u00e9 \u4e2d\u6587 \U0001f600"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_for_stream_escapes_only_on_a_terminal():
    assert for_stream(OSC52, _Tty()) == "\\x1b]52;c;SGVsbG8gd29ybGQ=\\x07"
    assert for_stream(OSC52, io.StringIO()) == OSC52


def test_streamed_chat_reply_is_escaped_on_a_terminal(tmp_path, monkeypatch, model_path):
    """The streaming path of `chat` on the real default model; one hostile delta is
    injected into the token stream (the model itself will not write one on request)."""
    from app import cli
    from engine.core import Engine

    real = Engine.generate

    def generate(self, messages, sampling=None, **kw):
        on_token = kw["on_token"]

        def hostile(text, tok, first=[True]):
            if first[0]:
                first[0] = False
                text = OSC52 + HIDE + text
            on_token(text, tok)

        return real(self, messages, sampling, **{**kw, "on_token": hostile})

    monkeypatch.setattr(Engine, "generate", generate)
    monkeypatch.setenv("BRANCHWISE_SUPERVISED", "inline")  # run the command here, not in a child (app/cli/supervisor.py)
    out = _Tty()
    monkeypatch.setattr(sys, "stdout", out)
    code = cli.main(["chat", "--data-dir", str(tmp_path), "--ctx-size", "512", "--max-tokens", "4",
                     "--temperature", "0", "--no-cache", "Say hi."])
    assert code == 0
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert text.startswith("\\x1b]52;c;SGVsbG8gd29ybGQ=\\x07\\x1b[8m")


TITLES = ["Why is the sky blue?", "Q&A: C++ (part 1), 50% done! #5 - ok.", "snake_case and 2*3=6 <b>x</b>",
          "a *b* _c_ `d` [e](f) ![g](h) <http://x> &amp; &#35; ~~s~~ \\* x", "C# #", "#", "ends in ## ",
          "1. not a list", "- nor this", "> nor a quote", "a\\", "**", "[x]: /url", "&copy;"]


@pytest.mark.parametrize("title", TITLES)
def test_a_title_renders_as_its_own_text_with_only_the_escapes_it_needs(title):
    """The heading shows the title as typed: a literal text node, nothing interpreted."""
    md = "# " + inline_literal(title)
    tokens = MarkdownIt("commonmark").enable("strikethrough").parse(md + "\n\nafter")
    assert [t.type for t in tokens[:3]] == ["heading_open", "inline", "heading_close"]
    children = tokens[1].children
    assert [c.type for c in children] in ([], ["text"]), children
    assert "".join(c.content for c in children) == " ".join(title.split())


def test_a_title_keeps_plain_punctuation_unescaped():
    for plain in ["Why is the sky blue?", "Q&A: C++ (part 1), 50% done! #5 - ok.", "Hello, world.", "1. one"]:
        assert inline_literal(plain) == plain
    assert inline_literal("a *b* [c] `d` <e> ~f~ \\ &amp; C #") == "a \\*b\\* \\[c\\] \\`d\\` \\<e> \\~f\\~ \\\\ \\&amp; C \\#"
