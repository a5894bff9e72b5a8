"""Zero-wait turns, measured in the real window: ``python -m tools.ui_latency --scenario typing``.

Offscreen, on a temporary data folder, with the default model:

1. set-up: a conversation of about 2,000 prompt tokens is answered once, so the prefix store
   holds it (as after any earlier session);
2. feature on: a new window (a new engine process) opens it; a 150-token message is typed
   key by key at ``--cps`` characters per second (default 5, real time: about two minutes),
   with a typo fixed by Backspace every ~90 characters, and Enter follows the last key
   after the same gap as any key;
3. feature off (Settings → Zero-wait turns unchecked): a new window opens the same folder
   copy, the same message is put in the composer and sent.

Prints the TTFT after Enter (the engine's ``ttft_ms``, request to first token, and the
window's, Enter to the first streamed text painted in the window), one decode step at that
context length (from the reply's decode rate), the TTFT with the feature off, and the UI
thread's longest stall while typing and streaming (5 ms heartbeat; target: none over 50 ms).
Then where the window's TTFT goes (``app/window/transcript/send_timeline.py``): Enter to the request
on its way, waiting in the engine process (behind a prewarm batch), the engine's TTFT, the
pipe, the UI thread busy when the token came, into the bubble, painted.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QTimer, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.window.transcript.send_timeline import describe
from tools.screenshots import wait_until

BEAT_MS = 5
HISTORY = ("The keeper of the northern lighthouse wrote down every ship, every storm and every "
           "strange light she saw over forty winters, and her logbook became the harbour's memory. ")
MESSAGE = ("Thank you, that helps. Now I would like you to compare the keeper's logbook with a modern "
           "ship tracking system: what each one records, who can read it, how long the records last, "
           "and what happens when a storm cuts the power. Please answer in three short paragraphs, "
           "then list the five most important differences as bullet points, and finish with one "
           "sentence on what a modern harbour could still learn from the old keeper and her book. "
           "Keep the language plain, as if you were explaining it to a pupil who has never seen the "
           "sea, and do not invent any dates, names or numbers that were not in the story above. "
           "If something is uncertain, say so in a short note at the end.")
SAMPLING = {"temperature": 0.0, "max_tokens": 32, "seed": 1}


def _window(data: Path, prewarm: bool):
    from app.window.shell.main_window import MainWindow

    settings = json.loads((data / "settings.json").read_text())
    (data / "settings.json").write_text(json.dumps({**settings, "prewarm": prewarm}))
    w = MainWindow(data)
    w.resize(1280, 800)
    w.show()
    wait_until(lambda: w.model_state in ("ready", "failed", "dead"), 600_000)
    if w.model_state != "ready":
        raise SystemExit(f"the model did not load: {w.banner.text}")
    return w


def _wait_snapshot(w) -> None:
    """Wait until the reply just finished has its KV stored (the SnapshotEvent)."""
    from engine.events import SnapshotEvent

    seen = []
    w.client.event.connect(lambda e: isinstance(e, SnapshotEvent) and seen.append(e))
    wait_until(lambda: bool(seen), 600_000)


def _send(w, type_it: bool, cps: float, beats: list) -> dict:
    """Type (or paste) MESSAGE, press Enter, wait for the reply; returns its stats plus the
    window's TTFT (Enter to first streamed text) and the UI stalls."""
    rng = random.Random(7)
    keys: list[str] = []
    for i, ch in enumerate(MESSAGE):
        if type_it and i and i % 90 == 0:
            keys += [rng.choice("qxz"), "\b"]  # a typo, fixed at once
        keys.append(ch)
    box = w.composer.input
    box.setFocus()
    first, done = [], []
    w.client.token.connect(lambda _rid, _t: first or first.append(time.perf_counter()))
    w.reply_finished.connect(done.append)
    last = [time.perf_counter()]

    def beat() -> None:
        now = time.perf_counter()
        beats.append((now - last[0]) * 1000 - BEAT_MS)
        last[0] = now

    heart = QTimer(interval=BEAT_MS)
    heart.timeout.connect(beat)
    heart.start()
    at_enter: list[int] = []
    if type_it:
        pos = [0]
        t_enter = [0.0]

        def key() -> None:
            if pos[0] == len(keys):
                timer.stop()
                at_enter.append(len(beats))
                t_enter[0] = time.perf_counter()
                QTest.keyClick(box, Qt.Key.Key_Return)
                return
            k = keys[pos[0]]
            pos[0] += 1
            if k == "\b":
                QTest.keyClick(box, Qt.Key.Key_Backspace)
            else:
                QTest.keyClicks(box, k)

        timer = QTimer(interval=round(1000 / cps))
        timer.timeout.connect(key)
        timer.start()
        wait_until(lambda: bool(done), 900_000)
    else:
        box.setPlainText(MESSAGE)
        QApplication.processEvents()
        at_enter.append(len(beats))
        t_enter = [time.perf_counter()]
        QTest.keyClick(box, Qt.Key.Key_Return)
        wait_until(lambda: bool(done), 900_000)
    heart.stop()
    reply = w.store.get_message(done[0])
    stats = dict(reply.stats)
    stats["token_ids"] = list(reply.token_ids or [])
    painted = w.chat.timeline.at.get("painted")
    stats["window_ttft_ms"] = round((painted - t_enter[0]) * 1000, 1) if painted else None
    stats["window_token_ms"] = round((first[0] - t_enter[0]) * 1000, 1) if first else None
    stats["breakdown"] = w.chat.timeline.breakdown(reply.stats)
    stats["status_line"] = w.status.stats_label.text()
    typing, after = beats[: at_enter[0]], beats[at_enter[0]:]
    stats["typing_max_stall_ms"] = round(max(typing), 1) if typing else 0.0
    stats["typing_stalls_over_50ms"] = sum(b > 50 for b in typing)
    stats["reply_max_stall_ms"] = round(max(after), 1) if after else 0.0
    stats["reply_stalls_over_50ms"] = sum(b > 50 for b in after)
    return stats


