"""Five turns with a reasoning model, with and without zero-wait: ``python -m tools.reasoning_bench``.

Runs through the engine process the window uses (``engine.worker.EngineProcess``, the same
requests the window sends), on the default model made to think (tools/think_model.py: a
template that opens ``<think>`` and a grammar that forces ``thinking</think>answer``), on a
fresh temporary data folder for each pass, at temperature 0:

* zero-wait on: after each reply (its KV stored), the prewarm the window sends when a
  reply is shown (``PrewarmRequest`` with an empty draft, engine/prewarm.py) brings the
  re-rendered history, the earlier answers without their thinking, into the live
  context while the user reads; then the next message is sent;
* zero-wait off: the next message is sent right after the reply's KV was stored.

Prints per turn: the prompt's tokens, what was restored (and from where: the live
context or the prefix store), what the prewarm had ready before the request
(``prepared_tokens``), what the request prefilled, and the TTFT (request to first token,
thinking included, in the engine). ``--threads`` (default 1) and ``--system-words`` (the
length of the system prompt, default 300 words) set the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from engine import events as ev
from engine.chat_template import ChatMessage
from engine.reasoning import GRAMMAR_ENV
from tools.think_model import grammar_file, think_copy

QUESTIONS = ["What is the capital of France?", "And of Spain?", "Which of the two is larger?",
             "Name a river in the larger one.", "Thank you. Summarise the answers."]
SYSTEM_SENTENCE = ("You are a careful geography tutor who answers in short plain sentences and checks "
                   "each fact before giving it. ")
SAMPLING = {"temperature": 0.0, "max_tokens": 120, "seed": 1, "repeat_penalty": 1.0}
TIMEOUT_S = 600


def _wait(proc, kinds: tuple, rid: int | None = None):
    """The next event of one of ``kinds`` (for request ``rid``); raises on an error event."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        e = proc.recv(timeout=1.0)
        if e is None:
            continue
        if isinstance(e, (ev.ErrorEvent, ev.LoadFailedEvent)):
            raise SystemExit(f"the engine failed: {e.message}")
        if isinstance(e, kinds) and (rid is None or getattr(e, "id", None) == rid):
            return e
    raise SystemExit("the engine did not answer in time")


def run_pass(model: Path, zero_wait: bool, threads: int, system: str) -> list[dict]:
    """One 5-turn conversation on a fresh data folder; a row of figures per turn."""
    from engine.worker import EngineProcess

    rows = []
    with tempfile.TemporaryDirectory(prefix="branchwise-reasoning-") as tmp:
        proc = EngineProcess(Path(tmp), Path(tmp) / "engine.log")
        proc.start()
        try:
            proc.send(ev.LoadRequest(str(model), {"n_ctx": 4096, "n_threads": threads}))
            _wait(proc, (ev.LoadedEvent,))
            history = [ChatMessage("system", system)]
            rid = 0
            for turn, question in enumerate(QUESTIONS, 1):
                history.append(ChatMessage("user", question))
                rid += 1
                proc.send(ev.GenerateRequest(rid, list(history), dict(SAMPLING)))
                done = _wait(proc, (ev.DoneEvent,), rid)
                _wait(proc, (ev.SnapshotEvent,), rid)
                s = done.stats
                rows.append({"turn": turn, "prompt": s["prompt_tokens"], "restored": s["restored_tokens"],
                             "source": s.get("restore_source") or "-", "prepared": s.get("prepared_tokens", 0),
                             "prefilled": s["prefilled_tokens"], "ttft_ms": s["ttft_ms"],
                             "reasoning_tokens": s.get("reasoning_tokens", 0), "answer": done.text})
                history.append(ChatMessage("assistant", done.text, done.token_ids, done.reasoning))
                if zero_wait:  # the window's prewarm when the reply is shown: the path, nothing typed
                    rid += 1
                    proc.send(ev.PrewarmRequest(rid, list(history), ""))
                    _wait(proc, (ev.PrewarmEvent,), rid)
        finally:
            proc.stop()
    return rows


def table(on: list[dict], off: list[dict]) -> str:
    """The Markdown table of both passes, one line per turn."""
    lines = ["| turn | prompt tokens | zero-wait on: restored | ready before the request | prefilled | TTFT ms "
             "| zero-wait off: restored | prefilled | TTFT ms |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for a, b in zip(on, off):
        lines.append(f"| {a['turn']} | {a['prompt']:,} | {a['restored']:,} ({a['source']}) | {a['prepared']:,} "
                     f"| {a['prefilled']:,} | {a['ttft_ms']:.0f} | {b['restored']:,} ({b['source']}) "
                     f"| {b['prefilled']:,} | {b['ttft_ms']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.reasoning_bench", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--system-words", type=int, default=300)
    args = p.parse_args(argv)
    from engine.model_file import default_model_path

    n = max(1, args.system_words // len(SYSTEM_SENTENCE.split()))
    system = (SYSTEM_SENTENCE * n).strip()
    with tempfile.TemporaryDirectory(prefix="branchwise-think-model-") as tmp:
        model = think_copy(default_model_path(), Path(tmp) / "think.gguf")
        os.environ[GRAMMAR_ENV] = str(grammar_file(Path(tmp)))  # the engine processes read it as they start
        load = os.getloadavg()
        on = run_pass(model, True, args.threads, system)
        off = run_pass(model, False, args.threads, system)
        load_after = os.getloadavg()
    if [r["answer"] for r in on] != [r["answer"] for r in off]:
        print("warning: the two passes gave different replies", file=sys.stderr)
    print(table(on, off))
    print(f"\nthinking tokens per reply: {', '.join(str(r['reasoning_tokens']) for r in on)}; "
          f"{args.threads} thread(s); load average {load[0]:.1f} before, {load_after[0]:.1f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
