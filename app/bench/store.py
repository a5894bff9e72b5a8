"""``branchwise bench [--model PATH]``: the figures the prefix store exists for, on the
default model or any GGUF (for sliding-window, recurrent and hybrid models the restore
includes a checkpoint; see engine/core.py).

1. Resume: a conversation whose first turn is about N tokens (N = 500, 1,000, 2,000) is
   continued by a *new process*, once with ``--no-cache`` (cold prefill) and once through
   the prefix store; TTFT of both, tokens restored, and whether the replies are equal.
2. Restore throughput (MB/s of KV from the store into llama.cpp, end to end: lookup, map
   the files, check and copy the blocks, ``llama_state_seq_set_data``; for a dense model in
   pieces, each copied while llama.cpp reads the one before), on a warm page cache and once
   cold; the snapshot cost of a first turn (all blocks new: once in the resume run's new
   process, and the median of five into an empty store in this one) and of the next turn.
3. Sharing: ten branches off one 1,500-token prefix; bytes stored against the bytes of
   their distinct tokens.
4. The same sharing workload through llama-cpp-python's ``LlamaDiskCache``.
5. With ``--llama-server PATH``: llama.cpp's own slot save and restore of the same prompt
   (``app/bench/llama_server.py``), printed next to the store's figures.

Prints a table, or one JSON object with ``--json``. Nothing here is asserted: the
numbers are for people (and the closing notes) to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WORDS = ("river harbour lantern orchard meadow granite violin compass winter autumn signal garden "
          "copper engine ledger canyon harvest beacon marble quiet northern patient careful bright "
          "village market bridge tower island forest letter window morning evening journey").split()


def filler(engine, n_tokens: int, seed: int) -> str:
    """Plain English-like text of about ``n_tokens`` tokens for this model."""
    rng = random.Random(seed)
    sentences = []
    while True:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 12))]
        sentences.append(" ".join(words).capitalize() + ".")
        if len(sentences) % 10 == 0 and len(engine.model.tokenize(" ".join(sentences), False)) >= n_tokens:
            break
    text = " ".join(sentences)
    ids = engine.model.tokenize(text, False)[:n_tokens]
    return engine.model.detokenize(ids)


def _cli(data_dir: Path, *args) -> dict:
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    r = subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"branchwise {' '.join(map(str, args[:2]))} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def bench_resume(engine, data_dir: Path, sizes: list[int], model: Path | None = None) -> list[dict]:
    rows = []
    chat = ("chat", "--json", "--temperature", 0, "--max-tokens", 16, *(("--model", model) if model else ()))
    for n in sizes:
        text = filler(engine, n, seed=n) + "\n\nWhich word appears most often above?"
        first = _cli(data_dir, *chat, text)
        parent = first["assistant_message_id"]
        follow = "Answer again in one short sentence."
        cold = _cli(data_dir, *chat, "--parent", parent, "--no-cache", follow)
        warm = _cli(data_dir, *chat, "--parent", parent, follow)
        rows.append({
            "first_turn_tokens": first["stats"]["prompt_tokens"] + first["stats"]["generated_tokens"],
            "prompt_tokens": warm["stats"]["prompt_tokens"],
            "cold_ttft_ms": cold["stats"]["ttft_ms"],
            "resume_ttft_ms": warm["stats"]["ttft_ms"],
            "restored_tokens": warm["stats"]["restored_tokens"],
            "first_turn_computed": first["stats"]["prompt_tokens"] + first["stats"]["generated_tokens"]
            - (first["stats"]["finish_reason"] == "length"),
            "restored_pct": round(100 * warm["stats"]["restored_tokens"] / max(
                first["stats"]["prompt_tokens"] + first["stats"]["generated_tokens"]
                - (first["stats"]["finish_reason"] == "length"), 1), 1),
            "prefilled_tokens": warm["stats"]["prefilled_tokens"],
            "restore_ms": warm["stats"]["restore_ms"],
            "speedup": round(cold["stats"]["ttft_ms"] / max(warm["stats"]["ttft_ms"], 1e-6), 1),
            "ttft_ratio_pct": round(100 * warm["stats"]["ttft_ms"] / cold["stats"]["ttft_ms"], 2),
            "same_reply": warm["text"] == cold["text"],
            "first_turn_snapshot_ms": first["stats"]["snapshot_ms"],
            "next_turn_snapshot_ms": warm["stats"]["snapshot_ms"],
            "next_turn_snapshot_bytes": warm["stats"]["snapshot_bytes_written"],
        })
    return rows


def bench_restore(engine, prompt: list[int], repeats: int = 7) -> dict:
    """Restore the stored prefix of ``prompt`` ``repeats`` times on a warm page cache,
    then once cold (:class:`RestoreRuns`); its result."""
    runs = RestoreRuns(engine, prompt)
    if runs.tokens:
        for _ in range(repeats):
            runs.once()
        runs.cold()
    return runs.result()


class RestoreRuns:
    """Restores of the stored prefix of ``prompt`` into an emptied context, end to end: the
    lookup, then the restore itself (``CacheStrategy.restore``: map the files, check and
    copy each block, ``llama_state_seq_set_data``), one at a time (:meth:`once`, and
    :meth:`cold` after the store's files were dropped from the page cache with
    posix_fadvise), so that a comparison can run another program's restores between them.
    :meth:`result` gives medians in ms and MB/s of KV.

    For a dense model the breakdown is the restore's own (``RestoreTiming``): the copy of
    the first piece (``copy_ms``; the later pieces are copied while llama.cpp reads the
    earlier ones) and llama.cpp's part (``set_data_ms``). For a model with checkpoints the
    restore is blocks plus the deepest checkpoint, as one blob: the breakdown is map,
    check-and-copy, set_data. ``tokens`` is 0 when nothing of ``prompt`` is stored."""

    def __init__(self, engine, prompt: list[int]):
        self.engine, self.prompt = engine, prompt
        self.dense = not engine.mode.checkpoints
        self.parts: dict[str, list[float]] = {"lookup": [], "map": [], "copy": [], "set": [], "restore": []}
        self.nbytes, self.cold_s = 0, None
        match, ref = _restore_lookup(engine, prompt)
        self.tokens = (ref.n_tokens if ref is not None else 0) if engine.mode.checkpoints else match.n_tokens
        self.ref = ref

    def once(self) -> float:
        """One restore; returns its seconds."""
        engine, parts = self.engine, self.parts
        engine.live.clear(data=False)
        t0 = time.perf_counter()
        match, ref = _restore_lookup(engine, self.prompt)
        t1 = time.perf_counter()
        if self.dense:
            n, _ = engine.cache.restore(match)
            t2 = time.perf_counter()
            assert n == match.n_tokens, (n, match.n_tokens)
            timing = engine.cache.last_restore
            parts["map"].append(t2 - t1 - timing.total_ms / 1000)
            parts["copy"].append(timing.copy_ms / 1000)
            parts["set"].append(timing.set_data_ms / 1000)
            self.nbytes = match.n_tokens * engine.layout.bytes_per_token
        else:
            mapped, data = _restore_read(engine, match, ref)
            t_map = time.perf_counter()
            blob = _restore_join(engine, mapped, data, ref)
            t_copy = time.perf_counter()
            assert engine.live.apply(blob)
            t2 = time.perf_counter()
            parts["map"].append(t_map - t1)
            parts["copy"].append(t_copy - t_map)
            parts["set"].append(t2 - t_copy)
            self.nbytes = (sum(memoryview(p).nbytes * use // count for p, count, use in mapped.payloads)
                           + (len(data) if data else 0))
        parts["lookup"].append(t1 - t0)
        parts["restore"].append(t2 - t0)
        return t2 - t0

    def cold(self) -> None:
        """One restore after the store's files were dropped from the page cache (nothing
        where the OS has no posix_fadvise); not part of the warm medians."""
        from storage.block_files import drop_file_cache

        if not hasattr(os, "posix_fadvise"):
            return
        store = self.engine.store
        store.files.drop_cache()
        drop_file_cache(store.path)
        saved = {k: list(v) for k, v in self.parts.items()}
        self.cold_s = self.once()
        self.parts = saved

    def result(self) -> dict:
        if not self.tokens or not self.parts["restore"]:
            return {"tokens": 0}
        med, parts = statistics.median, self.parts
        total = med(parts["restore"])
        out = {
            "tokens": self.tokens, "kv_mb": round(self.nbytes / 1e6, 1), "runs": len(parts["restore"]),
            "checkpoint_mb": round(self.ref.nbytes / 1e6, 2) if self.ref is not None else 0.0,
            "pieces": self.engine.cache.last_restore.pieces if self.dense else 1,
            "lookup_ms": round(med(parts["lookup"]) * 1000, 2),
            "map_ms": round(med(parts["map"]) * 1000, 2), "copy_ms": round(med(parts["copy"]) * 1000, 2),
            "set_data_ms": round(med(parts["set"]) * 1000, 2), "total_ms": round(total * 1000, 2),
            "mb_per_s": round(self.nbytes / 1e6 / total, 0),
            "cold_ms": None, "cold_mb_per_s": None,
        }
        if self.cold_s:
            out.update(cold_ms=round(self.cold_s * 1000, 2), cold_mb_per_s=round(self.nbytes / 1e6 / self.cold_s, 0))
        return out


def bench_snapshot(engine, prompt: list[int], work: Path, repeats: int = 5) -> dict:
    """A first-turn snapshot ``repeats`` times (:class:`SnapshotRuns`); its result."""
    runs = SnapshotRuns(engine, prompt, work)
    if runs.tokens:
        for _ in range(repeats):
            runs.once()
    return runs.result()


class SnapshotRuns:
    """First-turn snapshots: the stored prefix of ``prompt`` is restored into the live
    context once, then each :meth:`once` snapshots it into an empty store (a new one each
    time, deleted after). :meth:`result` gives the median ms, bytes and MB/s. For dense
    models only (``tokens`` 0 otherwise)."""

    def __init__(self, engine, prompt: list[int], work: Path):
        self.engine, self.work = engine, work
        self.times: list[float] = []
        self.written = self.tokens = 0
        if engine.mode.checkpoints:
            return
        match, _ = _restore_lookup(engine, prompt)
        engine.live.clear(data=False)
        n, _ = engine.cache.restore(match)
        if n:
            engine.live.adopt(prompt[:n])
            self.tokens = n

    def once(self) -> float:
        """One snapshot into an empty store; returns its seconds."""
        from storage.prefix_store import PrefixStore

        engine = self.engine
        store = engine.store
        folder = self.work / f"snapshot-{len(self.times)}"
        try:
            engine.store = PrefixStore(folder / "kv.sqlite3", budget_bytes=store.budget_bytes,
                                       block_size=store.block_size)
            t = time.perf_counter()
            self.written = engine.snapshot()
            self.times.append(time.perf_counter() - t)
            engine.store.close()
            shutil.rmtree(folder)
        finally:
            engine.store = store
        return self.times[-1]

    def result(self) -> dict:
        if not self.times:
            return {}
        ms = statistics.median(self.times) * 1000
        return {"tokens": self.tokens, "bytes": self.written, "runs": len(self.times), "median_ms": round(ms, 1),
                "min_ms": round(min(self.times) * 1000, 1), "mb_per_s": round(self.written / 1e6 / (ms / 1000))}


def bench_switch(engine, history: list, branch_a: list, repeats: int = 7) -> dict:
    """Switching between two branches that share ``history`` (engine messages): branch A
    (``branch_a``, which continues ``history``) and a branch B with another question are
    each answered once (both stored), then the live context is brought to B's follow-up
    and A's in turn, ``repeats`` times (``Engine.position``, statistics untouched). For A:
    the live tokens kept (those the branches share, up to a block start), the tokens copied
    from the store, the median ms, and a whole restore of the same tokens into an emptied
    context for comparison. For dense models only ({} otherwise)."""
    from engine.chat_engine import GenerationStats
    from engine.chat_template import ChatMessage
    from engine.settings import SamplingParams

    if engine.mode.checkpoints:
        return {}
    sp = SamplingParams(temperature=0, max_tokens=32)
    branch_b = [*history, ChatMessage("user", "Which town does the text name most often?")]
    prompts = []
    for branch in (branch_a, branch_b):
        r = engine.generate(branch, sp)
        prompts.append(engine.prompt_tokens([*branch, ChatMessage("assistant", r.text, r.token_ids),
                                             ChatMessage("user", "Thank you.")]))
    pa, pb = prompts
    switch, whole, stats = [], [], GenerationStats()
    for _ in range(repeats):
        engine.position(pb, GenerationStats(), record=False)
        stats = GenerationStats()
        t = time.perf_counter()
        engine.position(pa, stats, record=False)
        switch.append(time.perf_counter() - t)
        kept = engine.cache.last_restore.kept_tokens
        engine.live.clear(data=False)
        t = time.perf_counter()
        engine.position(pa, GenerationStats(), record=False)
        whole.append(time.perf_counter() - t)
    med = statistics.median
    return {"tokens": stats.restored_tokens, "kept": kept, "copied": stats.restored_tokens - kept,
            "source": stats.restore_source, "median_ms": round(med(switch) * 1000, 2),
            "whole_ms": round(med(whole) * 1000, 2)}


def restore_breakdown(x: dict) -> str:
    """Where a restore's time went, in words (``bench_restore``'s figures)."""
    pieces = x.get("pieces", 1)
    copy = (f"check+copy of the first of {pieces} pieces {x.get('copy_ms')} ms (the others while llama.cpp "
            f"reads)" if pieces > 1 else f"check+copy {x.get('copy_ms')} ms")
    return (f"lookup {x.get('lookup_ms')} ms, map {x.get('map_ms')} ms, {copy}, "
            f"llama_state_seq_set_data {x.get('set_data_ms')} ms")


def _restore_lookup(engine, prompt: list[int]):
    """What ``Engine.position`` looks up: the block match and, with checkpoints, the
    deepest checkpoint within it."""
    from engine import kv_codec

    store, fp = engine.store, engine.fingerprint
    recurrent = engine.kind == kv_codec.StateKind.RECURRENT
    match = store.lookup(fp, prompt[:-2], count=False) if not recurrent else None
    ref = None
    if engine.mode.checkpoints:
        bound = len(prompt) - 2 if recurrent else match.n_tokens
        ref = store.lookup_checkpoint(fp, prompt, bound, count=False)
        if ref is not None and match is not None:
            match = match.truncated(ref.n_tokens)
    return match, ref


def _restore_read(engine, match, ref):
    """The block files mapped (not yet read: the copy checks them) and the checkpoint."""
    from storage.prefix_store import MappedBlocks

    mapped = engine.store.map_blocks(match) if match is not None else MappedBlocks()
    data = engine.store.read_checkpoint(ref) if ref is not None else None
    return mapped, data


def _restore_join(engine, mapped, data, ref):
    """The one pass: each block checked just before it is copied into the state buffer."""
    from engine import kv_codec

    kind = engine.kind if ref is not None else kv_codec.StateKind.DENSE
    return kv_codec.assemble(kind, engine.layout, mapped.payloads, data, buffer=engine.live.buffer,
                             check=mapped.check)


def _distinct_tokens(sequences: list[list[int]]) -> int:
    seen: list[list[int]] = []
    total = 0
    for s in sequences:
        lcp = 0
        for t in seen:
            n = 0
            for a, b in zip(s, t):
                if a != b:
                    break
                n += 1
            lcp = max(lcp, n)
        total += len(s) - lcp
        seen.append(s)
    return total


def bench_sharing(model_path, workdir: Path, branches: int = 10, prefix_tokens: int = 1500) -> dict:
    from engine.chat_template import ChatMessage
    from engine.core import Engine
    from engine.settings import EngineSettings, SamplingParams
    from storage.prefix_store import PrefixStore

    store = PrefixStore(workdir / "sharing.sqlite3")
    engine = Engine(model_path, EngineSettings(n_ctx=4096), store)
    sp = SamplingParams(temperature=0, max_tokens=32)
    base = [ChatMessage("user", filler(engine, prefix_tokens, seed=7) + "\n\nSummarise this.")]
    first = engine.generate(base, sp)
    history = base + [ChatMessage("assistant", first.text, first.token_ids)]
    sequences = [list(engine.llama.input_ids[: engine.llama.n_tokens])]
    questions = [f"Question {i + 1}: which {w} comes first, and why would a {v} matter here?"
                 for i, (w, v) in enumerate(zip(_WORDS[::2], _WORDS[1::2]))][:branches]
    t_branch = []
    for q in questions:
        r = engine.generate(history + [ChatMessage("user", q)], sp)
        t_branch.append(r.stats.ttft_ms)
        sequences.append(list(engine.llama.input_ids[: engine.llama.n_tokens]))
    stats = store.stats()
    per_token = engine.layout.bytes_per_token if engine.layout is not None else 0
    distinct = _distinct_tokens(sequences)
    result = {
        "prefix_tokens": first.stats.prompt_tokens, "branches": branches,
        "distinct_tokens": distinct, "stored_tokens": stats["tokens"],
        "stored_bytes": stats["bytes"], "distinct_bytes": distinct * per_token,
        "ratio": round(stats["bytes"] / (distinct * per_token), 3) if per_token else None,
        "checkpoints": stats["checkpoints"], "checkpoint_bytes": stats["checkpoint_bytes"],
        "branch_ttft_ms_median": round(statistics.median(t_branch), 1),
        "file_bytes": stats["file_bytes"],
    }
    disk = bench_llama_disk_cache(engine, sequences, workdir / "llama-disk-cache")
    engine.close()
    store.close()
    return {"sharing": result, "llama_disk_cache": disk}


def bench_llama_disk_cache(engine, sequences: list[list[int]], path: Path) -> dict:
    """The same states through llama-cpp-python's LlamaDiskCache (whole states, pickled)."""
    from llama_cpp.llama_cache import LlamaDiskCache

    llama = engine.llama
    cache = LlamaDiskCache(str(path), capacity_bytes=1 << 40)
    saves = []
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        for seq in sequences:
            engine.reset_context()
            llama.eval(seq)
            t = time.perf_counter()
            cache[seq] = llama.save_state()
            saves.append(time.perf_counter() - t)
        t = time.perf_counter()
        state = cache[sequences[0] + [1]]  # the longest-prefix lookup: a linear scan
        llama.load_state(state)
        load_s = time.perf_counter() - t
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return {"states": len(sequences), "bytes": size, "save_ms_median": round(statistics.median(saves) * 1000, 1),
            "load_ms": round(load_s * 1000, 1)}


