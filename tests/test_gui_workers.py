"""The window's one background-worker helper (issue #26.4, app/window/workers/tasks.py):
results and errors arrive on the UI thread, progress in order, an error without a handler
goes to the log, and shutdown cancels, waits within its bound and drops late deliveries.
The chat reader on top of it keeps newest-wins per key. No model is loaded."""

from __future__ import annotations

import logging
import os
import threading
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.window.workers import chat_reader  # noqa: E402
from app.window.workers.chat_reader import ChatReader  # noqa: E402
from app.window.workers.tasks import Workers, run_detached  # noqa: E402
from storage.chats import ChatStore  # noqa: E402


def test_success_and_progress_arrive_on_the_ui_thread_in_order(qtbot):
    workers = Workers()
    seen, threads = [], []

    def fn(task):
        threads.append(threading.current_thread())
        for i in range(5):
            task.report(i)
        return "done"

    def note(kind):
        return lambda value: seen.append((kind, value, threading.current_thread() is threading.main_thread()))

    task = workers.start(fn, name="t-ok", progress=note("p"), success=note("s"), failure=note("f"))
    with qtbot.waitSignal(task.finished, timeout=5_000):
        pass
    assert threads and threads[0] is not threading.main_thread() and threads[0].name == "t-ok"
    assert seen == [("p", i, True) for i in range(5)] + [("s", "done", True)]
    assert workers.running == []


def test_an_error_goes_to_failure_or_else_to_the_log(qtbot, caplog):
    workers = Workers()
    errors = []
    task = workers.start(lambda _t: 1 / 0, name="t-fail", failure=errors.append)
    with qtbot.waitSignal(task.finished, timeout=5_000):
        pass
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    with caplog.at_level(logging.WARNING, logger="app.window.workers.tasks"):
        task = workers.start(lambda _t: {}["missing"], name="t-unhandled")
        with qtbot.waitSignal(task.finished, timeout=5_000):
            pass
    record = next(r for r in caplog.records if "t-unhandled" in r.getMessage())
    assert record.exc_info and record.exc_info[0] is KeyError  # with its traceback


def test_shutdown_cancels_waits_within_its_bound_and_drops_late_results(qtbot):
    workers = Workers()
    delivered = []
    stubborn = threading.Event()

    def polite(task):
        task.cancelled.wait(10)
        return "late"

    def deaf(_task):
        stubborn.wait(10)  # ignores cancel

    workers.start(polite, name="t-polite", success=delivered.append)
    workers.start(deaf, name="t-deaf", success=delivered.append)
    started = time.monotonic()
    alive = workers.shutdown(timeout_s=0.5)
    took = time.monotonic() - started
    assert alive == ["t-deaf"] and 0.4 < took < 3
    stubborn.set()
    qtbot.wait(100)
    assert delivered == []  # nothing is delivered after shutdown
    assert workers.start(lambda _t: None, name="t-after") is None


def test_run_detached_logs_an_error(qtbot, caplog):
    with caplog.at_level(logging.WARNING, logger="app.window.workers.tasks"):
        run_detached(lambda: 1 / 0, "t-detached").join(5)
    assert any("t-detached" in r.getMessage() for r in caplog.records)


def test_the_chat_reader_keeps_newest_wins_per_key(qtbot, tmp_path):
    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    workers = Workers()
    reader = ChatReader(path, workers)
    gate = threading.Event()
    results = []

    def slow(_store):
        gate.wait(5)
        return "first"

    reader.submit("tree", slow, results.append)
    reader.submit("tree", lambda _s: "superseded", results.append)
    reader.submit("search", lambda _s: "other key", results.append)
    reader.submit("tree", lambda _s: "newest", results.append)
    gate.set()
    qtbot.waitUntil(lambda: not reader.pending("tree") and not reader.pending("search"), timeout=5_000)
    qtbot.wait(50)
    assert sorted(results) == ["newest", "other key"]
    reader.close()
    assert workers.shutdown(timeout_s=5) == []


def _reader_with_jobs(tmp_path):
    """A ChatReader on a new chats file, the lists a ``job(name)`` fills (names started on
    the worker, results delivered), and that ``job``."""
    path = tmp_path / "chats.sqlite3"
    ChatStore(path).close()
    workers = Workers()
    reader = ChatReader(path, workers)
    started, results = [], []

    def job(name):
        return lambda _store: started.append(name) or name

    return workers, reader, started, results, job


def test_the_chat_reader_hands_a_turns_jobs_over_when_the_loop_comes_back(qtbot, tmp_path):
    """Issue #27.6: the worker never competes for the GIL with the turn that submitted a job,
    and a job superseded within that turn never starts."""
    workers, reader, started, results, job = _reader_with_jobs(tmp_path)
    reader.submit("tree", job("older"), results.append)
    reader.submit("count", job("count"), results.append)
    reader.submit("tree", job("newest"), results.append)
    assert reader.held == 3 and reader.pending("tree") and reader.pending("count")
    threading.Event().wait(0.2)  # the worker is idle meanwhile: nothing was handed to it
    assert started == []
    qtbot.waitUntil(lambda: not reader.pending("tree") and not reader.pending("count"), timeout=5_000)
    assert started == ["count", "newest"] and sorted(results) == ["count", "newest"]
    assert reader.held == 0
    reader.close()
    assert workers.shutdown(timeout_s=5) == []


