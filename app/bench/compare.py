"""``branchwise bench [--llama-server PATH]``: one table, Branchwise beside llama.cpp's own
server, measured in the same run on the same model, prompts and thread count.

Rows (Branchwise's figure, llama-server's, and the ratio of the two):

* restore, warm and cold: the prefix store's end-to-end restore of a ~1,560-token
  conversation (``app.bench.store.bench_restore``) against llama-server's slot restore of
  the same token ids (``app.bench.llama_server``);
* first-turn snapshot: the same state into an empty store (median of 5) against slot save;
* prefill tokens/s and plain decode tokens/s: a ~530-token prompt, 96 tokens generated at
  temperature 0, Branchwise with speculative decoding off, against the server's own
  ``timings`` (``prompt_per_second``, ``predicted_per_second``) for the same token ids;
* speculative decode tokens/s on two workloads, Branchwise's default (prompt lookup,
  ``engine/speculative.py``) against llama-server ``--spec-type ngram-simple``:
  "quote" (a follow-up that asks for a verbatim quote of a pasted ~1,500-token text) and
  "chat" (a plain question). Each also states the speed-up over Branchwise's own plain
  decoding and whether the reply is token for token the plain one.

Speeds are medians of ``REPEATS`` runs, interleaved so that drifting load hits each alike.
Without ``--llama-server`` the table has the Branchwise column only. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPEATS = 3
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


def _branchwise(engine, work: Path, log) -> dict:
    """Every Branchwise figure of the table (see the module docstring)."""
    from app.bench.store import bench_restore, bench_snapshot, bench_switch
    from engine.chat_template import ChatMessage
    from engine.settings import SamplingParams

    spec = engine.speculation
    w = _workloads(engine)
    greedy = SamplingParams(temperature=0, max_tokens=N_DECODE, repeat_penalty=REPEAT_PENALTY)
    first = engine.generate(w["first"], SamplingParams(temperature=0, max_tokens=32))  # into the store
    history = [*w["first"], ChatMessage("assistant", first.text, first.token_ids)]
    quote = [*history, ChatMessage("user", QUOTE_ASK)]
    chat = [ChatMessage("user", CHAT_ASK)]
    restore_prompt = engine.prompt_tokens(quote)
    log("restore and snapshot ...")
    out: dict = {"restore": bench_restore(engine, restore_prompt),
                 "snapshot": bench_snapshot(engine, restore_prompt, work)}
    log("branch switch ...")
    out["switch"] = bench_switch(engine, history, quote)
    runs: dict[str, list] = {k: [] for k in ("speed", "quote_plain", "quote_lookup", "chat_plain", "chat_lookup")}
    log(f"prefill and decode, {REPEATS} rounds ...")
    for _ in range(REPEATS):
        engine.speculation = None
        runs["speed"].append(engine.generate(w["speed"], greedy, use_cache=False, snapshot=False))
        for name, msgs in (("quote", quote), ("chat", chat)):
            engine.speculation = None
            runs[f"{name}_plain"].append(engine.generate(msgs, greedy, snapshot=False))
            engine.speculation = spec
            runs[f"{name}_lookup"].append(engine.generate(msgs, greedy, snapshot=False))
    engine.speculation = spec
    med = statistics.median
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
    out["prompts"] = {"speed": engine.prompt_tokens(w["speed"]), "quote": engine.prompt_tokens(quote),
                      "chat": engine.prompt_tokens(chat), "restore": restore_prompt}
    return out


def _llama_server(binary: str, model: Path, bw: dict, work: Path, repack: bool, threads: int, log) -> dict:
    from app.bench.llama_server import bench_llama_server, bench_llama_server_speed

    prompts = bw["prompts"]
    log(f"llama-server slot save and restore ({binary}) ...")
    slots = bench_llama_server(binary, model, prompts["restore"], work / "slots", repack=repack, threads=threads)
    if slots.get("error"):
        return {"error": slots["error"]}
    repack = slots.get("repack") != "off"
    log("llama-server prefill and decode ...")
    plain = bench_llama_server_speed(binary, model, work / "slots", {
        "speed": (prompts["speed"], N_DECODE), "quote": (prompts["quote"], N_DECODE),
        "chat": (prompts["chat"], N_DECODE)}, repack=repack, threads=threads, repeats=REPEATS,
        repeat_penalty=REPEAT_PENALTY)
    log("llama-server --spec-type ngram-simple ...")
    lookup = bench_llama_server_speed(binary, model, work / "slots", {
        "quote": (prompts["quote"], N_DECODE), "chat": (prompts["chat"], N_DECODE)},
        repack=repack, threads=threads, repeats=REPEATS, speculative=True, repeat_penalty=REPEAT_PENALTY)
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
            bw = _branchwise(engine, work, log)
        finally:
            engine.close()
            store.close()
        ls = _llama_server(llama_server, model_path, bw, work, repack, threads, log) if llama_server else None
    prompts = bw.pop("prompts")
    out = {"model": model_path.name, "cpu_count": os.cpu_count(), "threads": threads,
           "speculative_default": DEFAULT, "repeats": REPEATS, "branchwise": bw, "llama_server": ls,
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
                     "Ratio: Branchwise ÷ llama-server (times: lower is better; tok/s: higher is better).")
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
