"""``branchwise --self-test``: prove an installed copy works, with no window.

Loads the bundled model, runs one short chat turn and one resume through the prefix
store in a temporary data folder, prints a summary and exits 0 (1 on any failure).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def run_self_test() -> int:
    from engine.chat_template import ChatMessage
    from engine.core import Engine
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings, SamplingParams
    from storage.prefix_store import PrefixStore

    from engine import cpu

    for name, value in cpu.build_versions().items():
        print(f"{name:<17}{value}")
    print(f"{'llama.cpp system':<17}{cpu.system_info()}")
    sp = SamplingParams(temperature=0, max_tokens=16)
    question = "Name three colours of the rainbow. " * 8
    with tempfile.TemporaryDirectory(prefix="branchwise-selftest-") as tmp:
        t = time.perf_counter()
        model = default_model_path()
        store = PrefixStore(Path(tmp) / "kvcache.sqlite3")
        engine = Engine(model, EngineSettings(n_ctx=2048), store)
        load_s = time.perf_counter() - t
        first = engine.generate([ChatMessage("user", question)], sp)
        engine.close()
        # A second engine, as after a restart: the turn must resume from the store.
        engine = Engine(model, EngineSettings(n_ctx=2048), store)
        msgs = [ChatMessage("user", question), ChatMessage("assistant", first.text, first.token_ids),
                ChatMessage("user", "And one more?")]
        resumed = engine.generate(msgs, sp)
        cold = engine.generate(msgs, sp, use_cache=False)
        engine.close()
        store.close()
    ok = resumed.stats.restored_tokens > 0 and resumed.token_ids == cold.token_ids and first.token_ids
    print(f"model            {model.name} (loaded in {load_s:.2f} s)")
    print(f"weight repacking {engine.model.facts.repack}")
    print(f"first turn       {first.stats.prompt_tokens} prompt tokens, TTFT {first.stats.ttft_ms:.0f} ms, "
          f"reply {first.text.strip()[:60]!r}")
    print(f"resume           restored {resumed.stats.restored_tokens} of {resumed.stats.prompt_tokens} tokens "
          f"in {resumed.stats.restore_ms:.1f} ms, TTFT {resumed.stats.ttft_ms:.0f} ms "
          f"(without the cache {cold.stats.ttft_ms:.0f} ms)")
    print(f"same reply as without the cache: {'yes' if resumed.token_ids == cold.token_ids else 'NO'}")
    print("self-test passed" if ok else "self-test FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_self_test())
