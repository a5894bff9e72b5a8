"""What this CPU and this llama.cpp build can do, and whether to repack weights.

llama.cpp's CPU backend can move a model's weights into "extra buffer types" at load
(``llama_model_params.use_extra_bufts``, ggml/src/ggml-cpu/ggml-cpu.cpp
``ggml_backend_cpu_get_extra_buffer_types``): the AMX buffer when the build has AMX
kernels (``__AMX_INT8__``), KleidiAI on ARM, and the generic repack of Q4_0/IQ4_NL/Q8_0
into interleaved rows for AVX2 and NEON. On CPUs that report AMX (Intel Sapphire Rapids
and newer, common on cloud VMs) the AMX kernel faults on some machines: a general
protection fault at ``ldtilecfg`` in ``ggml_backend_amx_mul_mat`` (llama.cpp issue #20824
and PR #26954: tile permission is per thread, and a tile config the compiler optimised
away; ollama #17205 on AWS m7i, #17249 on GCP C4). A plain ``llama_cpp.Llama`` on the
default model crashes the same way there, and loading with ``use_extra_bufts = False``
avoids it.

The rule (:func:`decide_repack`), in order:

1. ``BRANCHWISE_REPACK=on|off`` in the environment (for bug reports);
2. the user's setting, "on" or "off";
3. a crash verdict: an engine process that died by a signal while repacking was on is
   remembered for this machine and this llama.cpp build (``cpu-verdict.json`` in the
   data folder; see :class:`CrashVerdict`), and repacking stays off from then on;
4. "auto": off when llama.cpp reports AMX kernels (``AMX_INT8 = 1`` in its system info:
   the AMX buffer type exists only then), on otherwise.

The cost of "off" is measured by ``branchwise bench --repack`` (README, "CPU support").
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "BRANCHWISE_REPACK"
CRASH_ENV = "BRANCHWISE_DEBUG_CRASH"
"""For tests of crash recovery: ``before-first-token`` makes the engine process kill itself
with a real SIGSEGV after prefill, before the first token (as a crash in a llama.cpp kernel
would), in the CLI and in the window's engine process alike."""
VERDICT_FILE = "cpu-verdict.json"


class RepackSource(StrEnum):
    """Where a repack decision came from."""

    ENV = "environment"
    SETTING = "setting"
    CRASH_VERDICT = "crash verdict"
    AUTO = "auto"


@dataclass(frozen=True)
class RepackDecision:
    """Whether llama.cpp may use its extra buffer types, and why (a sentence for a person)."""

    repack: bool
    source: RepackSource
    reason: str

    def to_dict(self) -> dict:
        return {"repack": self.repack, "source": str(self.source), "reason": self.reason}


TILED_TYPES = frozenset({10, 11, 12, 13, 14, 16, 17, 18, 19, 21, 22, 23, 29})
"""ggml type ids (``ggml.h``: Q2_K..Q6_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S,
IQ4_XS, IQ1_M) that llama.cpp's tiled matmul (``ggml-cpu/tiled/tiled.cpp``, x86) multiplies
when a batch has at least :data:`TILED_MIN_BATCH` rows, and ``vec_dot`` below that: the
two round differently, so the KV of a token depends on the size of its batch."""
TILED_MIN_BATCH = 8  # ggml_tiled_min_batch
REPACK_VARIANT_TYPES = TILED_TYPES | {20}
"""Types whose repacked weights (extra buffer types, x86 AVX2) are multiplied four batch
rows at a time and the rest one at a time, by kernels that round differently: measured for
Q4_K (and Q6_K) with ``tools/step_exactness.py``-style batch scans; IQ4_NL, repacked the same
way, is counted in unmeasured. Q4_0, Q8_0 and Q4_1 repacked gave the same KV at every batch
size."""


def min_batch(layer_types: frozenset[int] | None) -> int:
    """The smallest prefill batch whose KV equals a from-scratch prefill's, bit for bit, for a
    model whose layer weights have ``layer_types`` (``engine.gguf_meta.layer_weight_types``;
    None: unknown, taken as the strictest): :data:`TILED_MIN_BATCH` when llama.cpp's tiled
    kernel takes part, else 2 (a single token goes through other kernels than any batch).
    Measured on x86 AVX2 with weight repacking off for the tiled types (README, "Exact
    restores"): random splits of a prompt into batches of at least this many tokens gave
    the KV of one batch for SmolLM2 Q4_1/Q4_0/Q8_0, Gemma 3 270M and Q4_K_M llamas."""
    return TILED_MIN_BATCH if layer_types is None or layer_types & TILED_TYPES else 2


