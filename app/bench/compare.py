"""``branchwise bench [--llama-server PATH]``: one table, Branchwise beside llama.cpp's own
server, measured in the same run on the same model, prompts and thread count.

Rows (Branchwise's figure, llama-server's, and the ratio of the two):

* restore, warm (median of 7) and cold: the prefix store's end-to-end restore of a
  ~1,600-token conversation (``app.bench.store.RestoreRuns``) against llama-server's slot
  restore of the same token ids (``app.bench.llama_server``);
* first-turn snapshot: the same state into an empty store against slot save into a new
  file (medians of 5);
* prefill tokens/s and plain decode tokens/s: a ~530-token prompt, 96 tokens generated at
  temperature 0, Branchwise with speculative decoding off, against the server's own
  ``timings`` (``prompt_per_second``, ``predicted_per_second``) for the same token ids;
* speculative decode tokens/s on two workloads, Branchwise's prompt lookup
  (``--speculative lookup``, ``engine/speculative.py``) against llama-server
  ``--spec-type ngram-simple``:
  "quote" (a follow-up that asks for a verbatim quote of a pasted ~1,500-token text) and
  "chat" (a plain question). Each also states the speed-up over Branchwise's own plain
  decoding and whether the reply is token for token the plain one.

Speeds are medians of ``REPEATS`` runs. With ``--llama-server`` every run of Branchwise's
sits next to the same run of llama-server's (a snapshot before each slot save, a restore
before each slot restore, each request before the same request), so that drifting load
hits both alike. Without it the table has the Branchwise column only. A branch-switch
line follows the table (``app.bench.store.bench_switch``). Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from app.bench.llama_server import Interleave

REPEATS = 3
RESTORE_REPEATS = 7  # warm restores (medians), then one cold
SNAPSHOT_REPEATS = 5  # first-turn snapshots into an empty store (median)
N_DECODE = 96
REPEAT_PENALTY = 1.1
"""Both programs decode with Branchwise's default repeat penalty (over the last 64 tokens,
llama-cpp-python's and llama-server's window), so the rows compare the same sampler chain:
llama-server's own default is 1.0, and at 1.1 llama.cpp's penalties sampler looks up every
candidate of the vocabulary (0.5 ms a token with SmolLM2's 49,152: 52.7 against 56.3
tok/s, 5 runs each on an idle 2-core machine)."""
QUOTE_ASK = "Quote the first paragraph of the text above exactly, word for word."
CHAT_ASK = "Why do we have seasons on Earth? Explain in a few sentences."


_NAMES = "Mara Quill, Tomas Reed, Ilse Varga, Owen Hart, Nadia Brook, Felix Lund, Rosa Kemp, Jonah Vale".split(", ")
_PLACES = "Elsbridge, Carrow, Hollin Bay, Westmere, Dunmore, Ashford, Penrith Cove, Larkspur".split(", ")
_THINGS = ("harbour wall, lantern tower, stone bridge, copper mill, grain market, river lock, "
           "school house, town library").split(", ")
_SENTENCES = (
    "In {year}, the {thing} of {place} was built by the engineer {name}.",
    "Its walls are {n} metres thick and still stand after every winter storm.",
    "{name} kept a ledger of the costs, which the town archive holds to this day.",
    "Every spring the people of {place} repair the {thing} with granite from the northern quarry.",
    "Visitors say the {thing} looks best at dawn, when the fishermen bring their boats in.",
    "The council of {place} met {n} times that year to argue about the {thing}.",
    "A letter from {name} describes the work as slow, careful and far too expensive.",
)


def pasted_text(engine, n_tokens: int, seed: int) -> str:
    """Plain prose of about ``n_tokens`` tokens for this model, in paragraphs of five
    sentences (a document a user might paste)."""
    import random

    rng = random.Random(seed)
    paragraphs: list[str] = []
    while len(engine.model.tokenize("\n\n".join(paragraphs), False)) < n_tokens:
        place, thing = rng.choice(_PLACES), rng.choice(_THINGS)
        paragraphs.append(" ".join(rng.choice(_SENTENCES).format(
            year=rng.randint(1700, 1950), thing=thing, place=place, name=rng.choice(_NAMES), n=rng.randint(2, 40))
            for _ in range(5)))
    return "\n\n".join(paragraphs)


def _workloads(engine) -> dict:
    """The workloads' texts: "speed" (messages: prefill and plain decode), "first" (messages:
    the quoting workload's first turn, whose KV the restore rows use), "doc" (its text)."""
    from app.bench.store import filler
    from engine.chat_template import ChatMessage

    doc = pasted_text(engine, 1500, seed=15)
    return {
        "speed": [ChatMessage("user", filler(engine, 500, seed=5) + "\n\nContinue this text.")],
        "first": [ChatMessage("user", doc + "\n\nWhat is this text about? Answer in one sentence.")],
        "doc": doc,
    }


