"""Screenshots of the real app: ``python -m tools.screenshots OUTDIR``.

Opens the window offscreen on a temporary data folder with the embedded default
model, writes a conversation with a branch (real generation, temperature 0), opens
the tree panel, and saves ``light.png``, ``dark.png`` and ``tree.png`` (the tree panel
alone) into OUTDIR, then ``thought-collapsed.png`` and ``thought-expanded.png`` (a
reasoning reply, tools/thought_screenshots.py). ``--scene thought`` makes only the latter.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

TIMEOUT_MS = 180_000


def wait_until(condition, timeout_ms: int = TIMEOUT_MS) -> None:
    """Run the event loop until ``condition()`` is true; raise TimeoutError after ``timeout_ms``."""
    loop = QEventLoop()
    timer = QTimer(interval=20)
    timer.timeout.connect(lambda: condition() and loop.quit())
    deadline = QTimer(singleShot=True, interval=timeout_ms)
    deadline.timeout.connect(loop.quit)
    timer.start()
    deadline.start()
    loop.exec()
    timer.stop()
    if not condition():
        raise TimeoutError("the app did not get there in time")


def _settle(ms: int = 300) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def send_and_wait(window, send) -> None:
    done = []
    window.reply_finished.connect(done.append)
    send()
    wait_until(lambda: bool(done))
    window.reply_finished.disconnect(done.append)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    only_thought = args[1:] == ["--scene", "thought"]
    if len(args) != 1 and not only_thought:
        print("usage: python -m tools.screenshots OUTDIR [--scene thought]", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    app.setApplicationName("Branchwise")
    if not only_thought:
        code = _main_scenes(out)
        if code:
            return code
    from tools.thought_screenshots import thought_scenes

    for path in thought_scenes(out, wait_until, send_and_wait, _settle):
        print(path)
    return 0


def _main_scenes(out: Path) -> int:
    """light.png, dark.png and tree.png into ``out`` (1 when the model does not load)."""
    from app.window.shell.main_window import MainWindow

    with tempfile.TemporaryDirectory(prefix="branchwise-shots-") as tmp:
        data = Path(tmp)
        (data / "settings.json").write_text(json.dumps({"theme": "light", "show_tree": True}))
        w = MainWindow(data)
        w.resize(1280, 800)
        w.show()
        try:
            wait_until(lambda: w.model_state in ("ready", "failed", "dead"))
            if w.model_state != "ready":
                print(f"the model did not load: {w.banner.text}", file=sys.stderr)
                return 1
            conv = w.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": 120, "seed": 1})
            w.show_conversation(conv.id)
            send_and_wait(w, lambda: w.send_message("Write a Python function that reverses a string."))
            first_user = w.store.active_path(conv.id)[0]
            send_and_wait(w, lambda: w.send_message("Now explain it in one sentence."))
            # a branch: edit the first question (a sibling) and answer it
            send_and_wait(w, lambda: w.commands.edit(first_user.id, "What is the capital of France?"))
            # back to the first branch, so the navigator shows 1/2 and the tree has two arms
            w.chat.switch_sibling(w.store.active_path(conv.id)[0].id, -1)
            w.chat.figures.refresh_coverage()
            wait_until(lambda: not w.chat.figures.coverage_pending and not w.tree.loading, 30_000)
            _settle()
            w.grab().save(str(out / "light.png"))
            w.tree.grab().save(str(out / "tree.png"))
            w.look.set_theme("dark")
            wait_until(lambda: not w.chat.figures.coverage_pending and not w.tree.loading, 30_000)
            _settle()
            w.grab().save(str(out / "dark.png"))
        finally:
            w.close()
    for name in ("light.png", "dark.png", "tree.png"):
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
