"""``branchwise bench --llama-server PATH``: llama.cpp's own slot save and restore of the
prompt the restore bench uses, for comparison with the prefix store.

A llama-server binary (for example built from the pinned llama-cpp-python sdist's
``vendor/llama.cpp`` with cmake) is started on the same model with ``--slot-save-path``;
the prompt's token ids are evaluated in slot 0, then ``POST /slots/0?action=save`` writes
the slot's state to a file. The server is restarted (a restore in a new process, as a
resume is), and ``POST /slots/0?action=restore`` reads it back: several times on a warm
page cache (median), once after the file was dropped from the page cache. The figures are
the server's own ``timings`` (``save_ms``, ``restore_ms``); nothing is asserted.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

FILENAME = "branchwise-bench.bin"


class Interleave:
    """What :func:`bench_llama_server` runs of the other program between its own steps:
    ``save()`` before each slot save, ``restore()`` before each warm restore, ``cold()``
    before the cold one. The base class runs nothing."""

    def save(self) -> None:
        """Before a slot save."""

    def restore(self) -> None:
        """Before a warm slot restore."""

    def cold(self) -> None:
        """Before the cold slot restore."""


def _server(binary: str, model: Path, slots: Path, log: Path, repack: bool, threads: int = 0,
            extra: tuple[str, ...] = ()):
    """A llama-server child on a free loopback port (started and stopped as the serve
    bench's servers are), and the base URL of its native endpoints. ``repack`` False adds
    ``--no-repack`` (llama.cpp common/arg.cpp), Branchwise's ``use_extra_bufts = False``;
    ``threads`` (0: the logical core count) goes to ``-t`` and ``-tb``; ``extra``: more
    arguments (``--spec-type ngram-simple``)."""
    from app.bench.serve import ServerProcess
    from app.serve.server import free_port

    port = free_port()
    n = str(threads or os.cpu_count() or 1)
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
            "--slot-save-path", str(slots), "-t", n, "-tb", n,
            "-fa", "off", *extra]  # the KV layout Branchwise uses (V transposed): the same bytes to move
    if not repack:
        argv.append("--no-repack")
    return ServerProcess(argv, log, False, port), f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def _started(server, log: Path):
    """``with server``, where a server that died by a signal before it answered raises
    :class:`_Crashed`."""
    try:
        server.__enter__()
    except RuntimeError:
        code = server.proc.poll() if server.proc else None
        if code is not None and code < 0:
            raise _Crashed(f"died by signal {-code} at start-up", log) from None
        raise
    try:
        yield server
    finally:
        server.__exit__(None, None, None)


def _post(url: str, body: dict) -> dict:
    import httpx

    r = httpx.post(url, json=body, timeout=600, trust_env=False)
    if r.status_code != 200:
        raise RuntimeError(f"llama-server {url}: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()


def _ms(reply: dict, key: str, wall: float) -> float:
    timings = reply.get("timings") or {}
    return float(timings.get(key, wall * 1000))


def bench_llama_server(binary: str, model: Path, prompt: list[int], work: Path, repeats: int = 5,
                       repack: bool = True, threads: int = 0, saves: int = 1,
                       between: Interleave | None = None) -> dict:
    """Slot save (``saves`` times, each into a new file) and restore (``repeats`` times
    warm, then once cold) of ``prompt`` (token ids) through ``binary``, with weight
    repacking as Branchwise decided (``repack``). A server that dies by a signal at its
    first start with repacking on (a llama-server built with AMX kernels on a CPU where they
    crash) is measured again with ``--no-repack``, and the result says so.

    ``between`` runs the other program's measurement before each save, each warm restore
    and the cold one (``Interleave``), so that both see the same load.

    Returns:
        ms and MB/s, ``"repack"`` ("on"/"off") and ``"repack_note"``, or ``{"error": words}``
        when the server cannot be run.
    """
    try:
        out = _bench(binary, model, prompt, work, repeats, repack, threads, saves, between)
        note = "as Branchwise" if repack else "--no-repack, as Branchwise"
    except _Crashed as crash:
        if not repack:
            return {"error": str(crash)}
        try:
            out = _bench(binary, model, prompt, work, repeats, False, threads, saves, between)
        except _Crashed as again:
            return {"error": str(again)}
        note = f"--no-repack: with repacking on it {crash.what}"
        repack = False
    if "error" not in out:
        out.update(repack="on" if repack else "off", repack_note=note)
    return out


class _Crashed(Exception):
    """llama-server died by a signal before it answered."""

    def __init__(self, what: str, log: Path):
        super().__init__(f"llama-server {what}; see {log}")
        self.what = what


def _bench(binary: str, model: Path, prompt: list[int], work: Path, repeats: int, repack: bool,
           threads: int, saves: int = 1, between: Interleave | None = None) -> dict:
    from storage.block_files import drop_file_cache

    between = between or Interleave()

    if not Path(binary).is_file() or not os.access(binary, os.X_OK):
        return {"error": f"{binary} is not an executable file"}
    work.mkdir(parents=True, exist_ok=True)
    log = work / "llama-server.log"
    try:
        server, url = _server(binary, model, work, log, repack, threads)
        with _started(server, log):
            _post(url + "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0,
                                        "cache_prompt": True, "id_slot": 0})
            save_times = []
            for i in range(saves):  # each into a new file, as each snapshot goes into an empty store
                between.save()
                name = FILENAME if i == saves - 1 else f"save-{i}-{FILENAME}"
                t = time.perf_counter()
                saved = _post(url + "/slots/0?action=save", {"filename": name})
                save_times.append(_ms(saved, "save_ms", time.perf_counter() - t))
                if name != FILENAME:
                    (work / name).unlink(missing_ok=True)
            save_ms = statistics.median(save_times)
        restores = []
        server, url = _server(binary, model, work, log, repack, threads)  # restore in a new process, as a resume does
        with server:
            for _ in range(repeats):
                between.restore()
                t = time.perf_counter()
                restored = _post(url + "/slots/0?action=restore", {"filename": FILENAME})
                restores.append(_ms(restored, "restore_ms", time.perf_counter() - t))
            between.cold()
            drop_file_cache(work / FILENAME)
            t = time.perf_counter()
            cold = _ms(_post(url + "/slots/0?action=restore", {"filename": FILENAME}), "restore_ms",
                       time.perf_counter() - t)
    except (OSError, RuntimeError, ValueError) as exc:
        return {"error": str(exc) if str(log) in str(exc) else f"{exc} (see {log})"}
    size = (work / FILENAME).stat().st_size
    warm = statistics.median(restores)
    return {"tokens": int(saved.get("n_saved", len(prompt))), "file_mb": round(size / 1e6, 1), "saves": saves,
            "save_ms": round(save_ms, 2), "restore_ms": round(warm, 2), "cold_restore_ms": round(cold, 2),
            "restore_mb_per_s": round(size / 1e6 / (warm / 1000), 0)}


def bench_llama_server_speed(binary: str, model: Path, work: Path, workloads: dict[str, tuple[list[int], int]],
                             repack: bool = True, threads: int = 0, repeats: int = 3,
                             speculative: bool = False, repeat_penalty: float = 1.0,
                             before_each: Callable[[str], object] | None = None) -> dict:
    """Prefill and decode speed through ``binary``'s ``/completion`` at temperature 0 with
    ``repeat_penalty`` over the last 64 tokens (1.0: none), from
    the server's own ``timings`` (``prompt_per_second``, ``predicted_per_second``), for each
    workload ``name: (prompt token ids, tokens to generate)``, ``repeats`` times (medians).
    Each request evaluates its whole prompt (``cache_prompt`` false). ``speculative``
    starts the server with ``--spec-type ngram-simple`` (llama.cpp's prompt lookup).
    ``before_each(name)`` runs before each request: the other program's run of the same
    workload, so that both see the same load.

    Returns:
        ``{name: {"prefill_tok_s", "decode_tok_s", "generated", "ids", "drafted",
        "accepted"}}`` (tokens/s; ``ids`` the reply's token ids), or ``{"error": words}``.
    """
    work.mkdir(parents=True, exist_ok=True)
    log = work / ("llama-server-lookup.log" if speculative else "llama-server-speed.log")
    extra = ("--spec-type", "ngram-simple") if speculative else ()
    out: dict = {}
    try:
        server, url = _server(binary, model, work, log, repack, threads, extra)
        with _started(server, log):
            runs: dict[str, list[dict]] = {name: [] for name in workloads}
            for _ in range(repeats):  # interleaved, so drifting load hits every workload alike
                for name, (prompt, n_predict) in workloads.items():
                    if before_each is not None:
                        before_each(name)
                    reply = _post(url + "/completion", {
                        "prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False,
                        "repeat_penalty": repeat_penalty, "repeat_last_n": 64,  # Branchwise's, not its own 1.0
                        "id_slot": 0, "return_tokens": True})
                    runs[name].append(reply)
    except _Crashed as crash:
        return {"error": str(crash)}
    except (OSError, RuntimeError, ValueError) as exc:
        return {"error": str(exc) if str(log) in str(exc) else f"{exc} (see {log})"}
    med = statistics.median
    for name, replies in runs.items():
        timings = [r.get("timings") or {} for r in replies]
        out[name] = {
            "prefill_tok_s": round(med(float(t.get("prompt_per_second", 0)) for t in timings), 1),
            "decode_tok_s": round(med(float(t.get("predicted_per_second", 0)) for t in timings), 1),
            "generated": int(timings[-1].get("predicted_n", 0)),
            "ids": [int(x) for x in replies[-1].get("tokens") or []],
            "drafted": int(timings[-1].get("draft_n", 0)), "accepted": int(timings[-1].get("draft_n_accepted", 0)),
        }
    return out
