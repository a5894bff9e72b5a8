"""``branchwise bench --cpu``: what weight repacking costs or buys on this CPU.

Prefill speed (tokens/s) of the default model (Q4_1) and of a Q4_0 copy of it (made with
``llama_model_quantize``, where llama.cpp's repacking applies on AVX2 and NEON), each
loaded with llama.cpp's extra buffer types on and off (engine/cpu.py). Each figure is the
best of several interleaved runs, so a busy machine disturbs it less.
"""

from __future__ import annotations

import ctypes
import json
import tempfile
import time
from pathlib import Path


def quantize_q4_0(source: Path, target: Path) -> Path:
    """Write a Q4_0 copy of ``source`` (any GGUF llama.cpp can requantize) to ``target``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 0
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) for {source}")
    return target


def prefill_tokens_per_s(model_path: Path, repack: bool, n_tokens: int, runs: int) -> list[float]:
    """Prefill ``n_tokens`` tokens ``runs`` times in one context; tokens/s of each run."""
    import llama_cpp

    from engine.cpu import model_params_with_repack

    with model_params_with_repack(repack):
        llama = llama_cpp.Llama(str(model_path), n_ctx=n_tokens + 64, n_batch=512, n_ubatch=512, verbose=False)
    tokens = llama.tokenize(("The quick brown fox jumps over the lazy dog. " * 200).encode(), add_bos=True)[:n_tokens]
    out = []
    mem = llama_cpp.llama_get_memory(llama.ctx)
    for _ in range(runs):
        llama_cpp.llama_memory_clear(mem, True)
        llama.n_tokens = 0
        t = time.perf_counter()
        llama.eval(tokens)
        out.append(n_tokens / (time.perf_counter() - t))
    llama.close()
    return out


def run_cpu_bench(as_json: bool = False, n_tokens: int = 512, rounds: int = 3) -> int:
    from engine import cpu
    from engine.model_file import default_model_path

    default = default_model_path()
    with tempfile.TemporaryDirectory(prefix="branchwise-bench-cpu-") as tmp:
        q4_0 = quantize_q4_0(default, Path(tmp) / "SmolLM2-135M-Instruct.Q4_0.gguf")
        models = {"Q4_1 (default)": default, "Q4_0": q4_0}
        best: dict[tuple[str, bool], float] = {}
        for _ in range(rounds):  # interleaved, so drifting load hits every configuration alike
            for name, path in models.items():
                for repack in (True, False):
                    speed = max(prefill_tokens_per_s(path, repack, n_tokens, runs=2))
                    best[name, repack] = max(best.get((name, repack), 0.0), speed)
    rows = [{"model": name, "repack_on": round(best[name, True], 1), "repack_off": round(best[name, False], 1),
             "off_vs_on": round(best[name, False] / best[name, True], 3)} for name in models]
    if as_json:
        print(json.dumps({"system_info": cpu.system_info(), "prefill_tokens": n_tokens, "rows": rows}))
        return 0
    print(f"Prefill speed, {n_tokens} tokens, best of {rounds * 2} runs (tokens/s) · {cpu.system_info()}")
    print(f"{'model':<16}{'repack on':>12}{'repack off':>12}{'off/on':>9}")
    for r in rows:
        print(f"{r['model']:<16}{r['repack_on']:>12,.1f}{r['repack_off']:>12,.1f}{r['off_vs_on']:>9.2f}")
    return 0
