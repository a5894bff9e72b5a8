"""How the engine process ended, in words a person can act on (no Qt here).

``multiprocessing`` reports a child killed by a signal as a negative exit code on POSIX
(``-signal.SIGSEGV`` is -11) and, on Windows, the process's exit status: an NTSTATUS
exception code such as 0xC0000005 (access violation, ntstatus.h). A native crash inside
llama.cpp (a segmentation fault, an illegal instruction, an abort from GGML_ASSERT) ends
only the engine process; the window reports it and can start a new one.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from engine.process_exit import crash_name

@dataclass(frozen=True)
class CrashReport:
    """``message``: the banner text. ``native_crash``: llama.cpp (or another native library)
    crashed, as opposed to the process being killed or exiting. ``safe_restart``: Restart
    should load the model with weight repacking off (see ``describe_exit``)."""

    message: str
    native_crash: bool
    safe_restart: bool


def describe_exit(exitcode: int | None, log_file: Path | str, *, early: bool, repack: str) -> CrashReport:
    """The banner for an engine process that ended with ``exitcode`` (``None``: not started).

    ``early``: it died while loading the model or before its first reply finished.
    ``repack``: the EngineSettings ``repack`` in use ("auto", "on" or "off"). A native crash
    that early with repacking not off looks like llama.cpp's AMX crash (the repacked weights
    of the CPU "extra buffer types", llama.cpp #20824), so Restart turns repacking off.
    """
    details = (f"The details are in {log_file}." if Path(log_file).is_file()
               else f"It left no details ({log_file} was not written).")
    log_file = str(log_file)
    safe = "Your conversations are safe."
    if exitcode is None:
        return CrashReport(f"The engine is not running. {safe} Restart the engine to continue.", False, False)
    name = crash_name(exitcode)
    if name is not None:
        safe_restart = early and repack != "off"
        if safe_restart:
            plan = ("Restart will load the model with weight repacking off (llama.cpp's CPU \"extra buffer "
                    "types\"), which avoids a known llama.cpp crash on some CPUs; Branchwise remembers this.")
        else:
            plan = "Restart starts a new engine process; if the crash repeats, try another model file."
        return CrashReport(f"The engine crashed in llama.cpp ({name}). {safe} {details} {plan}",
                           True, safe_restart)
    if exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
        if exitcode == -getattr(signal, "SIGKILL", 9):
            how += "; the system may have run out of memory"
    else:
        how = f"exit code {exitcode}"
    return CrashReport(f"The engine process stopped unexpectedly ({how}). {safe} {details} "
                       "Restart the engine to continue.", False, False)
