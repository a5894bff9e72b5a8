"""Chat with a document, measured: ``python -m tools.documents_bench [--pdf FILE] [--threads N]``.

On the default model (8,192-token context), with a temporary prefix store, on the engine path
the window's engine process runs (``engine.core.Engine``, ``engine.prewarm.Prewarmer``):

1. the first question, zero-wait off: nothing stored yet, the whole prompt is prefilled;
2. the first question, zero-wait on, in a fresh engine and store: the document is prewarmed
   when it is attached (``Prewarmer.run`` with the rendered message as the draft), then at
   each word of the question as it is typed, then the whole message as sent (the window's
   last-key prewarm), and the request follows;
3. a follow-up question on the same engine (the live context holds the conversation);
4. a follow-up in a new process (a spawned child: nothing live, the prefix store restores);
5. a branch from the first question (the first question edited: the document restored, the
   new question prefilled);

and for each the cold prefill of the same prompt (``use_cache=False`` after
``reset_context``: nothing live, no store). Prints one line per case: TTFT, cold TTFT and
their ratio, restored/prefilled tokens, and the load average before and after (the figures
of a busy machine are noisy: the ratios are what matters). Without ``--pdf`` it writes a
PDF of about 5,000 tokens (public-domain text, ``tests/data/documents/gettysburg.txt``,
followed by numbered minutes) with fpdf2.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

from engine.chat_template import ChatMessage
from engine.settings import EngineSettings, SamplingParams

SAMPLING = SamplingParams(temperature=0.0, max_tokens=16, seed=1)
Q1, Q2, Q3, Q1B = ("Who gave the address at the start of this document?", "And in which year was it given?",
                   "What did the committee decide about the harbour?", "Summarise the address in one sentence.")


def make_pdf(path: Path, target_chars: int = 19_000) -> Path:
    """A PDF of about ``target_chars`` characters (about 5,000 tokens of English)."""
    from fpdf import FPDF

    text = (Path(__file__).resolve().parent.parent / "tests" / "data" / "documents" / "gettysburg.txt").read_text()
    paras = [p.strip() for p in text.split("\n\n")]
    n = 1
    while sum(len(p) for p in paras) < target_chars:
        paras.append(f"Minute {n}. The harbour committee met on day {n} and reviewed the accounts of the "
                     f"lighthouse, the pier repairs (estimate {n * 37} pounds) and the ferry timetable; "
                     f"member {n % 7 + 1} proposed a toll of {n % 5 + 1} pence, which was deferred.")
        n += 1
    pdf = FPDF()
    pdf.set_font("Helvetica", size=10)
    pdf.add_page()
    for p in paras:
        pdf.multi_cell(0, 5, p, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(2)
    pdf.output(str(path))
    return path


def _engine(model, store_dir: Path | None, threads: int):
    from engine.core import Engine
    from storage.prefix_store import PrefixStore

    store = PrefixStore(store_dir / "kv.sqlite3") if store_dir is not None else None
    return Engine(model, EngineSettings(n_ctx=8192, n_threads=threads), store)


def _row(stats) -> dict:
    return {k: getattr(stats, k) for k in ("prompt_tokens", "restored_tokens", "prefilled_tokens", "ttft_ms")}


def _restart_child(model: str, store_dir: str, threads: int, messages: list[dict], out) -> None:
    engine = _engine(model, Path(store_dir), threads)
    r = engine.generate([ChatMessage(**m) for m in messages], SAMPLING, snapshot=False)
    out.send(_row(r.stats))
    engine.close()


def measure(pdf: Path, threads: int) -> dict:
    """Every case's stats (see the module docstring); tokens and ms."""
    from engine.documents import attach_file
    from engine.documents.attach import attached_text
    from engine.documents.render import render_message
    from engine.model_file import default_model_path
    from engine.prewarm import Prewarmer

    model = str(default_model_path())
    doc = attach_file(pdf)
    block = [attached_text(doc)]
    first = [ChatMessage("user", render_message(Q1, block))]
    out: dict = {"load_before": os.getloadavg(), "pdf": str(pdf), "pages": doc.pages}
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.mkdir()
        b.mkdir()
        engine = _engine(model, a, threads)
        out["document_tokens"] = len(engine.prompt_tokens(first)) - len(engine.prompt_tokens([ChatMessage("user", Q1)]))
        r1 = engine.generate(first, SAMPLING)
        out["first_off"] = _row(r1.stats)
        engine.snapshot(r1.stats)
        follow = first + [ChatMessage("assistant", r1.text, r1.token_ids), ChatMessage("user", Q2)]
        r2 = engine.generate(follow, SAMPLING)
        out["follow_up"] = _row(r2.stats)
        engine.snapshot(r2.stats)
        restart = follow + [ChatMessage("assistant", r2.text, r2.token_ids), ChatMessage("user", Q3)]
        branch = [ChatMessage("user", render_message(Q1B, block))]
        rb = engine.generate(branch, SAMPLING)
        out["branch"] = _row(rb.stats)
        colds = {}
        for name, msgs in (("first_off", first), ("follow_up", follow), ("restart", restart), ("branch", branch)):
            engine.reset_context()
            colds[name] = _row(engine.generate(msgs, SAMPLING, use_cache=False).stats)
        out["cold"] = colds
        engine.close()
        ctx = multiprocessing.get_context("spawn")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_restart_child, args=(model, str(a), threads,
                                                          [m.to_dict() for m in restart], send))
        child.start()
        out["restart"] = recv.recv()
        child.join()
        fresh = _engine(model, b, threads)
        warm = Prewarmer(fresh)
        attached = render_message("", block)  # attached, nothing typed yet
        steps = [warm.run([], attached, complete=False).to_dict()]
        words = Q1.split(" ")
        for i in range(1, len(words) + 1):  # a prewarm per word typed
            steps.append(warm.run([], render_message(" ".join(words[:i]) + " ", block), complete=False).to_dict())
        steps.append(warm.run([], render_message(Q1, block), complete=True).to_dict())
        r_on = fresh.generate(first, SAMPLING)
        out["first_on"] = {**_row(r_on.stats), "prewarmed_tokens": sum(s["prefilled_tokens"] for s in steps),
                           "same_reply": r_on.text == r1.text}
        fresh.close()
    out["load_after"] = os.getloadavg()
    return out


