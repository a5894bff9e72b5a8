"""Measure how often a reply after a KV restore differs from one computed from scratch.

    python -m tools.flash_attn_exactness                # flash attention on, f16 KV
    python -m tools.flash_attn_exactness --kv-type q8_0
    python -m tools.flash_attn_exactness --no-flash-attn
    python -m tools.flash_attn_exactness --n-batch 63   # every batch below the FA tile size

For each of ``--prompts`` prompts (the first 120, 240, ... characters of README.md plus
"What is this about?", the minimal case of issue #11.5), at temperature 0:

1. a first turn stores the prompt's and reply's KV in a fresh prefix store (as ``chat``);
2. *regenerate*: the live context is dropped and the same prompt is answered again, its
   prefix restored from the store; and once more with the cache off (``--no-cache``);
3. *second turn*: a follow-up message is answered with the cache (the first turn restored,
   its reply's recomputed KV included) and without.

It prints how many prompts gave different token ids in each case, and where they split.
Timing figures are not printed: this measures exactness only.

Where the difference comes from (llama.cpp ``ggml/src/ggml-cpu/ops.cpp``,
``ggml_compute_forward_flash_attn_ext_f16``): with an F16 or F32 KV cache, a batch of at
least ``GGML_FA_TILE_Q`` (64, ``ggml-cpu/common.h``) query rows goes through the *tiled*
kernel (``..._flash_attn_ext_tiled``, FP32 accumulation over 64-wide KV tiles), a smaller
batch through ``..._f16_one_chunk`` (one row at a time, V accumulated in FP16), and a
single token over 512 or more cells through a split-KV path. A cold prefill computes the
last prompt tokens inside a large batch (tiled); after a restore they are prefilled in a
batch of two (one_chunk): the same tokens get slightly different attention outputs, and at
temperature 0 a near-tie between two tokens can then flip. With a q8_0 KV cache neither
special path applies (``kv_is_f32_or_f16`` is false), every batch size uses one_chunk, row
by row, so restores are exact: that is why q8_0 matched.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _prompts(n: int) -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return [readme[: 120 * (i + 1)] + "\nWhat is this about?" for i in range(n)]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(model: str | None, n_prompts: int, max_tokens: int, kv_type: str, flash_attn: bool,
            n_batch: int, threads: int, second_turn: bool = True, on_result=None) -> dict:
    from engine.chat_template import ChatMessage
    from engine.core import Engine
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings, SamplingParams
    from storage.prefix_store import PrefixStore

    settings = EngineSettings(type_k=kv_type, type_v=kv_type, flash_attn=flash_attn or kv_type != "f16",
                              n_ctx=4096, n_batch=n_batch, n_threads=threads)
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens)
    results = {"regenerate": [], "second_turn": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = PrefixStore(Path(tmp) / "kvcache.sqlite3", budget_bytes=4 << 30)
        engine = Engine(model or default_model_path(), settings, store)
        try:
            for prompt in _prompts(n_prompts):
                msgs = [ChatMessage("user", prompt)]
                first = engine.generate(msgs, sampling, use_cache=True, snapshot=True)
                engine.reset_context()
                cached = engine.generate(msgs, sampling, use_cache=True, snapshot=False)
                restored = cached.stats.restored_tokens
                cold = engine.generate(msgs, sampling, use_cache=False, snapshot=False)
                results["regenerate"].append({
                    "prompt_tokens": cached.stats.prompt_tokens, "restored_tokens": restored,
                    "split_at": _first_difference(cached.token_ids, cold.token_ids)})
                if on_result:
                    on_result("regenerate", results["regenerate"][-1])
                if not second_turn:
                    continue
                follow = [*msgs, ChatMessage("assistant", first.text, first.token_ids),
                          ChatMessage("user", "Say that again in one sentence.")]
                engine.reset_context()
                cached2 = engine.generate(follow, sampling, use_cache=True, snapshot=False)
                cold2 = engine.generate(follow, sampling, use_cache=False, snapshot=False)
                results["second_turn"].append({
                    "prompt_tokens": cached2.stats.prompt_tokens, "restored_tokens": cached2.stats.restored_tokens,
                    "split_at": _first_difference(cached2.token_ids, cold2.token_ids)})
                if on_result:
                    on_result("second_turn", results["second_turn"][-1])
                engine.reset_context()
        finally:
            engine.close()
    summary = {k: sum(r["split_at"] is not None for r in v) for k, v in results.items() if v}
    return {"kv_type": kv_type, "flash_attn": settings.flash_attn, "n_batch": n_batch,
            "prompts": n_prompts, "max_tokens": max_tokens, "differed": summary, "runs": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.flash_attn_exactness", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a GGUF model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--prompts", type=int, default=17)
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16")
    p.add_argument("--no-flash-attn", action="store_true", help="flash attention off (f16 only)")
    p.add_argument("--n-batch", type=int, default=512, help="prefill batch in tokens (default 512)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-second-turn", action="store_true", help="measure regenerate only (faster)")
    p.add_argument("--verbose", action="store_true", help="print each prompt's result as it comes (stderr)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    def show(kind: str, row: dict) -> None:
        print(f"{kind}: {json.dumps(row)}", file=sys.stderr, flush=True)

    r = measure(args.model, args.prompts, args.max_tokens, args.kv_type, not args.no_flash_attn,
                args.n_batch, args.threads, second_turn=not args.no_second_turn,
                on_result=show if args.verbose else None)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"flash attention {'on' if r['flash_attn'] else 'off'}, KV {r['kv_type']}, n_batch {r['n_batch']}, "
          f"{r['prompts']} prompts, {r['max_tokens']} tokens, temperature 0")
    for kind, label in (("regenerate", "regenerate (prefix restored)"), ("second_turn", "second turn (resume)")):
        if kind not in r["differed"]:
            continue
        splits = [x["split_at"] for x in r["runs"][kind] if x["split_at"] is not None]
        where = f"; split at token {', '.join(map(str, splits))}" if splits else ""
        print(f"  {label:30} differed from an uncached reply on {r['differed'][kind]} of {r['prompts']}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