def measure(cps: float = 5.0, threads: int = 0) -> dict:
    app = QApplication.instance() or QApplication([])
    with tempfile.TemporaryDirectory(prefix="branchwise-zero-wait-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        (base / "settings.json").write_text(json.dumps({"n_ctx": 4096, "n_threads": threads}))
        w = _window(base, prewarm=False)
        conv = w.store.create_conversation(system_prompt="You are a helpful assistant.", sampling=SAMPLING)
        w.show_conversation(conv.id)
        w.composer.set_text(HISTORY * 59 + "Summarise this in one line.")
        done = []
        w.reply_finished.connect(done.append)
        QTest.keyClick(w.composer.input, Qt.Key.Key_Return)
        wait_until(lambda: bool(done), 900_000)
        _wait_snapshot(w)
        history_tokens = w.status.context_used
        w.close()
        app.processEvents()

        runs = {}
        for name, prewarm in (("on", True), ("off", False)):
            data = Path(tmp) / name
            shutil.copytree(base, data)
            w = _window(data, prewarm)
            if prewarm:  # the restore on open, in the background (the user starts reading)
                opened = []
                w.prewarm.answered.connect(lambda r: r.get("kind") == "open" and opened.append(r))
                wait_until(lambda: bool(opened), 600_000)
                runs["open"] = opened[0]
            runs[name] = _send(w, prewarm, cps, [])
            w.close()
            app.processEvents()
    on, off = runs["on"], runs["off"]
    step_ms = 1000 / on["decode_tokens_per_s"] if on.get("decode_tokens_per_s") else 0.0
    return {
        "history_tokens": history_tokens, "prompt_tokens": on["prompt_tokens"], "chars_per_s": cps,
        "ttft_ms": on["ttft_ms"], "window_ttft_ms": on["window_ttft_ms"],
        "decode_step_ms": round(step_ms, 2),
        "ttft_in_decode_steps": round(on["ttft_ms"] / step_ms, 2) if step_ms else None,
        "window_ttft_in_decode_steps": round(on["window_ttft_ms"] / step_ms, 2)
        if step_ms and on["window_ttft_ms"] else None,
        "window_token_ms": on["window_token_ms"], "off_window_token_ms": off["window_token_ms"],
        "breakdown": on["breakdown"], "off_breakdown": off["breakdown"],
        "prefilled_at_enter": on["prefilled_tokens"], "typed_tokens": on.get("typed_tokens", 0),
        "prepared_tokens": on.get("prepared_tokens", 0), "open_restore": runs["open"],
        "off_ttft_ms": off["ttft_ms"], "off_window_ttft_ms": off["window_ttft_ms"],
        "off_restored_tokens": off["restored_tokens"], "off_prefilled_tokens": off["prefilled_tokens"],
        "same_reply": on["token_ids"] == off["token_ids"] and on["prompt_tokens"] == off["prompt_tokens"],
        "status_line": on["status_line"],
        "typing_max_stall_ms": on["typing_max_stall_ms"], "typing_stalls_over_50ms": on["typing_stalls_over_50ms"],
        "reply_max_stall_ms": on["reply_max_stall_ms"], "reply_stalls_over_50ms": on["reply_stalls_over_50ms"],
        "off_reply_max_stall_ms": off["reply_max_stall_ms"],
        "off_reply_stalls_over_50ms": off["reply_stalls_over_50ms"],
    }


def report(r: dict) -> str:
    return "\n".join([
        f"Zero-wait turns · {r['history_tokens']:,}-token conversation, a {r['prompt_tokens'] - r['history_tokens']:,}"
        f"-token turn typed at {r['chars_per_s']:g} chars/s",
        f"  feature on : TTFT {r['ttft_ms']:.1f} ms (window {r['window_ttft_ms']} ms) = "
        f"{r['ttft_in_decode_steps']} decode steps; prefilled at Enter {r['prefilled_at_enter']} tokens, "
        f"ready before Enter {r['prepared_tokens']:,} (typed {r['typed_tokens']:,})",
        f"  one decode step at this context: {r['decode_step_ms']:.2f} ms",
        f"  feature off: TTFT {r['off_ttft_ms']:.1f} ms (window {r['off_window_ttft_ms']} ms); restored "
        f"{r['off_restored_tokens']:,}, prefilled {r['off_prefilled_tokens']} tokens at Enter",
        f"  restore on open: {r['open_restore']['restored_tokens']:,} tokens restored, "
        f"{r['open_restore']['prefilled_tokens']} prefilled in {r['open_restore']['ms']:.0f} ms (background)",
        f"  same reply with the feature on and off: {'yes' if r['same_reply'] else 'NO'}",
        f"  UI thread while typing (feature on): longest stall {r['typing_max_stall_ms']} ms, "
        f"{r['typing_stalls_over_50ms']} over 50 ms",
        f"  UI thread from Enter to the saved reply: on {r['reply_max_stall_ms']} ms "
        f"({r['reply_stalls_over_50ms']} over 50 ms), off {r['off_reply_max_stall_ms']} ms "
        f"({r['off_reply_stalls_over_50ms']} over 50 ms)",
        f"  status line: {r['status_line']}",
        f"  window TTFT (Enter to the first text painted) = {r['window_ttft_in_decode_steps']} decode steps; "
        f"the token reached the UI thread at {r['window_token_ms']} ms (off {r['off_window_token_ms']} ms)",
        "  where the window's TTFT goes:",
        f"    on : {describe(r['breakdown'])}",
        f"    off: {describe(r['off_breakdown'])}",
    ])