class _Branchwise(Interleave):
    """Branchwise's side of the table on ``engine`` (the default model, prompt lookup
    loaded): the workloads, the first turn stored, and each measurement one run at a time,
    so that with ``--llama-server`` every run of Branchwise's sits next to the same run of
    llama-server's (``Interleave``: before each slot save a snapshot, before each slot
    restore a restore; before each of its requests the same request here)."""

    def __init__(self, engine, work: Path, log):
        from app.bench.store import RestoreRuns
        from engine.chat_template import ChatMessage
        from engine.settings import SamplingParams

        self.engine, self.work, self.log = engine, work, log
        self.spec = engine.speculation
        w = _workloads(engine)
        self.greedy = SamplingParams(temperature=0, max_tokens=N_DECODE, repeat_penalty=REPEAT_PENALTY)
        first = engine.generate(w["first"], SamplingParams(temperature=0, max_tokens=32))  # into the store
        self.history = [*w["first"], ChatMessage("assistant", first.text, first.token_ids)]
        self.messages = {"speed": w["speed"], "quote": [*self.history, ChatMessage("user", QUOTE_ASK)],
                         "chat": [ChatMessage("user", CHAT_ASK)]}
        self.prompts = {name: engine.prompt_tokens(m) for name, m in self.messages.items()}
        self.prompts["restore"] = self.prompts["quote"]
        self.restores = RestoreRuns(engine, self.prompts["restore"])
        self.snapshots = None
        self.runs: dict[str, list] = {k: [] for k in ("speed", "quote_plain", "quote_lookup", "chat_plain",
                                                       "chat_lookup")}

    # -- one run of each (Interleave, and the request hooks) -----------------------------

    def save(self) -> None:
        from app.bench.store import SnapshotRuns

        if self.snapshots is None:  # restores the prompt into the live context once
            self.snapshots = SnapshotRuns(self.engine, self.prompts["restore"], self.work)
        if self.snapshots.tokens:
            self.snapshots.once()

    def restore(self) -> None:
        if self.restores.tokens:
            self.restores.once()

    def cold(self) -> None:
        if self.restores.tokens:
            self.restores.cold()

    def plain(self, name: str) -> None:
        """One plain run of workload ``name`` ("speed": prefill and decode, no cache)."""
        e = self.engine
        e.speculation = None
        key = "speed" if name == "speed" else f"{name}_plain"
        self.runs[key].append(e.generate(self.messages[name], self.greedy, use_cache=name != "speed",
                                         snapshot=False))
        e.speculation = self.spec

    def lookup(self, name: str) -> None:
        """One prompt-lookup run of workload ``name`` ("quote" or "chat")."""
        self.engine.speculation = self.spec
        self.runs[f"{name}_lookup"].append(self.engine.generate(self.messages[name], self.greedy, snapshot=False))

    # -- the whole of it ------------------------------------------------------------------------

    def alone(self) -> None:
        """Every run, without llama-server."""
        self.log("restore and snapshot ...")
        for _ in range(RESTORE_REPEATS):
            self.restore()
        self.cold()
        for _ in range(SNAPSHOT_REPEATS):
            self.save()
        self.log(f"prefill and decode, {REPEATS} rounds ...")
        for _ in range(REPEATS):
            for name in ("speed", "quote", "chat"):
                self.plain(name)
            for name in ("quote", "chat"):
                self.lookup(name)

    def result(self) -> dict:
        """Every Branchwise figure of the table (see the module docstring)."""
        from app.bench.store import bench_switch

        self.log("branch switch ...")
        out: dict = {"restore": self.restores.result(),
                     "snapshot": self.snapshots.result() if self.snapshots is not None else {},
                     "switch": bench_switch(self.engine, self.history, self.messages["quote"])}
        runs, med = self.runs, statistics.median
        speed = runs["speed"]
        out["prefill"] = {"tokens": speed[-1].stats.prefilled_tokens,
                          "tok_s": round(med(r.stats.prefilled_tokens / (r.stats.prefill_ms / 1000) for r in speed), 1)}
        out["decode"] = {"tokens": speed[-1].stats.generated_tokens,
                         "tok_s": round(med(r.stats.decode_tokens_per_s for r in speed), 1)}
        for name in ("quote", "chat"):
            plain, lookup = runs[f"{name}_plain"], runs[f"{name}_lookup"]
            s = lookup[-1].stats
            plain_tok_s = med(r.stats.decode_tokens_per_s for r in plain)
            lookup_tok_s = med(r.stats.decode_tokens_per_s for r in lookup)
            out[name] = {"prompt_tokens": s.prompt_tokens, "generated": s.generated_tokens,
                         "plain_tok_s": round(plain_tok_s, 1), "lookup_tok_s": round(lookup_tok_s, 1),
                         "speedup": round(lookup_tok_s / max(plain_tok_s, 1e-9), 2),
                         "drafted": s.drafted_tokens, "accepted": s.accepted_tokens,
                         "same_reply": all(a.token_ids == b.token_ids for a, b in zip(plain, lookup)),
                         "ids": plain[-1].token_ids}
        return out