def run_bench(model: str | None = None, as_json: bool = False, quick: bool = False,
              llama_server: str | None = None) -> int:
    from engine.core import Engine
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings
    from storage.paths import KVCACHE_DB
    from storage.prefix_store import PrefixStore

    model_path = Path(model) if model else default_model_path()
    sizes = [200] if quick else [500, 1000, 2000]
    from engine.machine import default_threads

    # EngineSettings' automatic thread count (engine/machine.py), as every engine here uses
    out: dict = {"model": model_path.name, "cpu_count": os.cpu_count(), "threads": default_threads()}
    with tempfile.TemporaryDirectory(prefix="branchwise-bench-") as tmp:
        work = Path(tmp)
        log = (lambda *a: None) if as_json else (lambda *a: print(*a, file=sys.stderr, flush=True))
        counter = Engine(model_path, EngineSettings(n_ctx=4096), None)
        out["cache_mode"] = counter.mode.value
        log(f"resume: cold prefill vs new-process resume ({counter.mode.value}) ...")
        out["resume"] = bench_resume(counter, work, sizes, model_path if model else None)
        counter.close()
        store = PrefixStore(work / KVCACHE_DB)
        engine = Engine(model_path, EngineSettings(n_ctx=4096), store)
        from storage.chats import ChatStore
        from storage.paths import CHATS_DB

        chats = ChatStore(work / CHATS_DB)
        from engine.chat_template import conversation_messages

        longest = chats.list_conversations()[0]
        prompt = engine.prompt_tokens(conversation_messages(longest.system_prompt, chats.active_path(longest.id)))
        log("restore throughput ...")
        out["restore"] = bench_restore(engine, prompt)
        log("snapshot throughput ...")
        out["snapshot"] = bench_snapshot(engine, prompt, work)
        if llama_server:
            from app.bench.llama_server import bench_llama_server

            log(f"llama-server slot save/restore ({llama_server}) ...")
            out["llama_server"] = bench_llama_server(llama_server, model_path, prompt, work / "slots",
                                                     repack=engine.model.repack.repack)
        else:
            out["llama_server"] = None
        engine.close()
        store.close()
        chats.close()
        log(f"sharing: {3 if quick else 10} branches off one prefix, and LlamaDiskCache ...")
        out.update(bench_sharing(model_path, work, branches=3 if quick else 10,
                                 prefix_tokens=300 if quick else 1500))
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print(format_table(out))
    return 0


