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
    from app.bench.cpu import quantize_q4_0
    from engine.model_file import default_model_path

    return quantize_q4_0(default_model_path(), tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf")


def expected_extra_buffer(info: str) -> str | None:
    """The weight buffer llama.cpp names for a Q4_0 model with repacking on, from its system
    info (ggml/src/ggml-cpu/ggml-cpu.cpp ``ggml_backend_cpu_get_extra_buffer_types``: the AMX
    buffer comes first when the build has AMX kernels, then KleidiAI, then the generic repack)."""
    if "AMX_INT8 = 1" in info:
        return "AMX"
    if "KLEIDIAI = 1" in info:
        return "CPU_KLEIDIAI"
    if "REPACK = 1" in info:
        return "CPU_REPACK"
    return None


def test_expected_extra_buffer_follows_the_system_info():
    assert expected_extra_buffer(AVX2) == "CPU_REPACK" and expected_extra_buffer(NEON) == "CPU_REPACK"
    assert expected_extra_buffer(AMX) == "AMX"
    assert expected_extra_buffer("CPU : SSE3 = 1 | AVX2 = 1 |") is None


@pytest.mark.parametrize("repack", ["on", "off"])
def test_the_decision_reaches_llama_cpp(q4_0_model, repack, monkeypatch):
    """With repacking on, llama.cpp logs the extra weight buffer its system info predicts
    (CPU_REPACK on AVX2/AVX-512/NEON builds); with it off, only plain CPU buffers."""
    import collections

    from engine import cpu
    from engine import model as model_module
    from engine.settings import EngineSettings

    extra = expected_extra_buffer(cpu.system_info())
    if repack == "on" and extra is None:
        pytest.skip(f"this llama.cpp build has no extra buffer types: {cpu.system_info()}")
    monkeypatch.delenv("BRANCHWISE_REPACK", raising=False)
    monkeypatch.setattr(model_module, "_recent_log", collections.deque(maxlen=5000))
    loaded = model_module.LoadedModel(q4_0_model, EngineSettings(n_ctx=512, repack=repack))
    try:
        buffers = [line.split(":", 1)[1].split()[0] for line in model_module._recent_log
                   if "model buffer size" in line]
        assert buffers, list(model_module._recent_log)[-20:]
        plain = {"CPU", "CPU_Mapped", "Metal", "Metal_Mapped"}
        if repack == "on":
            assert extra in buffers, buffers
        else:
            assert set(buffers) <= plain, buffers
        assert loaded.facts.repack.startswith(f"{repack} (the setting says {repack})")
    finally:
        loaded.close()
