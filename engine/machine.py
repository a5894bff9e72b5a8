"""This machine's cores and memory, for defaults (CPU threads) and limits (largest context).

Standard library only: ``os.sysconf`` and ``/proc`` on Linux, ``sysctl`` on macOS; every
function falls back to a safe answer when the platform does not say.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _linux_physical_cores(cpuinfo: str) -> int:
    """Distinct (physical id, core id) pairs in a /proc/cpuinfo text; 0 when it has none."""
    cores, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores)


def physical_cores() -> int:
    """Physical CPU cores (llama.cpp's own default thread count); the logical count when the
    platform does not tell them apart. Always at least 1."""
    n = 0
    try:
        if sys.platform.startswith("linux"):
            n = _linux_physical_cores(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
        elif sys.platform == "darwin":
            n = int(subprocess.run(["sysctl", "-n", "hw.physicalcpu"], capture_output=True, text=True,
                                   timeout=5).stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        n = 0
    logical = os.cpu_count() or 1
    return max(1, min(n, logical) if n else logical)


def memory_bytes() -> tuple[int, int]:
    """(total, available) memory in bytes; available is the total when the platform does not
    say (MemAvailable in /proc/meminfo on Linux). (0, 0) when even the total is unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    available = total
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    return max(0, total), max(0, min(available, total) if total else available)


def default_threads() -> int:
    """CPU threads used when the setting is 0 (automatic): the physical core count less one,
    at least 1. llama.cpp's own default is the physical core count, but its threads
    spin-wait for each other, so when anything else wants a core (the window, other
    programs) one descheduled thread stalls them all: on a busy 2-core machine decode fell
    from 40.9 tok/s with 1 thread to 5.5 tok/s with 2 (README "CPU threads"; re-measure with
    ``branchwise bench --threads``)."""
    return max(1, physical_cores() - 1)
