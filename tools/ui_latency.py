"""How long the UI thread is ever busy while a reply streams: ``python -m tools.ui_latency``.

Opens the real window offscreen on a temporary data folder, asks for a long reply
(default 400 tokens, temperature 0) and, while it streams, runs a 5 ms heartbeat timer
on the UI thread. A gap between two beats longer than the interval is time the event
loop could not run: a blocking call. Prints the longest gap, the 99th percentile and
how many gaps exceeded 50 ms (the target is none), plus ``--json``.

With ``--big``, each phase also gives the most CPU time the UI thread used in one gap
between beats (``max_cpu_ms``, and how many gaps used over 50 ms): a stall much longer
than that was time the thread waited (for the GIL, on a pipe, or for a core on a machine
busy with other programs), not work of its own.

``--big`` measures the same for a 1 MB message (20,000 lines): pressing Enter with it in
the composer until the "too long" dialog shows (the engine counts it in its own process),
opening a chat that holds it, and searching for a word in it; for opening a chat of
200 messages (the first second after the click); for opening a branch of 10,000
messages with the tree panel shown (``open_deep``); and for pressing Enter in it, until
the "too long" dialog shows (``send_deep``).

``--scenario typing`` measures zero-wait turns instead (``tools/zero_wait.py``): a message
typed at a human pace into a 2,000-token conversation, TTFT with the feature on and off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tools.screenshots import send_and_wait, wait_until  # noqa: E402

BEAT_MS = 5


def measure(max_tokens: int) -> dict:
    app = QApplication.instance() or QApplication([])
    from app.window.shell.main_window import MainWindow

    with tempfile.TemporaryDirectory(prefix="branchwise-latency-") as tmp:
        data = Path(tmp)
        (data / "settings.json").write_text(json.dumps({"n_ctx": 4096, "show_tree": True}))
        w = MainWindow(data)
        w.resize(1280, 800)
        w.show()
        gaps: list[float] = []
        tokens: list[int] = []
        try:
            wait_until(lambda: w.model_state in ("ready", "failed", "dead"))
            if w.model_state != "ready":
                raise SystemExit(f"the model did not load: {w.banner.text}")
            conv = w.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": max_tokens, "seed": 1})
            w.show_conversation(conv.id)
            last = [time.perf_counter()]

            def beat() -> None:
                now = time.perf_counter()
                gaps.append((now - last[0]) * 1000)
                last[0] = now

            timer = QTimer(interval=BEAT_MS)
            timer.timeout.connect(beat)
            w.client.token.connect(lambda _rid, _text: tokens.append(1))
            t0 = time.perf_counter()
            timer.start()
            send_and_wait(w, lambda: w.send_message(
                "Write a long, detailed essay with headings, lists and a Python code example "
                "about how lighthouses work."))
            timer.stop()
            elapsed = time.perf_counter() - t0
        finally:
            w.close()
    app.processEvents()
    stalls = sorted(g - BEAT_MS for g in gaps)
    return {
        "tokens_streamed": len(tokens), "seconds": round(elapsed, 1), "beats": len(gaps),
        "max_stall_ms": round(stalls[-1], 1) if stalls else 0.0,
        "p99_stall_ms": round(stalls[int(0.99 * (len(stalls) - 1))], 1) if stalls else 0.0,
        "median_stall_ms": round(statistics.median(stalls), 2) if stalls else 0.0,
        "stalls_over_50ms": sum(s > 50 for s in stalls),
    }


class Heartbeat:
    """A ``BEAT_MS`` timer on the UI thread; ``stop()`` returns the stalls (ms beyond a beat),
    and the UI thread's own CPU time in each gap between beats: a stall with little of it is
    time the thread was kept from running (a busy machine), not its own work."""

    def __init__(self):
        self.gaps: list[float] = []
        self.cpu: list[float] = []
        self.timer = QTimer(interval=BEAT_MS)
        self.timer.timeout.connect(self._beat)
        self.last = self.last_cpu = 0.0

    def _beat(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.gaps.append((now - self.last) * 1000)
        self.cpu.append((cpu - self.last_cpu) * 1000)
        self.last, self.last_cpu = now, cpu

    def start(self) -> None:
        self.gaps, self.cpu, self.last, self.last_cpu = [], [], time.perf_counter(), time.thread_time()
        self.timer.start()

    def stop(self) -> dict:
        self.timer.stop()
        self._beat()  # the time since the last beat counts too
        stalls = sorted(g - BEAT_MS for g in self.gaps)
        return {"max_stall_ms": round(stalls[-1], 1) if stalls else 0.0, "beats": len(stalls),
                "median_stall_ms": round(statistics.median(stalls), 2) if stalls else 0.0,
                "stalls_over_50ms": sum(s > 50 for s in stalls),
                "max_cpu_ms": round(max(self.cpu), 1) if self.cpu else 0.0,
                "cpu_over_50ms": sum(c > 50 for c in self.cpu)}


BIG_LINES = 20_000
DEEP_MESSAGES = 10_000


def big_message() -> str:
    """About 1 MB of text in ``BIG_LINES`` lines; "zebrafinch" only on its last line."""
    lines = [f"{i:05d} a log line with some words, as a pasted file has" for i in range(BIG_LINES)]
    lines[-1] += " zebrafinch"
    return "\n".join(lines)


def measure_big() -> dict:
    app = QApplication.instance() or QApplication([])
    from app.window.shell.main_window import MainWindow

    text = big_message()
    out: dict = {"message_bytes": len(text.encode()), "message_lines": BIG_LINES}
    with tempfile.TemporaryDirectory(prefix="branchwise-latency-") as tmp:
        data = Path(tmp)
        (data / "settings.json").write_text(json.dumps({"n_ctx": 4096}))
        w = MainWindow(data)
        w.resize(1280, 800)
        w.show()
        beat = Heartbeat()
        try:
            wait_until(lambda: w.model_state in ("ready", "failed", "dead"))
            if w.model_state != "ready":
                raise SystemExit(f"the model did not load: {w.banner.text}")
            other = w.store.create_conversation(title="Other")
            hello = w.store.add_message(other.id, None, "user", "hello")
            w.store.add_message(other.id, hello.id, "assistant", "Hello!")  # answered: no "no reply yet" question
            long = w.store.create_conversation(title="200 messages")
            parent = None
            for i in range(100):
                parent = w.store.add_message(long.id, parent, "user", f"Question {i}: how do rivers **flow**?").id
                parent = w.store.add_message(long.id, parent, "assistant", f"Answer {i}: downhill.\n\n- one\n- two"
                                             f"\n\n```python\nprint({i})\n```").id
            deep = w.store.create_conversation(title="10,000 messages")
            parent = None
            for i in range(DEEP_MESSAGES):
                parent = w.store.add_message(deep.id, parent, "user" if i % 2 == 0 else "assistant", f"turn {i}").id
            big = w.store.create_conversation(title="Big paste")
            w.store.add_message(big.id, None, "user", text)
            w.sidebar.refresh()

            # sending: Enter with 1 MB in the composer, until the "too long" dialog shows
            w.show_conversation(other.id)
            w.composer.input.setPlainText(text)
            app.processEvents()
            beat.start()
            t0 = time.perf_counter()
            w.composer.button.click()
            wait_until(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(), 600_000)
            out["send"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}
            w.overflow_flow.box.reject()
            w.overflow_flow.box = None
            w.composer.input.clear()

            # opening the chat that holds it (as a click in the sidebar does)
            w.status.set_context(0, 4096)
            beat.start()
            t0 = time.perf_counter()
            w.sidebar.selected.emit(big.id)
            wait_until(lambda: w.status.context_used > 4096, 600_000)  # the engine's count of it came back
            out["open"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}

            # opening a chat of 200 messages (bubbles are built as they come into view)
            beat.start()
            t0 = time.perf_counter()
            w.sidebar.selected.emit(long.id)
            wait_until(lambda: w.conversation_id == long.id)
            end = time.perf_counter() + 1.0
            wait_until(lambda: time.perf_counter() > end)
            out["open_long"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}

            # opening a branch of 10,000 messages with the tree panel shown (the tree is read and
            # laid out off the UI thread; the first second after the click, or until it is drawn)
            w.tree.setVisible(True)
            wait_until(lambda: not w.tree.loading, 600_000)
            beat.start()
            t0 = time.perf_counter()
            w.sidebar.selected.emit(deep.id)
            end = time.perf_counter() + 1.0
            wait_until(lambda: time.perf_counter() > end and not w.tree.loading, 600_000)
            out["open_deep"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}
            w.tree.setVisible(False)

            # Enter in it (it does not fit the context: until the "too long" dialog shows)
            w.composer.input.setPlainText("And what comes next?")
            end = time.perf_counter() + 1.0  # the draft count reads the branch meanwhile, as while typing
            wait_until(lambda: time.perf_counter() > end)
            beat.start()
            t0 = time.perf_counter()
            w.composer.button.click()
            wait_until(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible(), 600_000)
            out["send_deep"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}
            w.overflow_flow.box.reject()
            w.overflow_flow.box = None
            w.composer.input.clear()

            # searching for a word that is only in it
            beat.start()
            t0 = time.perf_counter()
            w.sidebar.search.setText("zebrafinch")
            wait_until(lambda: w.sidebar.ids() == [big.id], 600_000)
            out["search"] = {**beat.stop(), "seconds": round(time.perf_counter() - t0, 2)}
        finally:
            w.close()
    app.processEvents()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.ui_latency", description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--json", action="store_true")
    p.add_argument("--big", action="store_true", help="send, open and search a chat with a 1 MB message")
    p.add_argument("--scenario", choices=("reply", "typing"), default="reply",
                   help="reply: stream a long reply (default); typing: zero-wait turns (tools/zero_wait.py)")
    p.add_argument("--cps", type=float, default=5.0, help="typing: characters per second (default 5)")
    p.add_argument("--threads", type=int, default=0, help="typing: llama.cpp threads (default 0: all cores)")
    args = p.parse_args(argv)
    if args.scenario == "typing":
        from tools import zero_wait

        r = zero_wait.measure(args.cps, args.threads)
        print(json.dumps(r) if args.json else zero_wait.report(r))
        return 0
    if args.big:
        r = measure_big()
        if args.json:
            print(json.dumps(r))
            return 0
        print(f"a {r['message_bytes']:,}-byte message of {r['message_lines']:,} lines; UI thread stalls:")
        for phase in ("send", "open", "open_long", "open_deep", "send_deep", "search"):
            f = r[phase]
            print(f"  {phase:<9} max {f['max_stall_ms']} ms, median {f['median_stall_ms']} ms, "
                  f"{f['stalls_over_50ms']} over 50 ms "
                  f"({f['seconds']} s until done; UI-thread CPU in one gap: max {f['max_cpu_ms']} ms, "
                  f"{f['cpu_over_50ms']} over 50 ms)")
        return 0
    r = measure(args.max_tokens)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"streamed {r['tokens_streamed']} tokens in {r['seconds']} s; UI thread stalls: "
              f"max {r['max_stall_ms']} ms, p99 {r['p99_stall_ms']} ms, median {r['median_stall_ms']} ms, "
              f"{r['stalls_over_50ms']} over 50 ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
