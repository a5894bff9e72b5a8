"""Many processes opening a fresh data folder at once (issue 11.1).

Each round starts 8 processes together (a barrier releases them at the same moment)
against a new folder: four run ``branchwise conversations list --json`` through the
CLI's ``main`` and four write through the storage layer (a conversation with a message
in chats.sqlite3, a block in kvcache.sqlite3). 20 rounds; every process must exit 0 and
every write must be there afterwards. Processes are forked, so a round costs a few
milliseconds of start-up rather than an interpreter each.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from app import cli
from storage.chats import ChatStore
from storage.paths import CHATS_DB, KVCACHE_DB, resolve_data_dir
from storage.prefix_store import NewBlock, PrefixStore

ROUNDS = 20
LISTERS = 4
WRITERS = 4
FP = b"C" * 32

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses fork")


def _lister(folder: str, barrier, out: str) -> None:
    barrier.wait()
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = cli.main(["conversations", "list", "--json", "--data-dir", folder])
    Path(out).write_text(json.dumps({"code": code, "stdout": stdout.getvalue(),
                                     "stderr": stderr.getvalue()}))
    os._exit(0)


def _writer(folder: str, barrier, out: str, index: int) -> None:
    barrier.wait()
    result = {"code": 0, "stderr": ""}
    try:
        folder = str(resolve_data_dir(folder))  # as the app does: create the folder if needed
        with ChatStore(Path(folder) / CHATS_DB) as chats:
            conv = chats.create_conversation(title=f"writer {index}")
            chats.add_message(conv.id, None, "user", f"message from writer {index}")
        store = PrefixStore(Path(folder) / KVCACHE_DB, block_size=4)
        tokens = np.arange(4, dtype=np.int32) + 1000 * (index + 1)
        missing, chain = store.plan(FP, tokens)
        store.put(FP, [NewBlock(b.key, b.parent, b.start, b.tokens, b"x" * 64) for b in missing],
                  active_path=chain)
        store.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"code": 1, "stderr": f"{type(exc).__name__}: {exc}"}
    Path(out).write_text(json.dumps(result))
    os._exit(0)


def test_eight_processes_open_a_fresh_folder_together(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for round_ in range(ROUNDS):
        folder = tmp_path / f"round{round_}"
        barrier = ctx.Barrier(LISTERS + WRITERS)
        procs = []
        for i in range(LISTERS):
            procs.append(ctx.Process(target=_lister, args=(str(folder), barrier,
                                                           str(tmp_path / f"r{round_}-l{i}.json"))))
        for i in range(WRITERS):
            procs.append(ctx.Process(target=_writer, args=(str(folder), barrier,
                                                           str(tmp_path / f"r{round_}-w{i}.json"), i)))
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"round {round_}: a process died ({p.exitcode})"
        for out in sorted(tmp_path.glob(f"r{round_}-*.json")):
            result = json.loads(out.read_text())
            if result["code"] != 0:
                failures.append(f"round {round_} {out.name}: {result['stderr'].strip()}")
            elif "-l" in out.name:
                listed = json.loads(result["stdout"])  # one JSON array, whatever it saw
                assert isinstance(listed, list)
        assert failures == []
        with ChatStore(folder / CHATS_DB) as chats:
            titles = sorted(c.title for c in chats.list_conversations())
            texts = sorted(m.content for c in chats.list_conversations() for m in chats.tree(c.id))
        store = PrefixStore(folder / KVCACHE_DB, block_size=4)
        blocks = store.stats()["blocks"]
        store.close()
        assert titles == [f"writer {i}" for i in range(WRITERS)], f"round {round_}"
        assert texts == [f"message from writer {i}" for i in range(WRITERS)], f"round {round_}"
        assert blocks == WRITERS, f"round {round_}"
    assert failures == []
