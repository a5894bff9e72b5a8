"""``branchwise bench --cpu``: what weight repacking costs or buys on this CPU.

Prefill and decode speed (tokens/s) of the default model (Q4_1) and of a Q4_0 copy of it (made with
``llama_model_quantize``, where llama.cpp's repacking applies on AVX2 and NEON), each
loaded with llama.cpp's extra buffer types on and off (engine/cpu.py). Each figure is the
best of several interleaved runs, so a busy machine disturbs it less.
"""

from __future__ import annotations

import ctypes
import json
import os
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


def speeds(model_path: Path, repack: bool, n_tokens: int, n_decode: int, runs: int) -> tuple[float, float]:
    """Best prefill and decode speed (tokens/s) of ``runs`` runs in one context: ``n_tokens``
    prompt tokens in one batch, then ``n_decode`` one-token decodes."""
    import llama_cpp

    from engine.cpu import load_llama

    llama, _ = load_llama(model_path, force=repack, n_ctx=n_tokens + n_decode + 64, n_batch=512,
                          n_ubatch=512, verbose=False)
    tokens = llama.tokenize(("The quick brown fox jumps over the lazy dog. " * 200).encode(), add_bos=True)[:n_tokens]
    prefill = decode = 0.0
    mem = llama_cpp.llama_get_memory(llama.ctx)
    for _ in range(runs):
        llama_cpp.llama_memory_clear(mem, True)
        llama.n_tokens = 0
        t = time.perf_counter()
        llama.eval(tokens)
        prefill = max(prefill, n_tokens / (time.perf_counter() - t))
        t = time.perf_counter()
        for i in range(n_decode):
            llama.eval([tokens[1 + i % (len(tokens) - 1)]])
        decode = max(decode, n_decode / (time.perf_counter() - t))
    llama.close()
    return prefill, decode


def run_cpu_bench(as_json: bool = False, n_tokens: int = 512, n_decode: int = 64, rounds: int = 3) -> int:
    from engine import cpu
    from engine.model_file import default_model_path

    info = cpu.system_info()
    if cpu.has_amx_kernels(info):
        print("This llama.cpp build has AMX kernels (AMX_INT8 = 1), which crash on some CPUs: "
              "repacking is not measured on it. Build it with the flags in pyproject.toml "
              "([tool.uv.extra-build-variables]) and run the bench again.")
        return 1
    default = default_model_path()
    with tempfile.TemporaryDirectory(prefix="branchwise-bench-cpu-") as tmp:
        q4_0 = quantize_q4_0(default, Path(tmp) / "SmolLM2-135M-Instruct.Q4_0.gguf")
        models = {"Q4_1 (default)": default, "Q4_0": q4_0}
        best: dict[tuple[str, bool], list[float]] = {}
        for _ in range(rounds):  # interleaved, so drifting load hits every configuration alike
            for name, path in models.items():
                for repack in (True, False):
                    prefill, decode = speeds(path, repack, n_tokens, n_decode, runs=2)
                    old = best.get((name, repack), [0.0, 0.0])
                    best[name, repack] = [max(old[0], prefill), max(old[1], decode)]
    rows = [{"model": name,
             "prefill_repack_on": round(best[name, True][0], 1), "prefill_repack_off": round(best[name, False][0], 1),
             "decode_repack_on": round(best[name, True][1], 1), "decode_repack_off": round(best[name, False][1], 1)}
            for name in models]
    load = [round(x, 2) for x in os.getloadavg()]
    if as_json:
        print(json.dumps({"system_info": info, "prefill_tokens": n_tokens, "decode_tokens": n_decode,
                          "load_after": load, "rows": rows}))
        return 0
    print(f"Prefill {n_tokens} tokens, decode {n_decode}, best of {rounds * 2} runs (tokens/s) · "
          f"load average {load[0]} after · {info}")
    print(f"{'model':<16}{'prefill on':>12}{'off':>9}{'off/on':>8}{'decode on':>12}{'off':>9}{'off/on':>8}")
    for r in rows:
        print(f"{r['model']:<16}{r['prefill_repack_on']:>12,.1f}{r['prefill_repack_off']:>9,.1f}"
              f"{r['prefill_repack_off'] / r['prefill_repack_on']:>8.2f}"
              f"{r['decode_repack_on']:>12,.1f}{r['decode_repack_off']:>9,.1f}"
              f"{r['decode_repack_off'] / r['decode_repack_on']:>8.2f}")
    return 0
