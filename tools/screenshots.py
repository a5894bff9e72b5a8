"""Screenshots of the real app: ``python -m tools.screenshots OUTDIR [--scenes NAME ...]``.

Opens the window offscreen on a temporary data folder with the embedded default
model, writes a conversation with a branch (real generation, temperature 0), opens
the tree panel, and saves ``light.png``, ``dark.png`` and ``tree.png`` (the tree panel
alone) into OUTDIR (scene ``chat``). Scene ``attachment`` saves ``attachment.png``: a PDF
attached to a question (its chip on the sent message) and the reply; scene ``passages``
saves ``passages.png``: a document too long for a 2,048-token context, searched ("Search the
document"), and the reply's footer naming the passages used. Without ``--scenes``: all three.
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


SCENES = ("chat", "attachment", "passages")
DOCUMENTS = Path(__file__).resolve().parent.parent / "tests" / "data" / "documents"


def _window(data: Path, settings: dict):
    from app.window.shell.main_window import MainWindow

    (data / "settings.json").write_text(json.dumps(settings))
    w = MainWindow(data)
    w.resize(1280, 800)
    w.show()
    wait_until(lambda: w.model_state in ("ready", "failed", "dead"))
    if w.model_state != "ready":
        w.close()
        raise RuntimeError(f"the model did not load: {w.banner.text}")
    return w


def _attach(w, path: Path) -> None:
    w.attach.attach_paths([path])
    wait_until(lambda: bool(w.attach.ready) and w.attach.ready[-1].tokens is not None, 60_000)


def attachment_scene(out: Path) -> Path:
    """``attachment.png``: a question about an attached PDF (its chip), the reply, and a
    follow-up that restores the document from the prefix store."""
    with tempfile.TemporaryDirectory(prefix="branchwise-shots-") as tmp:
        w = _window(Path(tmp), {"theme": "light", "show_tree": False})
        try:
            conv = w.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": 80, "seed": 1})
            w.show_conversation(conv.id)
            _attach(w, DOCUMENTS / "gettysburg.pdf")
            send_and_wait(w, lambda: w.send_message("Who gave this address, and what does it ask of the living?"))
            send_and_wait(w, lambda: w.send_message("In which year was it given?"))  # the document restored
            _settle()
            w.grab().save(str(out / "attachment.png"))
        finally:
            w.close()
    return out / "attachment.png"


def passages_scene(out: Path) -> Path:
    """``passages.png``: a document over the context, searched, and the passages its reply used."""
    from tools.documents_bench import make_pdf

    with tempfile.TemporaryDirectory(prefix="branchwise-shots-") as tmp:
        pdf = make_pdf(Path(tmp) / "harbour-minutes.pdf")
        data = Path(tmp) / "data"
        data.mkdir()
        w = _window(data, {"theme": "light", "show_tree": False, "n_ctx": 2048})
        try:
            conv = w.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": 80, "seed": 1})
            w.show_conversation(conv.id)
            _attach(w, pdf)
            w.composer.set_text("What did the harbour committee defer about the toll, and what does the address "
                                "say about the unfinished work?")
            w.composer.input.submit.emit()  # as Enter: counted, too long, the dialog
            wait_until(lambda: w.overflow_flow.box is not None and w.overflow_flow.box.isVisible())
            box = w.overflow_flow.box
            search = next(b for b in box.buttons() if b.text() == "Search the document")
            send_and_wait(w, search.click)
            _settle()
            w.grab().save(str(out / "passages.png"))
        finally:
            w.close()
    return out / "passages.png"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    scenes = list(SCENES)
    if "--scenes" in args:
        at = args.index("--scenes")
        args, scenes = args[:at], args[at + 1:]
    if len(args) != 1 or not scenes or any(s not in SCENES for s in scenes):
        print(f"usage: python -m tools.screenshots OUTDIR [--scenes {' '.join(SCENES)}]", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    app.setApplicationName("Branchwise")
    for name, scene in (("attachment", attachment_scene), ("passages", passages_scene)):
        if name in scenes:
            print(scene(out))
    if "chat" not in scenes:
        return 0

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
