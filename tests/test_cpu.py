"""The weight-repacking decision (engine/cpu.py) and the supervisor's crash words."""

import signal

import pytest

from app.cli.supervisor import crash_description
from engine.cpu import RepackSource, decide_repack, has_amx_kernels

AVX2 = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 | REPACK = 1 |"
AMX = ("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | "
       "OPENMP = 1 | REPACK = 1 |")
NEON = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | REPACK = 1 | ACCELERATE = 1 |"


def test_auto_turns_repacking_off_only_where_llama_cpp_has_amx_kernels():
    assert has_amx_kernels(AMX) and not has_amx_kernels(AVX2) and not has_amx_kernels(NEON)
    assert decide_repack("auto", None, AVX2, False).repack is True
    assert decide_repack("auto", None, NEON, False).repack is True
    amx = decide_repack("auto", None, AMX, False)
    assert amx.repack is False and amx.source is RepackSource.AUTO and "AMX" in amx.reason


def test_a_remembered_crash_keeps_auto_off_but_not_an_explicit_choice():
    verdict = decide_repack("auto", "", AVX2, True)
    assert verdict.repack is False and verdict.source is RepackSource.CRASH_VERDICT
    assert decide_repack("on", None, AVX2, True).repack is True
    assert decide_repack("on", None, AMX, False).repack is True  # the user asked for it


def test_the_environment_overrides_the_setting():
    assert decide_repack("on", "off", AVX2, False) == decide_repack("auto", "OFF", AMX, True)
    forced = decide_repack("off", "on", AMX, True)
    assert forced.repack is True and forced.source is RepackSource.ENV
    assert decide_repack("off", "auto", AVX2, False).source is RepackSource.SETTING
    with pytest.raises(ValueError, match="BRANCHWISE_REPACK"):
        decide_repack("auto", "yes", AVX2, False)
    with pytest.raises(ValueError, match="auto, on or off"):
        decide_repack("sometimes", None, AVX2, False)


def test_crash_exit_codes_become_words():
    assert "segmentation fault" in crash_description(-signal.SIGSEGV)
    assert "abort" in crash_description(-signal.SIGABRT)
    assert "access violation" in crash_description(0xC0000005)
    assert crash_description(0) is None and crash_description(1) is None and crash_description(130) is None


@pytest.fixture(scope="module")
def q4_0_model(tmp_path_factory):
    from app.bench_cpu import quantize_q4_0
    from engine.model_file import default_model_path

    return quantize_q4_0(default_model_path(), tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf")


@pytest.mark.parametrize("repack", ["on", "off"])
def test_the_decision_reaches_llama_cpp(q4_0_model, repack, monkeypatch):
    """llama.cpp logs a CPU_REPACK weight buffer for a Q4_0 model only when repacking is on."""
    import collections

    from engine import model as model_module
    from engine.settings import EngineSettings

    monkeypatch.delenv("BRANCHWISE_REPACK", raising=False)
    monkeypatch.setattr(model_module, "_recent_log", collections.deque(maxlen=5000))
    loaded = model_module.LoadedModel(q4_0_model, EngineSettings(n_ctx=512, repack=repack))
    try:
        buffers = [line for line in model_module._recent_log if "model buffer size" in line]
        assert any("CPU_REPACK" in line for line in buffers) is (repack == "on"), buffers
        assert loaded.facts.repack.startswith(f"{repack} (the setting says {repack})")
    finally:
        loaded.close()
