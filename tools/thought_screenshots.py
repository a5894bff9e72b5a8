"""The thought-block screenshots: ``python -m tools.screenshots OUTDIR --scene thought``.

The default model made to think (tools/think_model.py, with a grammar that allows a longer
thought than the tests' one), one question at temperature 0 in the real window (offscreen),
then ``thought-collapsed.png`` (the reply as saved: the thinking folded above the answer)
and ``thought-expanded.png`` (the block opened by a click on its header).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from engine.reasoning import GRAMMAR_ENV
from tools.think_model import grammar_file, think_copy

SHOT_GRAMMAR = r'''
root ::= thought "\n</think>\n\n" answer
thought ::= [A-Za-z ,.]{120,260} "."
answer ::= [A-Za-z ,]{30,160} "."
'''
FILES = ("thought-collapsed.png", "thought-expanded.png")


def thought_scenes(out: Path, wait_until, send_and_wait, settle, width: int = 1100) -> list[Path]:
    """Write :data:`FILES` into ``out`` from a window ``width`` pixels wide; the helpers are
    tools.screenshots'. Returns the paths. Raises RuntimeError when the model does not load."""
    from engine.model_file import default_model_path

    from app.window.shell.main_window import MainWindow

    with tempfile.TemporaryDirectory(prefix="branchwise-thought-shots-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        (data / "settings.json").write_text(json.dumps({"theme": "light", "show_tree": False}))
        model = think_copy(default_model_path(), Path(tmp) / "SmolLM2-135M-Instruct-thinking.gguf")
        os.environ[GRAMMAR_ENV] = str(grammar_file(Path(tmp), SHOT_GRAMMAR))  # read as the engine starts
        try:
            w = MainWindow(data, model_path=str(model))
            w.resize(width, 640)
            w.show()
            try:
                wait_until(lambda: w.model_state in ("ready", "failed", "dead"))
                if w.model_state != "ready":
                    raise RuntimeError(f"the model did not load: {w.banner.text}")
                conv = w.store.create_conversation(sampling={"temperature": 0.0, "max_tokens": 260, "seed": 1})
                w.show_conversation(conv.id)
                send_and_wait(w, lambda: w.send_message("Why is the sky blue?"))
                settle()
                paths = [out / name for name in FILES]
                w.grab().save(str(paths[0]))
                w.transcript.widgets[-1].thought.set_open(True)
                settle()
                w.grab().save(str(paths[1]))
            finally:
                w.close()
        finally:
            os.environ.pop(GRAMMAR_ENV, None)
    return paths
