"""PyInstaller hook for llama-cpp-python (0.3.x).

``llama_cpp/llama_cpp.py`` loads ``<package>/lib/libllama.so`` (``.dylib`` on macOS,
``llama.dll`` on Windows) with ctypes, and that library links the ggml libraries
next to it. PyInstaller's import analysis cannot see ctypes loads, so the whole
``lib/`` folder is collected as binaries into ``llama_cpp/lib`` (binaries, not
data, so their own dependencies such as libgomp / vcomp140.dll are analysed too).

A wheel installed on Linux holds each shared library three times (``libx.so``,
``libx.so.0``, ``libx.so.0.25.3``) as copies, not symlinks. Only the two names that
are ever opened are kept: the unversioned name ctypes loads and the SONAME the
dynamic linker looks for. That saves ~16 MB per platform build.
"""

import os
import re
import subprocess
import sys

from PyInstaller.utils.hooks import collect_data_files, get_package_paths

_pkg_base, _pkg_dir = get_package_paths("llama_cpp")
_lib_dir = os.path.abspath(os.path.join(_pkg_dir, "lib"))


def _soname(path):
    """The ELF SONAME of ``path`` (e.g. ``libggml.so.0``), or None if unknown."""
    try:
        out = subprocess.run(["objdump", "-p", path], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    m = re.search(r"^\s*SONAME\s+(\S+)", out, re.M)
    return m.group(1) if m else None


def _wanted(name):
    if sys.platform == "win32":
        return name.lower().endswith(".dll")
    if sys.platform == "darwin":
        return name.endswith((".dylib", ".so"))
    if ".so" not in name:
        return False
    if name.endswith(".so"):  # the name ctypes loads
        return True
    stem = name.split(".so", 1)[0] + ".so"
    soname = _soname(os.path.join(_lib_dir, stem)) if os.path.exists(os.path.join(_lib_dir, stem)) else None
    if soname is None:  # no objdump: keep every versioned name rather than guess
        return True
    return name == soname


binaries = []
_metal = []  # macOS without GGML_METAL_EMBED_LIBRARY: the Metal shader source/library beside the dylibs
if os.path.isdir(_lib_dir):
    for _name in sorted(os.listdir(_lib_dir)):
        _path = os.path.join(_lib_dir, _name)
        if not os.path.isfile(_path):
            continue
        if _wanted(_name):
            binaries.append((_path, os.path.join("llama_cpp", "lib")))
        elif _name.endswith((".metal", ".metallib")):
            _metal.append((_path, os.path.join("llama_cpp", "lib")))

# llama_cpp's server and chat-format helpers ship no templates of their own today;
# collect any non-Python data (e.g. a future grammar/template folder) except lib/.
datas = _metal + [
    d for d in collect_data_files("llama_cpp") if not os.path.abspath(d[0]).startswith(_lib_dir + os.sep)
]

# The server extra (FastAPI, uvicorn) and the multimodal helpers are not used by the app.
excludedimports = ["llama_cpp.server"]
