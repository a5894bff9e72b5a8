"""kill -9 during a snapshot leaves a consistent prefix store (issue 15).

A child process loads the default model, answers a short prompt, then snapshots in a loop:
``forget`` the conversation's blocks (scrub and unlink their files), store them again
(write the files, insert the rows), pause. The parent kills it with SIGKILL at a random moment,
then opens the store and checks, before anything is restored, that every index row has a
complete block file with its checksum and no file is left without a row (the open
reclaims orphans and temporary files). A restore through the store then verifies
cleanly and gives the reply a from-scratch prefill gives. At least one kill must have
landed mid-write (an orphan or temporary file seen before the open), or the test proves
nothing.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import xxhash

from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.settings import EngineSettings, SamplingParams
from storage.prefix_store import PrefixStore

SETTINGS = EngineSettings(n_ctx=1024, n_threads=1)  # one thread each: the child and the parent overlap
GREEDY = SamplingParams(temperature=0, max_tokens=8)
TRIALS = 20
QUESTION = ("A lighthouse keeper named Ada kept a logbook of every ship that passed. "
            "One winter night a ship without lights came close to the rocks. ") * 5 + "What did Ada see?"

CHILD = """
import sys
import time
from engine.chat_template import ChatMessage
from engine.core import Engine
from engine.settings import EngineSettings, SamplingParams
from storage.prefix_store import PrefixStore
store = PrefixStore(sys.argv[1])
engine = Engine(sys.argv[2], EngineSettings(n_ctx=1024, n_threads=1), store)
engine.generate([ChatMessage("user", sys.argv[3])], SamplingParams(temperature=0, max_tokens=8))
tokens = list(engine.llama.input_ids[: engine.llama.n_tokens])
print("ready", flush=True)
while True:
    store.forget([tokens])
    engine.snapshot()
    time.sleep(0.03)  # a moment with the blocks stored, so some kills leave them to restore
"""


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def _files_and_rows(path: Path) -> tuple[set[str], dict[str, tuple[int, int]]]:
    """The block folder's file names and the index's rows (hex key -> checksum, nbytes),
    read without the store's own repairs."""
    folder = Path(f"{path}-blocks")
    files = {p.name for p in folder.iterdir()} if folder.exists() else set()
    db = sqlite3.connect(path, timeout=10)
    rows = {k.hex(): (c, n) for k, c, n in db.execute("SELECT key, checksum, nbytes FROM blocks")}
    db.close()
    return files, rows


def test_kill_during_snapshot_leaves_a_consistent_store(model_path, tmp_path):
    path = tmp_path / "kvcache.sqlite3"
    store = PrefixStore(path)
    engine = Engine(model_path, SETTINGS, store)  # caches the model's digest for the children
    msgs = [ChatMessage("user", QUESTION)]
    first = engine.generate(msgs, GREEDY, use_cache=False)
    follow = msgs + [ChatMessage("assistant", first.text, first.token_ids), ChatMessage("user", "Who was Ada?")]
    expected = engine.generate(follow, GREEDY, use_cache=False)
    store.close()
    rng = random.Random(15)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    mid_write = restored_trials = 0
    for trial in range(TRIALS):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(model_path), QUESTION],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert child.stdout.readline().strip() == "ready", f"trial {trial}: the child did not start"
        time.sleep(rng.uniform(0.0, 0.2))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()

        files, rows = _files_and_rows(path)  # what the kill left, before any repair
        mid_write += bool(files - set(rows))
        store = PrefixStore(path)  # the open reclaims orphans and temporary files
        files, rows = _files_and_rows(path)
        assert files == set(rows), f"trial {trial}: files {sorted(files - set(rows))} have no row"
        folder = Path(f"{path}-blocks")
        for name, (want, nbytes) in rows.items():  # every row has its whole payload
            data = (folder / name).read_bytes()
            assert len(data) == nbytes and _signed(xxhash.xxh3_64_intdigest(data)) == want, f"trial {trial}"
        assert store.stats()["bytes"] == sum(n for _, n in rows.values())

        engine.store = store
        engine.reset_context()
        again = engine.generate(follow, GREEDY)
        assert again.stats.cache_blocks_dropped == 0, f"trial {trial}: a block failed its checksum"
        assert again.token_ids == expected.token_ids, f"trial {trial}: the restored reply differs"
        restored_trials += again.stats.restored_tokens > 0
        store.close()
    engine.close()
    assert mid_write >= 1, "no kill landed while a block file was being written"
    # Most kills land between a forget and the end of the next snapshot (no blocks then).
    assert restored_trials >= 2, f"only {restored_trials} trials restored anything"
