"""Screenshots of the real app: ``python -m tools.screenshots OUTDIR [--scenes NAME ...]``.

Opens the window offscreen on a temporary data folder with the embedded default
model, writes a conversation with a branch (real generation, temperature 0), opens
the tree panel, and saves ``light.png``, ``dark.png``, ``tree.png`` (the tree panel
alone) and ``narrow.png`` (the window 800 px wide) into OUTDIR (scene ``main``); ``thought-collapsed.png`` and ``thought-expanded.png``,
a reasoning reply (scene ``thought``, tools/thought_screenshots.py); ``models.png``, the
Models window against the tests' fake hub on 127.0.0.1 (tests/fake_hub.py), a repository's
files with their fit labels and a download under way (scene ``models``).
Scene ``attachment`` saves ``attachment.png``: a PDF attached to a question (its chip on the
sent message) and the reply; scene ``passages`` saves ``passages.png``: a document too long
for a 2,048-token context, searched ("Search the document"), and the reply's footer naming
the passages used. ``--scene NAME`` (repeatable) makes only those scenes.
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


def _padded(source: Path, out: Path, size: int) -> Path:
    """A stand-in GGUF of ``size`` bytes: ``source``'s bytes, then a sparse hole (its header
    is real, so the fit estimate reads it; nothing downloads it)."""
    import shutil

    shutil.copyfile(source, out)
    with open(out, "r+b") as f:
        f.truncate(size)
    return out


def models_scene(out: Path) -> Path:
    """``models.png``: the Models window on a repository of the fake hub, every fit label
    shown (two stand-ins padded to be Tight and Too large for this machine), the
    Recommended file selected and a download under way."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fake_hub import FakeHub, Repo, RunningHub

    from app.window.shell.main_window import MainWindow
    from engine.hub import fit
    from engine.model_file import default_model_path

    smol = default_model_path()
    with tempfile.TemporaryDirectory(prefix="branchwise-shots-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        (data / "settings.json").write_text(json.dumps({"theme": "light", "n_ctx": 8192}))
        avail = fit.available_memory()
        tight = _padded(smol, Path(tmp) / "SmolLM2-135M-Instruct-BF16.gguf", int(avail * 0.85))
        large = _padded(smol, Path(tmp) / "SmolLM2-135M-Instruct-F32.gguf", int(avail * 1.3))
        repo = "bartowski/SmolLM2-135M-Instruct-GGUF"
        hub = FakeHub({repo: Repo({"SmolLM2-135M-Instruct-Q4_1.gguf": smol, "SmolLM2-135M-Instruct-Q8_0.gguf": smol,
                                   tight.name: tight, large.name: large}, downloads=5000, likes=42)},
                      throttle=3 << 20)
        hub.hashes.update({tight: "0" * 64, large: "0" * 64})  # never hashed: 20+ GB of hole
        with RunningHub(hub) as running:
            os.environ["HF_ENDPOINT"] = running.url
            w = MainWindow(data, start_engine=False)
            try:
                mw = w.models.open()
                mw.resize(1100, 760)
                mw.search_box.setText("smollm2")
                mw.search()
                wait_until(lambda: mw.results.topLevelItemCount() > 0 and "match" in mw.results_caption.text())
                mw.results.setCurrentItem(mw.results.topLevelItem(0))
                mw.open_repo(repo)
                wait_until(lambda: mw.files.topLevelItemCount() > 0)
                mw.download_selected()
                wait_until(lambda: "MB/s" in (mw.downloads_view.topLevelItem(0) or mw.results).text(1)
                           if mw.downloads_view.topLevelItemCount() else False)
                _settle(1500)
                mw.grab().save(str(out / "models.png"))
            finally:
                w.close()
                del os.environ["HF_ENDPOINT"]
    return out / "models.png"


SCENES = ("main", "thought", "models", "attachment", "passages")
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
    args = list(sys.argv[1:] if argv is None else argv)
    scenes = []
    while "--scene" in args:
        i = args.index("--scene")
        scenes.append(args[i + 1] if i + 1 < len(args) else "")
        del args[i:i + 2]
    if len(args) != 1 or any(name not in SCENES for name in scenes):
        print(f"usage: python -m tools.screenshots OUTDIR [--scene {'|'.join(SCENES)}]...", file=sys.stderr)
        return 2
    scenes = scenes or list(SCENES)
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    app.setApplicationName("Branchwise")
    if "main" in scenes:
        code = _main_scenes(out)
        if code:
            return code
    if "thought" in scenes:
        from tools.thought_screenshots import thought_scenes

        for path in thought_scenes(out, wait_until, send_and_wait, _settle):
            print(path)
    if "models" in scenes:
        print(models_scene(out))
    for name, scene in (("attachment", attachment_scene), ("passages", passages_scene)):
        if name in scenes:
            print(scene(out))
    return 0


def _main_scenes(out: Path) -> int:
    """light.png, dark.png, tree.png and narrow.png (800 px wide) into ``out`` (1 when the
    model does not load)."""
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
            w.look.set_theme("light")
            w.resize(800, 640)  # the narrowest window the layout is made for, the tree panel shown
            _settle(600)
            w.grab().save(str(out / "narrow.png"))
        finally:
            w.close()
    for name in ("light.png", "dark.png", "tree.png", "narrow.png"):
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