def _llama_server(binary: str, model: Path, bw: _Branchwise, work: Path, repack: bool, threads: int,
                  log) -> dict:
    """llama-server's figures, each run next to Branchwise's same run (``bw``)."""
    from app.bench.llama_server import bench_llama_server, bench_llama_server_speed

    prompts = bw.prompts
    log(f"restore and snapshot, beside llama-server's slot save and restore ({binary}) ...")
    slots = bench_llama_server(binary, model, prompts["restore"], work / "slots", repeats=RESTORE_REPEATS,
                               repack=repack, threads=threads, saves=SNAPSHOT_REPEATS, between=bw)
    if slots.get("error"):
        return {"error": slots["error"]}
    repack = slots.get("repack") != "off"
    log(f"prefill and decode, {REPEATS} rounds, each request beside llama-server's ...")
    plain = bench_llama_server_speed(binary, model, work / "slots", {
        "speed": (prompts["speed"], N_DECODE), "quote": (prompts["quote"], N_DECODE),
        "chat": (prompts["chat"], N_DECODE)}, repack=repack, threads=threads, repeats=REPEATS,
        repeat_penalty=REPEAT_PENALTY, before_each=bw.plain)
    log("prompt lookup beside llama-server --spec-type ngram-simple ...")
    lookup = bench_llama_server_speed(binary, model, work / "slots", {
        "quote": (prompts["quote"], N_DECODE), "chat": (prompts["chat"], N_DECODE)},
        repack=repack, threads=threads, repeats=REPEATS, speculative=True, repeat_penalty=REPEAT_PENALTY,
        before_each=bw.lookup)
    return {"slots": slots, "plain": plain, "lookup": lookup}