def format_llama_server(x: dict | None) -> str:
    """One line: llama.cpp's slot save/restore figures, or why there are none."""
    if x is None:
        return "llama-server: not compared (pass --llama-server PATH to time its slot save and restore)"
    if x.get("error"):
        return f"llama-server: not compared: {x['error']}"
    return (f"llama-server slot save {x['save_ms']:.1f} ms, restore {x['restore_ms']:.1f} ms = "
            f"{x['restore_mb_per_s'] / 1000:.2f} GB/s warm, {x['cold_restore_ms']:.1f} ms cold "
            f"({x['tokens']:,} tokens, a {x['file_mb']:.1f} MB slot file; weight repacking "
            f"{x.get('repack', 'on')}, {x.get('repack_note', 'as Branchwise')})")


def format_table(r: dict) -> str:
    lines = [f"Branchwise bench · {r['model']} · {r['threads']} of {r['cpu_count']} CPU threads · "
             f"prefix store: {r.get('cache_mode', 'blocks')}", ""]
    lines.append("Resume in a new process (TTFT, ms)")
    lines.append(f"{'turn-1 tokens':>14} {'cold':>9} {'resume':>9} {'ratio':>7} {'restored':>9} "
                 f"{'of turn 1':>9} {'prefilled':>9} {'same reply':>10} {'snapshot':>9}")
    for row in r["resume"]:
        lines.append(f"{row['first_turn_tokens']:>14,} {row['cold_ttft_ms']:>9,.0f} {row['resume_ttft_ms']:>9,.1f} "
                     f"{row['ttft_ratio_pct']:>6.1f}% {row['restored_tokens']:>9,} {row['restored_pct']:>8.1f}% "
                     f"{row['prefilled_tokens']:>9,} "
                     f"{'yes' if row['same_reply'] else 'NO':>10} {row['next_turn_snapshot_ms']:>7.1f}ms")
    x = r["restore"]
    if x.get("tokens"):
        ckpt = f"; of it a {x['checkpoint_mb']} MB checkpoint" if x.get("checkpoint_mb") else ""
        cold = (f"; cold page cache {x['cold_ms']} ms = {x['cold_mb_per_s'] / 1000:.2f} GB/s"
                if x.get("cold_ms") else "; cold page cache: not measured (no posix_fadvise here)")
        lines += ["", f"Restore from the store: {x['tokens']:,} tokens, {x['kv_mb']} MB of KV in {x['total_ms']} ms "
                  f"= {x['mb_per_s'] / 1000:.2f} GB/s warm ({restore_breakdown(x)}){cold}{ckpt}"]
    if r["resume"]:
        big = r["resume"][-1]
        y = r.get("snapshot") or {}
        again = (f"; into an empty store again, {y['tokens']:,} tokens: {y['median_ms']} ms median of 5 "
                 f"= {y['mb_per_s'] / 1000:.2f} GB/s" if y.get("tokens") else "")
        lines.append(f"Snapshot: first turn of {big['first_turn_tokens']:,} tokens {big['first_turn_snapshot_ms']:.1f} ms "
                     f"in a new process (all blocks new){again}; next turn {big['next_turn_snapshot_ms']:.1f} ms for "
                     f"{big['next_turn_snapshot_bytes'] / 1e6:.1f} MB of new blocks")
    lines.append(format_llama_server(r.get("llama_server")))
    s, d = r["sharing"], r["llama_disk_cache"]
    ratio = f"ratio {s['ratio']:.3f}" if s.get("ratio") else "no blocks"
    ckpts = (f"; {s['checkpoints']} checkpoints, {s['checkpoint_bytes'] / 1e6:.1f} MB"
             if s.get("checkpoints") else "")
    lines += ["", f"Sharing: {s['branches']} branches off a {s['prefix_tokens']:,}-token prefix",
              f"  prefix store     {s['stored_bytes'] / 1e6:8.1f} MB for {s['stored_tokens']:,} tokens; "
              f"distinct tokens {s['distinct_tokens']:,} = {s['distinct_bytes'] / 1e6:.1f} MB; "
              f"{ratio}{ckpts}",
              f"  LlamaDiskCache   {d['bytes'] / 1e6:8.1f} MB for {d['states']} whole states; "
              f"save {d['save_ms_median']} ms each, find+load {d['load_ms']} ms"]
    return "\n".join(lines)