def decide_repack(setting: str, env: str | None, system_info: str, crash_verdict: bool,
                  layer_types: frozenset[int] | None = None) -> RepackDecision:
    """Decide whether to load with llama.cpp's extra buffer types (weight repacking).

    Args:
        setting: the user's choice, "auto", "on" or "off".
        env: the value of ``BRANCHWISE_REPACK`` (None or "" when unset; "auto" defers).
        system_info: ``llama_print_system_info()`` of the loaded llama.cpp, e.g.
            ``"CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |"``.
        crash_verdict: an engine crashed on this machine and build while repacking was on.
        layer_types: the ggml types of the model's layer weights (None: not known); with
            any of :data:`REPACK_VARIANT_TYPES`, "auto" is off (exact restores).

    Raises:
        ValueError: ``env`` or ``setting`` is not one of auto/on/off.
    """
    env = (env or "").strip().lower()
    if env not in ("", "auto", "on", "off"):
        raise ValueError(f"{ENV_VAR} must be on, off or auto, not {env!r}")
    if env in ("on", "off"):
        return RepackDecision(env == "on", RepackSource.ENV, f"{ENV_VAR}={env} is set")
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"the repack setting must be auto, on or off, not {setting!r}")
    if setting in ("on", "off"):
        return RepackDecision(setting == "on", RepackSource.SETTING, f"the setting says {setting}")
    if crash_verdict:
        return RepackDecision(
            False, RepackSource.CRASH_VERDICT,
            "the engine crashed on this machine with weight repacking on, so it stays off")
    if has_amx_kernels(system_info):
        return RepackDecision(
            False, RepackSource.AUTO,
            "llama.cpp was built with AMX kernels, which crash on some CPUs (llama.cpp #20824); "
            "weights are used as stored")
    if layer_types and layer_types & REPACK_VARIANT_TYPES:
        return RepackDecision(
            False, RepackSource.AUTO,
            "this model's K-quant weights, repacked, would be multiplied by kernels that round differently "
            "for different batch sizes, and a restored prefix could then differ from a from-scratch one; "
            "llama.cpp's tiled kernel multiplies them as stored")
    return RepackDecision(True, RepackSource.AUTO, "no AMX kernels in this llama.cpp build")


def has_amx_kernels(system_info: str) -> bool:
    """True when llama.cpp's system info line reports ``AMX_INT8 = 1``."""
    return "AMX_INT8 = 1" in system_info


# -- facts about this llama.cpp build ------------------------------------------------------


