"""``branchwise bench --threads``: prefill and decode speed of the default model for each CPU
thread count from 1 to the logical core count, to choose the default thread count.

Runs are interleaved (1, 2, …, 1, 2, …) so drifting load hits every count alike, and each
figure is the best run. The load average before and after is printed with the figures:
they mean little on a busy machine.
"""

from __future__ import annotations

import json
import os
import time


def _speeds(llama, prompt: list[int], n_decode: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) for ``prompt`` then ``n_decode`` single-token decodes
    (of prompt tokens: the speed does not depend on which token is fed)."""
    import llama_cpp

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llama.ctx), True)
    llama.n_tokens = 0
    t = time.perf_counter()
    llama.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n_decode):
        llama.eval([prompt[1 + i % (len(prompt) - 1)]])
    return prefill, n_decode / (time.perf_counter() - t)


def run_threads_bench(as_json: bool = False, n_prompt: int = 512, n_decode: int = 64, rounds: int = 3) -> int:
    from engine.cpu import load_llama
    from engine.machine import physical_cores
    from engine.model_file import default_model_path

    counts = list(range(1, (os.cpu_count() or 1) + 1))
    load_before = os.getloadavg()
    models = {n: load_llama(default_model_path(), n_ctx=n_prompt + n_decode + 16, n_batch=512, n_ubatch=512,
                            n_threads=n, n_threads_batch=n, verbose=False)[0] for n in counts}
    prompt = models[1].tokenize(("The quick brown fox jumps over the lazy dog. " * 200).encode(),
                                add_bos=True)[:n_prompt]
    best = {n: [0.0, 0.0] for n in counts}
    for _ in range(rounds):
        for n in counts:
            prefill, decode = _speeds(models[n], prompt, n_decode)
            best[n] = [max(best[n][0], prefill), max(best[n][1], decode)]
    for llama in models.values():
        llama.close()
    rows = [{"threads": n, "prefill_tok_s": round(best[n][0], 1), "decode_tok_s": round(best[n][1], 1)}
            for n in counts]
    facts = {"logical_cores": os.cpu_count(), "physical_cores": physical_cores(),
             "load_before": [round(x, 2) for x in load_before],
             "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    if as_json:
        print(json.dumps(facts))
        return 0
    print(f"Threads · default model · prefill {n_prompt} tokens, decode {n_decode} · best of {rounds} · "
          f"{facts['physical_cores']} physical / {facts['logical_cores']} logical cores · load average "
          f"{facts['load_before'][0]} before, {facts['load_after'][0]} after")
    print(f"{'threads':>8}{'prefill tok/s':>15}{'decode tok/s':>14}")
    for r in rows:
        print(f"{r['threads']:>8}{r['prefill_tok_s']:>15,.1f}{r['decode_tok_s']:>14,.1f}")
    return 0
