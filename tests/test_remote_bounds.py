"""The remote engine (``--engine-url``) against hostile servers on 127.0.0.1: a line that
never ends, an endless stream, keep-alives forever, a reply that never finishes, a web
page, a redirect, a malformed chunk. Each ends in one line, and the client's memory
stays small (getrusage of the client process; not wall-clock time)."""

from __future__ import annotations

import json
import socketserver
import threading
import time

import pytest
from measure import PEAK_RSS_LIMIT_KB, one_line, run_measured

STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
CAP_BYTES = 64 * 1024 * 1024  # what a scenario sends at most (the client must stop far earlier)


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def _long_line(w):
    w(STREAM_HEAD + b"data: ")
    piece = b"a" * 65536
    for _ in range(CAP_BYTES // len(piece)):
        w(piece)


def _endless(w):
    w(STREAM_HEAD)
    for _ in range(CAP_BYTES // 60):
        w(_chunk("word "))


def _keepalives(w):
    w(STREAM_HEAD + _chunk("Hello"))
    for _ in range(600):
        w(b": ping\n\n")
        time.sleep(0.05)


def _slow(w):
    w(STREAM_HEAD)
    for _ in range(600):
        w(_chunk("x"))
        time.sleep(0.05)


def _html(w):
    w(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n\r\n"
      b"<!DOCTYPE html><html><body>Log in to the Wi-Fi</body></html>")


def _html_untyped(w):
    w(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n<html><body>hi</body></html>\n")


def _redirect(w):
    w(b"HTTP/1.1 302 Found\r\nLocation: http://example.invalid/v1/chat/completions\r\nContent-Length: 0\r\n"
      b"Connection: close\r\n\r\n")


def _choices_5(w):
    w(STREAM_HEAD + _chunk("Hi") + b'data: {"choices":5}\n\n')


def _huge_error(w):
    w(b"HTTP/1.1 500 Oops\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"error\": \"")
    for _ in range(CAP_BYTES // 65536):
        w(b"e" * 65536)


def _lone_surrogates(w):  # JSON "\ud800": a UTF-16 half with no pair, which UTF-8 cannot hold
    delta = [{"reasoning_content": "think \ud800"}, {"content": "Hello "}, {"content": "\udfff world"}]
    w(STREAM_HEAD + b"".join(b"data: " + json.dumps({"choices": [{"index": 0, "delta": d}]}).encode() + b"\n\n"
                             for d in delta)
      + b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


SCENARIOS = {f.__name__.lstrip("_"): f for f in (_long_line, _endless, _keepalives, _slow, _html, _html_untyped,
                                                 _redirect, _choices_5, _huge_error, _lone_surrogates)}


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        data = b""
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                return
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += sock.recv(65536)
        try:
            SCENARIOS[self.server.scenario](sock.sendall)
        except OSError:  # the client hung up: what it should do
            pass


class HostileServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, scenario: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scenario = scenario
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


def chat(tmp_path, server, *extra):
    return run_measured(tmp_path, "chat", "--engine-url", server.url, "--engine-model", "m", *extra,
                        "Tell me a story")


def test_a_line_without_an_end_is_cut_at_one_mib(tmp_path):
    with HostileServer("long_line") as server:
        r, peak_kb = chat(tmp_path, server)
    assert r.returncode == 1
    line = one_line(r)
    assert "The server at 127.0.0.1:" in line and "sent a line longer than 1 MiB" in line, line
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb


def test_max_tokens_is_counted_here_against_an_endless_stream(tmp_path):
    with HostileServer("endless") as server:
        r, peak_kb = chat(tmp_path, server, "--json", "--max-tokens", "20")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == "word " * 20
    assert out["stats"]["finish_reason"] == "length" and out["stats"]["generated_tokens"] == 20
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb


ENGINE_SCRIPT = """
import sys
from engine.chat_template import ChatMessage
from engine.remote import RemoteEngine, RemoteEngineError
from engine.settings import SamplingParams
e = RemoteEngine(sys.argv[1], model="m", timeout_s=float(sys.argv[2]), deadline_s=float(sys.argv[3]))
try:
    e.generate([ChatMessage("user", "hi")], SamplingParams(max_tokens=100000))
except RemoteEngineError as exc:
    print(f"{exc} | partial={exc.partial!r}", file=sys.stderr)
    sys.exit(1)
"""


def test_keep_alives_are_no_progress(tmp_path):
    with HostileServer("keepalives") as server:
        r, peak_kb = run_measured(tmp_path, server.url, "1", "600", python=ENGINE_SCRIPT)
    assert r.returncode == 1
    assert "sent nothing but keep-alives for 1 s, so the request was ended; the partial reply is kept" \
        in one_line(r) and "partial='Hello'" in r.stderr
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb


def test_a_reply_that_never_finishes_meets_the_deadline(tmp_path):
    with HostileServer("slow") as server:
        r, _ = run_measured(tmp_path, server.url, "60", "2", python=ENGINE_SCRIPT)
    assert r.returncode == 1
    assert "did not finish the reply within 2 s, so the request was ended" in one_line(r)
    assert "partial='xx" in r.stderr


@pytest.mark.parametrize("scenario, words", [
    ("html", "answered with an HTML page, not an OpenAI-compatible stream"),
    ("html_untyped", "answered with an HTML page, not an OpenAI-compatible stream"),
    ("redirect", "redirected to http://example.invalid/v1/chat/completions (302); Branchwise does not follow "
                 "redirects"),
    ("choices_5", "sent an event that is not an OpenAI chat-completion chunk ('choices' is a number, not a list)"),
    ("huge_error", "refused the request (500)"),
])
def test_wrong_answers_get_their_own_words(tmp_path, scenario, words):
    with HostileServer(scenario) as server:
        r, peak_kb = chat(tmp_path, server)
    assert r.returncode == 1
    line = one_line(r)
    assert words in line and "mid-reply" not in line, line
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb



def test_lone_surrogates_from_the_server_become_replacement_characters(tmp_path):
    """A server streaming "\ud800" in content or reasoning_content made the turn fail with
    "'utf-8' codec can't encode character" after the reply streamed ("saved": null, an
    empty stopped reply stored, the text lost). They become U+FFFD and the reply is saved."""
    with HostileServer("lone_surrogates") as server:
        r, _ = chat(tmp_path, server, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["text"], out["reasoning"]) == ("Hello \ufffd world", "think \ufffd")
    assert out["saved"]["reply"] is True
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "data" / "chats.sqlite3") as chats:
        reply = chats.get_message(out["assistant_message_id"])
    assert (reply.content, reply.reasoning, reply.status) == ("Hello \ufffd world", "think \ufffd", "complete")
