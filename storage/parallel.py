"""Memory-bound work split across two threads, and an xxh3 that lets the other one run.

A restore makes one pass over the block bytes in Python: each block's xxh3 is checked
just before the block is copied into the state blob (``engine.kv_gather.scatter``), so the
copy reads what the checksum has just brought into the CPU cache; then
``llama_state_seq_set_data`` reads the blob. Blocks are independent, the work runs in C
and releases the GIL (numpy's copies do; :func:`xxh3_64` does when the xxhash extension
exports its C function, checked at import: the Linux wheel does), so on a machine with a
second core two halves of the blocks run side by side. How much that saves depends on
memory bandwidth and on what else the machine runs (measured with `branchwise bench`).

:func:`in_halves` is the one way this project does that: a single long-lived helper
thread takes the first half of the work while the calling thread does the second.
:func:`pipelined` uses the same thread for a producer/consumer pair: it prepares item
``i + 1`` while the caller consumes item ``i`` (a restore's pieces: one is checked and
copied while llama.cpp reads the one before). Work already on the helper thread runs
``in_halves`` on that thread alone, so the two never wait for each other.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np
import xxhash

T = TypeVar("T")
R = TypeVar("R")

MIN_PARALLEL_BYTES = 4 * 1024 * 1024
"""Below this many bytes the hand-off (~50 µs) costs more than the second thread saves."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_on_helper = threading.local()  # .yes on the helper thread itself


def _mark_helper() -> None:
    _on_helper.yes = True


def _helper() -> ThreadPoolExecutor | None:
    """The helper thread's executor; None on a one-core machine and on the helper thread
    itself (a task there that asked it for more work would wait for itself)."""
    global _pool
    if (os.cpu_count() or 1) < 2 or getattr(_on_helper, "yes", False):
        return None
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="branchwise-copy",
                                       initializer=_mark_helper)
        return _pool


def in_halves(fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], nbytes: int) -> list[R]:
    """``fn(items)``, computed as ``fn(first half) + fn(second half)`` on two threads when
    ``nbytes`` (the bytes the work touches) is at least :data:`MIN_PARALLEL_BYTES` and the
    machine has two cores. ``fn`` must be safe to run on two disjoint halves at once.
    An exception from either half is raised here, after both have finished."""
    pool = _helper() if nbytes >= MIN_PARALLEL_BYTES and len(items) >= 2 else None
    if pool is None:
        return fn(items)
    mid = len(items) // 2
    first = pool.submit(fn, items[:mid])
    try:
        second = fn(items[mid:])
    finally:
        head = first.result()
    return head + second


def pipelined(produce: Callable[[int], T], consume: Callable[[int, T], bool], n: int) -> int:
    """``consume(i, produce(i))`` for ``i`` in ``0 .. n-1``, in order, stopping after the
    first ``consume`` that returns False. ``produce(0)`` runs on the calling thread (free to
    use :func:`in_halves`); each later ``produce(i + 1)`` runs on the helper thread while
    the caller runs ``consume(i, ...)`` (serially on a one-core machine). ``produce(i + 1)``
    and ``consume(i, ...)`` must be safe to run at once.

    Returns how many items were consumed with True. An exception from ``produce`` is
    raised here once the helper is idle again (the items before it were consumed).
    """
    pool = _helper()
    item = produce(0) if n else None
    done = 0
    for i in range(n):
        ahead = pool.submit(produce, i + 1) if pool is not None and i + 1 < n else None
        try:
            ok = consume(i, item)
        except BaseException:
            if ahead is not None:
                wait([ahead])
            raise
        if not ok:
            if ahead is not None:
                wait([ahead])  # it writes into memory the caller reuses: let it finish
            return done
        done += 1
        if i + 1 < n:
            item = ahead.result() if ahead is not None else produce(i + 1)
    return done


def _c_xxh3():
    """XXH3_64bits from the xxhash extension module, called through ctypes (which
    releases the GIL), or None when the module does not export it (Windows wheels) or
    it disagrees with the module's own function."""
    try:
        lib = ctypes.CDLL(xxhash._xxhash.__file__)  # type: ignore[attr-defined]
        fn = lib.XXH3_64bits
    except (AttributeError, OSError):
        return None
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    probe = np.arange(4099, dtype=np.uint32).view(np.uint8)
    if fn(probe.ctypes.data, probe.nbytes) != xxhash.xxh3_64_intdigest(probe):
        return None
    return fn


_XXH3 = _c_xxh3()


def xxh3_64(data) -> int:
    """xxh3-64 of a buffer as an unsigned int, equal to ``xxhash.xxh3_64_intdigest``;
    large buffers are hashed without holding the GIL where the C function is reachable."""
    view = memoryview(data)
    if _XXH3 is None or view.nbytes < 65536 or not view.c_contiguous:
        return xxhash.xxh3_64_intdigest(view)
    arr = np.frombuffer(view.cast("B"), dtype=np.uint8)
    return _XXH3(arr.ctypes.data, arr.nbytes)