def report(r: dict) -> str:
    """The README's table."""
    lines = [f"{r['pdf']}: {r['pages']} pages, {r['document_tokens']:,} tokens of document",
             "| case | TTFT | cold prefill of the same prompt | share of cold | restored / prefilled tokens |",
             "| --- | ---: | ---: | ---: | --- |"]
    names = {"first_off": "first question, zero-wait off", "first_on": "first question, zero-wait on",
             "follow_up": "follow-up", "restart": "follow-up in a new process", "branch": "branch from the first question"}
    for key, label in names.items():
        s = r[key]
        cold = r["cold"]["first_off" if key == "first_on" else key]
        lines.append(f"| {label} | {s['ttft_ms']:,.0f} ms | {cold['ttft_ms']:,.0f} ms | "
                     f"{100 * s['ttft_ms'] / cold['ttft_ms']:.1f} % | {s['restored_tokens']:,} / "
                     f"{s['prefilled_tokens']:,} of {s['prompt_tokens']:,} |")
    lines.append(f"load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after; "
                 f"zero-wait on prewarmed {r['first_on']['prewarmed_tokens']:,} tokens while the question was "
                 f"typed; same reply on and off: {'yes' if r['first_on']['same_reply'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the table (``--json``: the raw figures)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdf", type=Path, help="a PDF (default: one of about 5,000 tokens, written here)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pdf = args.pdf or make_pdf(Path(tmp) / "document.pdf")
        r = measure(pdf, args.threads)
        if args.pdf is None:
            r["pdf"] = "the generated document.pdf"
    print(json.dumps(r, indent=1) if args.json else report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
