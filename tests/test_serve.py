"""``branchwise serve`` through the real ``openai`` client (and raw HTTP for malformed
requests), started by the tests on a free loopback port. No protocol mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from serve_procs import BranchwiseServe

STORY = ("The river town kept its bridges in good repair, and every spring the mayor walked "
         "across each one to count the loose stones. ") * 10
COUNT = "Count from 1 to 400, one number per line, with nothing else."


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=600,
                         http_client=httpx.Client(trust_env=False))


@pytest.fixture(scope="module")
def serve_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def server(serve_dir):
    with BranchwiseServe(serve_dir, "--threads", "2") as s:
        yield s.start()


def test_models_and_a_non_streaming_reply(server):
    c = client(server.url)
    assert [m.id for m in c.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]
    r = c.chat.completions.create(model="anything", temperature=0, max_tokens=12,
                                  messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.object == "chat.completion" and r.model == "SmolLM2-135M-Instruct.Q4_1"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 10 and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert 0 <= u.prompt_tokens_details.cached_tokens < u.prompt_tokens


def test_streaming_gives_the_same_reply_and_usage(server):
    c = client(server.url)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three colours."}]
    whole = c.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=20)
    chunks = list(c.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=20,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content and text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # the same prompt again: all of it but the last 2 tokens comes from the live context/store
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 2


def test_stop_sequences_cut_the_reply(server):
    c = client(server.url)
    args = dict(model="m", messages=[{"role": "user", "content": COUNT}], temperature=0, max_tokens=40)
    full = c.chat.completions.create(**args).choices[0].message.content
    assert "\n3" in full, full
    cut = c.chat.completions.create(**args, stop=["\n3"])
    assert cut.choices[0].message.content == full[: full.index("\n3")]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(**args, stop="\n3", stream=True) if ch.choices)
    assert streamed == cut.choices[0].message.content


def test_resent_history_is_restored_also_after_a_restart(serve_dir, server):
    c = client(server.url)
    history = [{"role": "system", "content": "You answer briefly."},
               {"role": "user", "content": STORY + "How often did the mayor count the stones?"}]
    first = c.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=24)
    reply = first.choices[0].message.content
    assert first.usage.prompt_tokens > 250
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    second = c.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=24)
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= earlier - 1  # the whole earlier turn (its last generated token was never evaluated)
    assert second.usage.prompt_tokens - cached < 20  # only the new message and its template tokens

    # A new server process on the same data folder: the store (and the reply's ids) persist.
    history += [{"role": "assistant", "content": second.choices[0].message.content},
                {"role": "user", "content": "Thank you."}]
    with BranchwiseServe(serve_dir, "--threads", "2", log_path=serve_dir / "restart.log") as again:
        third = client(again.start().url).chat.completions.create(model="m", messages=history, temperature=0,
                                                                  max_tokens=8)
    cached = third.usage.prompt_tokens_details.cached_tokens
    assert cached >= second.usage.prompt_tokens + second.usage.completion_tokens - 1
    assert third.usage.prompt_tokens - cached < 20


def test_temperature_zero_equals_chat_no_cache(server, tmp_path):
    question = "Explain in two sentences why bridges need repair."
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--no-cache", "--json", "--temperature", "0",
                        "--max-tokens", "40", "--system", "You are a civil engineer.", question],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    local = json.loads(r.stdout)["text"]
    served = client(server.url).chat.completions.create(
        model="m", temperature=0, max_tokens=40,
        messages=[{"role": "system", "content": "You are a civil engineer."}, {"role": "user", "content": question}])
    assert served.choices[0].message.content == local and local


def test_a_disconnect_mid_stream_cancels_the_generation(server):
    c = client(server.url)
    stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": COUNT + " Begin."}],
                                       temperature=0, max_tokens=1500, stream=True)
    got = 0
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].delta.content)
        if got >= 3:
            break
    stream.close()
    # The next request is served after the cancelled one; its log line says where it stopped.
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    lines = [ln for ln in server.stderr().splitlines() if "served:" in ln]
    cancelled = [ln for ln in lines if "finish=cancelled" in ln]
    assert cancelled, lines
    generated = int(cancelled[-1].split(" generated")[0].rsplit(", ", 1)[1])
    assert 3 <= generated < 1000


def test_a_full_queue_gets_429_with_retry_after(tmp_path):
    with BranchwiseServe(tmp_path, "--threads", "1", "--queue-size", "1") as s:
        c = client(s.start().url)
        running = c.chat.completions.create(model="m", messages=[{"role": "user", "content": COUNT}],
                                            temperature=0, max_tokens=1500, stream=True)
        next(iter(running))  # the first request is being served
        results: list = []

        def send():
            try:
                results.append(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                                         max_tokens=2))
            except openai.APIStatusError as exc:
                results.append(exc)

        threads = [threading.Thread(target=send) for _ in range(2)]
        for t in threads:
            t.start()
        while not results:  # the one that does not fit in the queue is refused at once
            threads[0].join(0.05)
        refused = results[0]
        assert isinstance(refused, openai.RateLimitError), refused
        assert int(refused.response.headers["retry-after"]) >= 1
        assert refused.body["code"] == "queue_full"
        running.close()  # cancels the first; the queued one is then served
        for t in threads:
            t.join(600)
        assert len(results) == 2 and results[1].choices[0].message.content is not None


def test_a_public_address_needs_a_key(tmp_path):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    env.pop("BRANCHWISE_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "--api-key" in r.stderr and "Traceback" not in r.stderr


def test_the_key_is_checked_on_every_route(tmp_path):
    with BranchwiseServe(tmp_path, "--api-key", "s3cret") as s:
        s.start()
        with pytest.raises(openai.AuthenticationError):
            client(s.url, "wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            client(s.url, "wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with httpx.Client(trust_env=False) as h:
            r = h.get(s.url.removesuffix("/v1") + "/nowhere")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert client(s.url, "s3cret").models.list().data[0].id


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_type"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temprature": 0}).encode(), 400,
     "unknown_parameter"),
    (json.dumps({"messages": []}).encode(), 400, "invalid_type"),
    (json.dumps({"model": "m"}).encode(), 400, "missing_required_parameter"),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), 400, "invalid_value"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).encode(), 400,
     "invalid_type"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode(), 400,
     "invalid_value"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 3}).encode(), 400, "unsupported_value"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
     .encode(), 400, "invalid_value"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}).encode(), 400,
     "context_length_exceeded"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 5000}], "stream": True}).encode(), 400,
     "context_length_exceeded"),
    (b"[" * 100000 + b"]" * 100000, 400, "invalid_json"),
    (b" " * (9 * 1024 * 1024), 413, "request_too_large"),
])
def test_malformed_requests_get_openai_errors(server, body, status, code):
    with httpx.Client(trust_env=False, timeout=600) as h:
        r = h.post(server.url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "Traceback" not in r.text


def test_a_6_mb_message_is_refused_without_tokenizing_all_of_it(server):
    """Tokenizing 6 MB takes 10-26 s in one uninterruptible call (the queue waited that long,
    also for a client already gone); a head of it is over the window, so it is a 400 at once
    and the next request is served."""
    import time

    c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=8,
                      http_client=httpx.Client(trust_env=False))
    t = time.monotonic()
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "The quick brown fox. " * 290_000}],
                                  max_tokens=4)
    assert err.value.code == "context_length_exceeded" and "at least" in err.value.message
    assert time.monotonic() - t < 8
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_unknown_routes_and_methods_are_json_errors(server):
    with httpx.Client(trust_env=False) as h:
        r = h.get(server.url + "/completions")
        assert r.status_code == 404 and r.json()["error"]["message"]
        r = h.get(server.url + "/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["message"]
        r = h.get(server.url + "/models/SmolLM2-135M-Instruct.Q4_1")
        assert r.json()["id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert "Traceback" not in server.stderr()


def test_in_process_start_and_stop_for_the_window(model_path, no_leaks):
    from app.serve import ServeError
    from app.serve.server import ApiServer, ServerState
    from engine.core import Engine
    from engine.settings import EngineSettings

    engine = Engine(model_path, EngineSettings(n_ctx=2048, n_threads=1), None)
    states: list = []
    server = ApiServer(engine, "local", port=0, on_state=states.append)
    try:
        server.start()
        assert server.state == ServerState.RUNNING and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/v1"
        r = client(server.url).chat.completions.create(model="local", messages=[{"role": "user", "content": "Hi"}],
                                                       temperature=0, max_tokens=4)
        assert r.usage.completion_tokens >= 1
        busy = ApiServer(engine, "local", port=server.port)
        with pytest.raises(ServeError, match="port may be in use"):
            busy.start()
        assert busy.state == ServerState.FAILED
    finally:
        server.stop()
        engine.close()
    assert states == [ServerState.STARTING, ServerState.RUNNING, ServerState.STOPPING, ServerState.STOPPED]
    with pytest.raises(ServeError, match="--api-key"):
        ApiServer(engine, "local", host="0.0.0.0")


def test_a_busy_port_is_one_line(tmp_path):
    import socket

    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr  # not uvicorn's "ERROR: [Errno 98] ..." first
    assert r.stderr.startswith(f"branchwise: Could not listen on 127.0.0.1:{port}: the port")


# -- cross-site requests (issue 30, item 8) -----------------------------------------------

HI = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


def test_cross_site_requests_get_403(server):
    port = httpx.URL(server.url).port
    with httpx.Client(trust_env=False, timeout=600) as h:
        json_type = {"Content-Type": "application/json"}
        refused = [
            h.post(server.url + "/chat/completions", content=HI, headers={**json_type, "Origin": "https://evil.example"}),
            h.post(server.url + "/chat/completions", content=HI, headers={**json_type, "Host": f"evil.example:{port}"}),
            h.post(server.url + "/chat/completions", content=HI, headers={"Content-Type": "text/plain"}),
            h.post(server.url + "/chat/completions", content=HI, headers={"Content-Type": ""}),
            h.get(server.url + "/models", headers={"Host": f"rebound.example:{port}"}),
            h.get(server.url + "/models", headers={"Host": "127.0.0.1:1"}),  # not this server's port
            h.request("OPTIONS", server.url + "/chat/completions",
                      headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}),
        ]
        for r in refused:
            assert r.status_code == 403, (r.request.headers, r.text)
            assert r.json()["error"]["code"] == "cross_site_refused" and "access-control-allow-origin" not in r.headers
        assert "Origin" in refused[0].json()["error"]["message"]
        assert "--allowed-host" in refused[1].json()["error"]["message"]
        assert "application/json" in refused[2].json()["error"]["message"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
            r = h.get(server.url + "/models", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        r = h.post(server.url + "/chat/completions", content=HI,
                   headers={"Content-Type": "application/json; charset=utf-8"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_configured_hosts_and_origins_and_their_preflights():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from app.serve.guard import CrossSiteGuard

    async def echo(_request):
        return JSONResponse({"ok": True})

    inner = Starlette(routes=[Route("/v1/x", echo, methods=["GET", "POST"])])
    guard = CrossSiteGuard(inner, "127.0.0.1", lambda: 8080, allowed_hosts=["bw.lan"],
                           allowed_origins=["http://localhost:3000"])
    with TestClient(guard, base_url="http://127.0.0.1:8080") as c:
        assert c.get("/v1/x").status_code == 200
        assert c.get("/v1/x", headers={"Host": "bw.lan:8080"}).status_code == 200
        assert c.get("/v1/x", headers={"Host": "[::1]:8080"}).status_code == 200
        assert c.get("/v1/x", headers={"Host": "other.lan:8080"}).status_code == 403
        ok = c.post("/v1/x", json={}, headers={"Origin": "http://localhost:3000"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        pre = c.options("/v1/x", headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "content-type, authorization"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert c.options("/v1/x", headers={"Origin": "http://localhost:3001",
                                           "Access-Control-Request-Method": "POST"}).status_code == 403
        assert c.post("/v1/x", content=b"{}", headers={"Origin": "http://localhost:3000",
                                                       "Content-Type": "text/plain"}).status_code == 403
    public = CrossSiteGuard(inner, "0.0.0.0", lambda: 8080)
    with TestClient(public, base_url="http://192.168.1.7:8080") as c:
        assert c.get("/v1/x").status_code == 200  # an address of this machine
        assert c.get("/v1/x", headers={"Host": "evil.example:8080"}).status_code == 403


def test_sigterm_the_moment_a_streamed_reply_ends_keeps_its_kv(tmp_path):
    """Issue #27, item 5: the snapshot after a reply runs after the client has its last
    chunk; a SIGTERM then (a service manager's stop) lets it finish before the server exits,
    so after a restart the resent history, reply included, is restored."""
    import signal

    from openai import OpenAI

    data = tmp_path / "data"
    data.mkdir()
    question = [{"role": "user", "content": "Tell me about the moon."}]
    with BranchwiseServe(data).start() as server:
        client = OpenAI(base_url=server.url, api_key="unused")
        text, usage = "", None
        for chunk in client.chat.completions.create(model="m", messages=question, stream=True, max_tokens=60,
                                                    temperature=0, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        server.proc.send_signal(signal.SIGTERM)  # at once: the snapshot is still being written
        assert server.proc.wait(60) == 143, server.stderr()
    turn_end = usage.prompt_tokens + usage.completion_tokens
    with BranchwiseServe(data).start() as server:
        client = OpenAI(base_url=server.url, api_key="unused")
        again = client.chat.completions.create(model="m", max_tokens=1, temperature=0, messages=[
            *question, {"role": "assistant", "content": text}, {"role": "user", "content": "And the sun?"}])
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= turn_end - 2, (cached, turn_end)  # the reply's KV, not only its prompt