def collect(model: str | None = None, llama_server: str | None = None, log=lambda *a: None) -> dict:
    """All the table's figures, as one JSON-ready dict (``format_compare`` prints it)."""
    from engine.core import Engine
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings
    from engine.speculative_setting import DEFAULT, LOOKUP
    from storage.paths import KVCACHE_DB
    from storage.prefix_store import PrefixStore

    model_path = Path(model) if model else default_model_path()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="branchwise-bench-") as tmp:
        work = Path(tmp)
        store = PrefixStore(work / KVCACHE_DB)
        engine = Engine(model_path, EngineSettings(n_ctx=4096, speculative=LOOKUP), store)
        threads, repack = engine.settings.threads, engine.model.repack.repack
        try:
            side = _Branchwise(engine, work, log)
            ls = None
            if llama_server:
                ls = _llama_server(llama_server, model_path, side, work, repack, threads, log)
            if ls is None or ls.get("error"):
                side = _Branchwise(engine, work, log) if ls else side  # a failed comparison may have run a part
                side.alone()
            bw = side.result()
            prompts = side.prompts
        finally:
            engine.close()
            store.close()
    out = {"model": model_path.name, "cpu_count": os.cpu_count(), "threads": threads,
           "speculative_default": DEFAULT, "repeats": REPEATS, "interleaved": bool(ls and not ls.get("error")),
           "branchwise": bw, "llama_server": ls,
           "load_before": [round(x, 2) for x in load_before],
           "load_after": [round(x, 2) for x in os.getloadavg()],
           "prompt_tokens": {k: len(v) for k, v in prompts.items()}}
    if ls and not ls.get("error"):
        for name in ("quote", "chat"):
            theirs = (ls.get("plain") or {}).get(name) or {}
            # Branchwise's plain reply against llama-server's plain reply, token for token
            bw[name]["same_as_llama_server"] = bool(theirs.get("ids")) and theirs["ids"] == bw[name]["ids"]
    for name in ("quote", "chat"):
        bw[name].pop("ids")
    for part in ("plain", "lookup"):
        for row in ((ls or {}).get(part) or {}).values():
            if isinstance(row, dict):
                row.pop("ids", None)
    return out


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def format_compare(r: dict) -> str:
    """The table, as text (one row a figure; ratio = Branchwise ÷ llama-server)."""
    from app.bench.store import restore_breakdown

    bw, ls = r["branchwise"], r.get("llama_server")
    ok = ls is not None and not ls.get("error")
    slots = ls["slots"] if ok else {}
    plain = ls.get("plain") or {} if ok else {}
    look = ls.get("lookup") or {} if ok else {}
    x, y = bw["restore"], bw.get("snapshot") or {}
    rows = [  # label, Branchwise, llama-server, unit, note
        (f"restore, warm ({x.get('tokens', 0):,} tokens, {x.get('kv_mb', 0)} MB)", x.get("total_ms"),
         slots.get("restore_ms"), "ms", "slot restore"),
        ("restore, cold page cache", x.get("cold_ms"), slots.get("cold_restore_ms"), "ms", "slot restore"),
        ("first-turn snapshot (empty store)", y.get("median_ms"), slots.get("save_ms"), "ms", "slot save"),
        (f"prefill ({r['prompt_tokens']['speed']:,} tokens)", bw["prefill"]["tok_s"],
         (plain.get("speed") or {}).get("prefill_tok_s"), "tok/s", "its timings"),
        (f"decode, plain ({bw['decode']['tokens']} tokens)", bw["decode"]["tok_s"],
         (plain.get("speed") or {}).get("decode_tok_s"), "tok/s", "its timings"),
    ]
    for name, label in (("quote", "quote a pasted text"), ("chat", "plain chat question")):
        q = bw[name]
        rows.append((f"decode, plain: {label}", q["plain_tok_s"], (plain.get(name) or {}).get("decode_tok_s"),
                     "tok/s", ""))
        theirs = look.get(name) or {}
        note = (f"{q['speedup']:.2f}× plain; accepted {q['accepted']}/{q['drafted']}; "
                f"same reply as plain: {'yes' if q['same_reply'] else 'NO'}")
        if theirs:
            note += f"; theirs {theirs.get('accepted', 0)}/{theirs.get('drafted', 0)}"
        rows.append((f"decode, lookup: {label}", q["lookup_tok_s"], theirs.get("decode_tok_s"), "tok/s", note))
    head = (f"Branchwise bench · {r['model']} · {r['threads']} of {r['cpu_count']} CPU threads (both) · "
            f"medians of {r['repeats']} · load average {r['load_before'][0]} → {r['load_after'][0]}")
    lines = [head, ""]
    if ok:
        lines.append(f"{'':44}{'Branchwise':>12}{'llama-server':>14}{'ratio':>8}")
    else:
        lines.append(f"{'':44}{'Branchwise':>12}")
    for label, a, b, unit, note in rows:
        fa = f"{a:,.1f} {unit}" if a is not None else "–"
        if ok:
            fb = f"{b:,.1f} {unit}" if b is not None else "–"
            lines.append(f"{label:44}{fa:>12}{fb:>14}{_ratio(a, b):>8}  {note}")
        else:
            extra = note if note and note not in ("slot restore", "slot save", "its timings") else ""
            lines.append(f"{label:44}{fa:>12}  {extra}".rstrip())
    lines.append("")
    lines.append(f"Restore breakdown (warm): {restore_breakdown(x)}.")
    sw = bw.get("switch") or {}
    if sw.get("tokens"):
        lines.append(f"Branch switch (two branches of the conversation above, sharing {sw['kept']:,} tokens up to a "
                     f"block start): {sw['median_ms']} ms to have {sw['tokens']:,} tokens in place, {sw['copied']:,} "
                     f"of them copied from the store; a whole restore of the same tokens: {sw['whole_ms']} ms.")
    if ok:
        lines.append(f"llama-server: -fa off, -t/-tb {r['threads']}, weight repacking {slots.get('repack', 'on')} "
                     f"({slots.get('repack_note', 'as Branchwise')}); lookup rows run --spec-type ngram-simple. "
                     f"Both decode at temperature 0 with repeat penalty {REPEAT_PENALTY} over the last 64 tokens. "
                     + ("Each Branchwise run ran next to the same run of llama-server's. " if r.get("interleaved") else "")
                     + "Ratio: Branchwise ÷ llama-server (times: lower is better; tok/s: higher is better).")
    elif ls is not None:
        lines.append(f"llama-server: not compared: {ls['error']}")
    else:
        lines.append("llama-server: not compared (pass --llama-server PATH to measure it in the same run).")
    return "\n".join(lines)


def run_compare(model: str | None = None, as_json: bool = False, llama_server: str | None = None) -> int:
    """``branchwise bench``: collect and print (a table, or JSON with ``as_json``); returns 0."""
    log = (lambda *a: None) if as_json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    r = collect(model, llama_server, log)
    print(json.dumps(r, indent=2) if as_json else format_compare(r))
    return 0
