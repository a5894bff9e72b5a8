"""``branchwise bench --serve``: time to first token for a client that resends a
2,000-token history to a server that was restarted since it last saw it.

Both servers run in child processes on a free loopback port with the same model,
context (4,096 tokens) and thread count, and are measured by the same client
(:class:`engine.remote.RemoteEngine`: TTFT from sending the request to the first
streamed text, network included):

1. ``branchwise serve`` answers the history once, is stopped (SIGINT) and started
   again on the same data folder; the client then resends the history, the reply and a
   new question. The prefix store restores the history.
2. ``python -m llama_cpp.server`` (llama-cpp-python's own server, the ``server`` extra)
   gets the same two requests with the same restart: its cache lives in its process.
3. For reference, ``branchwise serve`` on an empty data folder (a cold prefill).

Prints a table, or one JSON object with ``--json``. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WORDS = ("river harbour lantern orchard meadow granite violin compass winter autumn signal garden "
          "copper engine ledger canyon harvest beacon marble quiet northern patient careful bright "
          "village market bridge tower island forest letter window morning evening journey").split()
N_CTX = 4096


def _history(model_path: Path, n_tokens: int) -> list[dict]:
    import random

    import llama_cpp

    vocab = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    rng = random.Random(n_tokens)
    sentences: list[str] = []
    while len(vocab.tokenize(" ".join(sentences).encode(), add_bos=False)) < n_tokens:
        sentences += [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 12))).capitalize() + "."
                      for _ in range(20)]
    ids = vocab.tokenize(" ".join(sentences).encode(), add_bos=False)[:n_tokens]
    text = vocab.detokenize(ids).decode("utf-8", "ignore")
    return [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": text + "\n\nWhich word appears most often above?"}]


class ServerProcess:
    """A server child process (``argv``) on a loopback port, as a context manager: started on
    enter (its URL read from its first stdout line when ``url_from_stdout``, else polled on
    ``/models`` for up to 300 s; RuntimeError naming ``log`` if it does not start), stopped
    by SIGINT on exit (killed after 15 s)."""

    def __init__(self, argv: list[str], log: Path, url_from_stdout: bool, port: int = 0):
        self.argv, self.log, self.url_from_stdout, self.port = argv, log, url_from_stdout, port
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}/v1"

    def __enter__(self):
        import httpx

        out = self.log.open("a")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE if self.url_from_stdout else out,
                                     stderr=out, text=True)
        if self.url_from_stdout:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"branchwise serve did not start; see {self.log}")
            self.url = json.loads(line)["url"]
            return self
        deadline = time.monotonic() + 300
        with httpx.Client(trust_env=False) as client:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if client.get(self.url + "/models", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{' '.join(self.argv[:3])} did not start; see {self.log}")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:  # llama_cpp.server may wait long for its streams to close; a kill is a restart too
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _ask(url: str, messages: list[dict], max_tokens: int):
    from engine.chat_template import ChatMessage
    from engine.remote import RemoteEngine
    from engine.settings import SamplingParams

    engine = RemoteEngine(url, model="bench")
    try:
        return engine.generate([ChatMessage(m["role"], m["content"]) for m in messages],
                               SamplingParams(temperature=0, max_tokens=max_tokens))
    finally:
        engine.close()


def _resend_after_restart(make_server, history: list[dict]) -> dict:
    with make_server() as server:
        first = _ask(server.url, history, 16)
    follow = history + [{"role": "assistant", "content": first.text},
                        {"role": "user", "content": "And which appears least often?"}]
    with make_server() as server:
        r = _ask(server.url, follow, 8)
    s = r.stats
    return {"ttft_ms": round(s.ttft_ms, 1), "prompt_tokens": s.prompt_tokens if s.reported else None,
            "cached_tokens": s.restored_tokens if s.reported else None}


def _said(say, row: dict) -> dict:
    say(f"  TTFT {row['ttft_ms']:,.0f} ms, cached {row['cached_tokens']} of {row['prompt_tokens']} prompt tokens")
    return row


def run_serve_bench(model: str | None = None, as_json: bool = False, quick: bool = False) -> int:
    from engine.model_file import default_model_path

    model_path = Path(model) if model else default_model_path()
    n_tokens = 300 if quick else 2000
    threads = str(os.cpu_count() or 1)
    say = (lambda *a: None) if as_json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    history = _history(model_path, n_tokens)
    out: dict = {"model": model_path.name, "history_tokens": n_tokens, "threads": int(threads)}
    with tempfile.TemporaryDirectory(prefix="branchwise-bench-serve-") as tmp:
        work = Path(tmp)

        def branchwise(data: Path):
            data.mkdir(exist_ok=True)
            argv = [sys.executable, "-m", "app.cli", "serve", "--json", "--port", "0", "--data-dir", str(data),
                    "--model", str(model_path), "--ctx-size", str(N_CTX), "--threads", threads]

            return lambda: ServerProcess(argv, work / "branchwise-serve.log", True)

        def llama_cpp_server():
            from app.serve.server import free_port

            port = free_port()
            argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host", "127.0.0.1",
                    "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", threads]
            return ServerProcess(argv, work / "llama-cpp-server.log", False, port)

        say(f"serve: branchwise serve, {n_tokens:,}-token history, restart, resend ...")
        out["branchwise_serve"] = _said(say, _resend_after_restart(branchwise(work / "data"), history))
        try:
            import llama_cpp.server  # noqa: F401  (the `server` extra)
        except ImportError:
            out["llama_cpp_server"] = None
            say("serve: llama_cpp.server not installed (pip install 'llama-cpp-python[server]'); skipped")
        else:
            say("serve: python -m llama_cpp.server, the same requests and restart ...")
            out["llama_cpp_server"] = _said(say, _resend_after_restart(llama_cpp_server, history))
        say("serve: branchwise serve on an empty data folder (cold) ...")
        cold = branchwise(work / "empty")
        follow = history + [{"role": "assistant", "content": "Bridge."},
                            {"role": "user", "content": "And which appears least often?"}]
        with cold() as server:
            r = _ask(server.url, follow, 8)
        out["branchwise_cold"] = _said(say, {"ttft_ms": round(r.stats.ttft_ms, 1),
                                             "prompt_tokens": r.stats.prompt_tokens,
                                             "cached_tokens": r.stats.restored_tokens})
    if as_json:
        print(json.dumps(out))
        return 0
    print(f"\nServe: a client resends a {n_tokens:,}-token history after a server restart "
          f"({model_path.name}, {threads} threads; TTFT measured by the client)")
    print(f" {'server':<40}{'TTFT ms':>10}{'cached':>10}{'prompt':>9}")
    rows = [("branchwise serve, after restart", out["branchwise_serve"]),
            ("python -m llama_cpp.server, after restart", out["llama_cpp_server"]),
            ("branchwise serve, empty store (cold)", out["branchwise_cold"])]
    for label, row in rows:
        if row is None:
            print(f" {label:<40}{'not installed':>29}")
            continue
        cached = "n/a" if row["cached_tokens"] is None else f"{row['cached_tokens']:,}"
        prompt = "n/a" if row["prompt_tokens"] is None else f"{row['prompt_tokens']:,}"
        print(f" {label:<40}{row['ttft_ms']:>10,.0f}{cached:>10}{prompt:>9}")
    return 0
