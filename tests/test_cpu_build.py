"""llama.cpp is built without its AMX kernels wherever uv builds it (pyproject.toml,
``[tool.uv.extra-build-variables]``), so no load in this repository can reach them.

The kernels crash on some CPUs that report AMX (README, "CPU support"). This machine may
have no AMX, so the first test compiles for an AMX CPU (``-march=sapphirerapids``, which is
what ``-march=native`` means on one) with the build flags from pyproject.toml, and checks
that the macro every AMX kernel and the AMX weight buffer are compiled under
(``__AMX_INT8__``, ggml/src/ggml-cpu/amx/amx.cpp) is not defined. Remove the flags and it
fails. The others check the library that was actually built.
"""

from __future__ import annotations

import ctypes
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """\
#include <immintrin.h>
#if defined(__AMX_INT8__)
#error "__AMX_INT8__ is defined: llama.cpp would compile its AMX kernels"
#endif
int main(void) { return 0; }
"""


def build_variables() -> dict[str, str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["uv"]["extra-build-variables"]["llama-cpp-python"]


@pytest.mark.parametrize("language", ["CFLAGS", "CXXFLAGS"])
def test_the_build_flags_leave_the_amx_kernels_out_on_an_amx_cpu(tmp_path, language):
    compiler = shutil.which("c++" if language == "CXXFLAGS" else "cc")
    if compiler is None:
        pytest.skip("no C/C++ compiler on this machine")
    machine = subprocess.run([compiler, "-dumpmachine"], capture_output=True, text=True).stdout
    if not machine.startswith(("x86_64", "i686", "amd64")):
        pytest.skip(f"AMX is an x86 feature; this compiler targets {machine.strip()}")
    source = tmp_path / ("probe.cpp" if language == "CXXFLAGS" else "probe.c")
    source.write_text(PROBE)
    flags = shlex.split(build_variables()[language])
    amx = subprocess.run([compiler, "-march=sapphirerapids", "-c", str(source), "-o", str(tmp_path / "p.o")],
                         capture_output=True, text=True)
    assert amx.returncode != 0, "the probe must see __AMX_INT8__ without the flags"  # the probe itself works
    protected = subprocess.run([compiler, "-march=sapphirerapids", *flags, "-c", str(source),
                                "-o", str(tmp_path / "p.o")], capture_output=True, text=True)
    assert protected.returncode == 0, protected.stderr


def test_the_built_llama_cpp_reports_no_amx_kernels():
    from engine.cpu import has_amx_kernels, system_info

    info = system_info()
    assert "CPU :" in info and not has_amx_kernels(info), info


AMX_BUFFER_SYMBOLS = ("_Z28ggml_backend_amx_buffer_typev", "ggml_backend_amx_buffer_type")
"""The AMX weight buffer's constructor, as the C++ compiler names it (Itanium ABI) and
unmangled: a build with the AMX kernels exports it (``nm -D libggml-cpu.so`` of a build for
``-mamx-int8`` lists ``_Z28ggml_backend_amx_buffer_typev``), one without does not."""


def test_the_built_library_has_no_amx_weight_buffer():
    import llama_cpp

    if sys.platform == "win32":
        pytest.skip("MSVC mangles C++ names another way")
    folder = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(folder.glob("*ggml-cpu*")) or sorted(folder.glob("*ggml*"))
    assert libs, f"llama-cpp-python's ggml libraries were not found in {folder}"
    for lib in libs:
        handle = ctypes.CDLL(str(lib))
        assert not any(hasattr(handle, name) for name in AMX_BUFFER_SYMBOLS), lib
    cpu = ctypes.CDLL(str(next((lib for lib in libs if "cpu" in lib.name), libs[0])))
    assert hasattr(cpu, "ggml_backend_cpu_init"), "symbol look-up must work for the check above to mean anything"