def system_info() -> str:
    """llama.cpp's one-line summary of the CPU features and backends it was built with."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def build_versions() -> dict[str, str]:
    """Versions a bug report needs: Branchwise, llama-cpp-python, ggml (llama.cpp) and its commit."""
    from importlib import metadata

    import llama_cpp

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    out = {"branchwise": dist("branchwise"), "llama-cpp-python": llama_cpp.__version__}
    lib = llama_cpp.llama_cpp._lib
    for key, symbol in (("ggml", "ggml_version"), ("llama.cpp commit", "ggml_commit")):
        fn = getattr(lib, symbol, None)
        if fn is None:
            out[key] = "unknown"
            continue
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        out[key] = (fn() or b"unknown").decode("utf-8", "replace")
    return out


def build_id() -> str:
    """A short id of this llama.cpp build on this CPU: a verdict is only valid for it."""
    v = build_versions()
    text = "|".join([v["llama-cpp-python"], v["ggml"], v["llama.cpp commit"], system_info(), _cpu_model()])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or platform.machine()


# -- the remembered crash verdict ---------------------------------------------------------


@dataclass(frozen=True)
class CrashVerdict:
    """A remembered native crash of the engine while weights were repacked.

    Stored as JSON in ``<data dir>/cpu-verdict.json``: ``build_id`` (:func:`build_id`),
    ``signal`` (e.g. "SIGSEGV"), ``when`` (Unix seconds). A newer llama.cpp build or a
    different CPU has another build id, so it is tried afresh.
    """

    build_id: str
    signal: str
    when: float

    @staticmethod
    def path(data_dir: Path) -> Path:
        return Path(data_dir) / VERDICT_FILE

    @classmethod
    def load(cls, data_dir: Path) -> "CrashVerdict | None":
        """The verdict in ``data_dir``, or None if there is none or it cannot be read."""
        try:
            data = json.loads(cls.path(data_dir).read_text(encoding="utf-8"))
            return cls(str(data["build_id"]), str(data["signal"]), float(data["when"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def applies(cls, data_dir: Path) -> bool:
        """True when ``data_dir`` holds a verdict for this very build and CPU."""
        verdict = cls.load(data_dir)
        return verdict is not None and verdict.build_id == build_id()

    @classmethod
    def record(cls, data_dir: Path, signal_name: str) -> None:
        """Remember a crash for this build (best effort: a full disk only loses the memory)."""
        verdict = cls(build_id(), signal_name, time.time())
        path = cls.path(data_dir)
        try:
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(asdict(verdict), f)
            os.replace(tmp, path)
        except OSError:
            log.warning("could not remember the crash verdict in %s", path, exc_info=True)


# -- loading with or without extra buffer types -------------------------------------------

_params_lock = threading.Lock()


@contextlib.contextmanager
def model_params_with_repack(repack: bool, sequences: int = 1):
    """Inside this block, ``llama_cpp.Llama(...)`` loads with ``use_extra_bufts = repack``
    and, with ``sequences`` > 1, a context of that many sequences sharing one KV cache
    (``n_seq_max``, ``kv_unified``: the engine's scratch sequence,
    ``engine.live_context.SCRATCH_SEQ``; the cache keeps its size in cells).

    llama-cpp-python 0.3.36 builds its ``llama_model_params`` and ``llama_context_params``
    from ``llama_model_default_params()`` / ``llama_context_default_params()`` inside
    ``Llama.__init__`` and has no arguments for these fields, so the defaults functions are
    wrapped for the duration of the load (one load at a time, under a lock).
    """
    import llama_cpp.llama_cpp as low

    with _params_lock:
        model_defaults, context_defaults = low.llama_model_default_params, low.llama_context_default_params

        def model_params():
            params = model_defaults()
            params.use_extra_bufts = repack
            return params

        def context_params():
            params = context_defaults()
            params.n_seq_max = sequences
            params.kv_unified = True
            return params

        low.llama_model_default_params = model_params
        if sequences > 1:
            low.llama_context_default_params = context_params
        try:
            yield
        finally:
            low.llama_model_default_params, low.llama_context_default_params = model_defaults, context_defaults


def load_llama(path: str | Path, *, setting: str = "auto", data_dir: Path | None = None,
               force: bool | None = None, **kwargs):
    """A ``llama_cpp.Llama`` on ``path``, loaded under this machine's repack decision.

    For every load outside the engine's own (:class:`engine.model.LoadedModel`): the benches
    and the tests. ``tests/test_architecture.py`` fails on a ``llama_cpp.Llama(`` call
    anywhere else. The decision is :func:`decide_repack` with ``setting``, the environment
    and, when ``data_dir`` is given, its crash verdict; ``force`` (``branchwise bench --cpu``,
    which measures both) overrides all of them. ``kwargs`` go to ``llama_cpp.Llama``.

    Returns:
        ``(llama, decision)``: the model and the :class:`RepackDecision` it was loaded with.

    Raises:
        ValueError: llama-cpp-python refused the file, or ``BRANCHWISE_REPACK`` is not
            on/off/auto.
    """
    import llama_cpp

    if force is not None:
        decision = RepackDecision(force, RepackSource.SETTING, f"forced {'on' if force else 'off'} by the caller")
    else:
        verdict = CrashVerdict.applies(data_dir) if data_dir is not None else False
        decision = decide_repack(setting, os.environ.get(ENV_VAR), system_info(), verdict)
    with model_params_with_repack(decision.repack):
        llama = llama_cpp.Llama(str(path), **kwargs)
    return llama, decision


def remember_crash(data_dir: Path, what: str) -> bool:
    """Record a native crash that happened with repacking on (:class:`CrashVerdict`), unless
    it was forced by ``BRANCHWISE_DEBUG_CRASH``. Returns whether it was recorded."""
    if os.environ.get(CRASH_ENV):
        return False
    CrashVerdict.record(data_dir, what)
    return True


def debug_crash(point: str) -> None:
    """Die by SIGSEGV here when ``BRANCHWISE_DEBUG_CRASH`` names ``point`` (tests only)."""
    if os.environ.get(CRASH_ENV) == point:
        import faulthandler

        faulthandler._sigsegv()
