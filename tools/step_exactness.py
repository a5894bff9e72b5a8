"""Do one-token decode steps and verification batches compute the same logits?

    python -m tools.step_exactness [MODEL.gguf] [--threads 1,2] [--positions 24]

Speculative decoding (engine/speculative.py) checks drafted tokens in one batch of two or
more. Its reply at temperature 0 is the reply of plain decoding only when llama.cpp
computes every position of such a batch bit for bit as a one-token step would. This
measures that on the llama.cpp this environment has, for a model (default: the embedded
one), with weight repacking on and off:

1. a ~300-token prompt is prefilled, then ``--positions`` greedy tokens are decoded one
   token a step, keeping the logits of each step;
2. the same tokens are evaluated after the prompt in batches of 2, 3, 4, 5, 8, 16 and all
   (``logits_all``), and each position's logits are compared with the step's.

It prints, per batch size, how many positions were equal bit for bit and the largest
difference of a logit elsewhere, and the build's llama.cpp system info (``LLAMAFILE = 1``
means batches of two or more go through llamafile's sgemm, which one-token steps never
use). Nothing is asserted; README "Speculative decoding" quotes its figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BATCH_SIZES = (2, 3, 4, 5, 8, 16)


def measure(model: Path, threads: int, repack: bool, positions: int) -> dict:
    """``{batch size: (equal positions, positions, largest difference)}`` for one load."""
    import llama_cpp
    import numpy as np

    from engine.cpu import load_llama

    llama, _ = load_llama(model, force=repack, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False, flash_attn=False)
    try:
        text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")[:4000]
        prompt = llama.tokenize(text.encode(), add_bos=True)[:300]
        mem = llama_cpp.llama_get_memory(llama.ctx)

        def restart() -> None:
            llama_cpp.llama_memory_clear(mem, True)
            llama.n_tokens = 0
            llama.eval(prompt)

        restart()
        steps, tokens = [], []
        for _ in range(positions):
            logits = np.array(llama.scores[llama.n_tokens - 1], dtype=np.float32)
            steps.append(logits)
            tokens.append(int(np.argmax(logits)))
            llama.eval([tokens[-1]])
        out = {}
        for size in (*BATCH_SIZES, positions - 1):
            restart()
            diffs = [float(np.abs(np.asarray(llama.scores[llama.n_tokens - 1]) - steps[0]).max())]
            seq, i = tokens[: positions - 1], 0
            while i < len(seq):
                chunk = seq[i : i + size]
                if len(seq) - (i + len(chunk)) == 1:  # never leave a batch of one
                    chunk = seq[i : i + size + 1]
                p0 = llama.n_tokens
                llama.eval(chunk)
                diffs += [float(np.abs(np.asarray(llama.scores[p0 + j]) - steps[i + j + 1]).max())
                          for j in range(len(chunk))]
                i += len(chunk)
            out[size] = (sum(d == 0 for d in diffs), len(diffs), round(max(diffs), 4))
        return out
    finally:
        llama.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.step_exactness", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    parser.add_argument("--positions", type=int, default=24, help="greedy tokens compared (default 24)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    import llama_cpp

    from engine.model_file import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for repack in (True, False):
            rows.append({"threads": threads, "repack": repack,
                         "batches": measure(model, threads, repack, args.positions)})
    if args.json:
        print(json.dumps({"model": model.name, "system_info": info, "rows": rows}))
        return 0
    print(f"{model.name} · {info}")
    print("batch size: positions equal bit for bit to a one-token step / positions (largest logit difference)")
    for r in rows:
        cells = "  ".join(f"{size}: {eq}/{n} ({diff})" for size, (eq, n, diff) in r["batches"].items())
        print(f"  threads {r['threads']}, repack {'on' if r['repack'] else 'off'}:  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