def test_the_chat_reader_holds_its_jobs_while_asked_and_for_a_bounded_time(qtbot, tmp_path):
    """Issue #27.6: while the window draws a chat's first screen the reader keeps the jobs
    (its Python would slow every call the UI thread makes into Python), then hands them over;
    a hold never lasts longer than ``HOLD_MAX_MS``."""
    workers, reader, started, results, job = _reader_with_jobs(tmp_path)
    reader.hold(True)
    reader.submit("tree", job("tree"), results.append)
    reader.submit("tree", job("newer tree"), results.append)
    qtbot.wait(100)  # turns of the event loop pass: still held
    assert started == [] and reader.held == 2 and reader.holding
    reader.hold(False)
    qtbot.waitUntil(lambda: results == ["newer tree"], timeout=5_000)
    assert started == ["newer tree"] and reader.held == 0
    # a hold nobody ends is ended after HOLD_MAX_MS
    reader.hold(True)
    reader.submit("count", job("count"), results.append)
    qtbot.wait(100)
    assert started == ["newer tree"]
    t0 = time.perf_counter()
    qtbot.waitUntil(lambda: "count" in results, timeout=5_000)
    assert not reader.holding and time.perf_counter() - t0 < chat_reader.HOLD_MAX_MS / 1000 + 1
    reader.close()
    assert workers.shutdown(timeout_s=5) == []


def test_the_engine_writer_never_makes_the_ui_thread_wait_and_keeps_the_order(qtbot):
    """Issue #27.6: a long branch's prompt (half a megabyte) waited on the pipe until the engine
    process read it (6-52 ms on the UI thread), and a small request written after it waited
    while the pipe was still full (0.1-0.5 s)."""
    from app.window.workers.engine_writer import EngineWriter

    workers = Workers()
    pipe_read = threading.Event()
    written: list[tuple[bytes, bool]] = []
    failures: list[Exception] = []

    def write(blob: bytes) -> None:
        pipe_read.wait(5)  # a full pipe: the engine process reads it later
        if blob == b"gone":
            raise BrokenPipeError("the engine process is gone")
        written.append((blob, threading.current_thread() is threading.main_thread()))

    writer = EngineWriter(write, workers, failures.append)
    big = b"p" * 500_000
    t0 = time.perf_counter()
    writer.send(big)
    writer.send(b"small")  # behind the big one: not written before it
    assert time.perf_counter() - t0 < 0.1 and written == [] and writer.waiting == 2
    pipe_read.set()
    qtbot.waitUntil(lambda: writer.waiting == 0, timeout=5_000)
    assert written == [(big, False), (b"small", False)]  # in order, never on the UI thread
    # a write that fails on the writer's thread is reported on the UI thread; nothing after it is written
    writer.send(b"gone")
    writer.send(b"never")
    qtbot.waitUntil(lambda: len(failures) == 1, timeout=5_000)
    assert isinstance(failures[0], BrokenPipeError)
    assert writer.close(5) and [b for b, _ in written] == [big, b"small"]
    # with a pipe that has room (``socket_room``), a request with nothing before it goes at once
    room: list[int] = []
    pipe_read.clear()
    writer = EngineWriter(write, workers, failures.append, room=lambda n: room.append(n) or n < 1_000)
    written.clear()
    pipe_read.set()
    writer.send(b"now")
    assert written == [(b"now", True)] and room == [3 + 8]
    pipe_read.clear()
    writer.send(big)  # no room for it: the writer's thread
    writer.send(b"then")  # behind it
    assert [b for b, _ in written] == [b"now"] and writer.waiting == 2
    pipe_read.set()
    qtbot.waitUntil(lambda: writer.waiting == 0, timeout=5_000)
    assert written == [(b"now", True), (big, False), (b"then", False)]
    assert writer.close(5) and workers.shutdown(timeout_s=5) == []


def test_the_engine_pipe_has_room_for_a_small_request_only_while_its_reader_keeps_up():
    """On Linux the engine pipe is a Unix socket pair: it polls writable while at most a quarter
    of its send buffer is unread, and a write up to that quarter then returns at once."""
    import socket
    import sys

    import pytest

    from app.window.workers.engine_writer import socket_room

    if not sys.platform.startswith("linux"):
        pytest.skip("told on Linux only: elsewhere every request goes to the writer's thread")
    a, b = socket.socketpair()
    with a, b:
        room = socket_room(a.fileno())
        limit = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4
        assert room(1_000) and room(limit) and not room(limit + 1)
        a.setblocking(False)
        while room(4_096):  # filled without reading, as a busy engine process leaves it
            a.send(b"x" * 4_096)
        assert not room(16)
        a.send(b"x" * 16_000)  # there was still room for more: poll says "no room" early
        while not room(limit):
            b.recv(65_536)
        assert a.send(b"y" * limit) == limit  # all of it, at once
