#!/usr/bin/env bash
# Build dist/Branchwise-<version>-macos-<arch>.dmg from a PyInstaller .app (run on macOS).
#
#   packaging/macos/build_dmg.sh
#
# Environment:
#   BRANCHWISE_PORTABLE=1   rebuild llama-cpp-python with CMAKE_ARGS (default
#                           "-DGGML_NATIVE=off -DGGML_METAL=on") before freezing; the release
#                           workflow sets it. Default: reuse the .venv's build.
#   PYINSTALLER_VERSION     default 6.22.3
# Signing (each step runs only when its secrets are set; otherwise the app stays ad-hoc signed):
#   APPLE_CERTIFICATE_P12_BASE64, APPLE_CERTIFICATE_PASSWORD   Developer ID Application cert,
#                           imported into a temporary keychain
#   APPLE_CODESIGN_IDENTITY e.g. "Developer ID Application: Name (TEAMID)"
#   APPLE_ID, APPLE_TEAM_ID, APPLE_APP_PASSWORD                notarize + staple the .dmg
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYINSTALLER_VERSION="${PYINSTALLER_VERSION:-6.22.3}"
START=$(date +%s)
say() { printf '\n[+%ds] %s\n' "$(($(date +%s) - START))" "$*"; }

say "uv sync"
uv sync --frozen
if [ "${BRANCHWISE_PORTABLE:-0}" = "1" ]; then
    say "rebuild llama-cpp-python (portable, Metal)"
    LLAMA_REQ=$(uv export --frozen --no-hashes --no-emit-project --no-header | grep -i '^llama-cpp-python==' | cut -d';' -f1 | tr -d ' ')
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=off -DGGML_METAL=on}" \
        uv pip install --reinstall-package llama-cpp-python --no-binary llama-cpp-python \
        --no-cache --no-deps "$LLAMA_REQ"
fi

VERSION=$(uv run --frozen --no-sync python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(uname -m)
WORK="$ROOT/build/pyinstaller"
APP="$WORK/dist/Branchwise.app"
DMG="$ROOT/dist/Branchwise-$VERSION-macos-$ARCH.dmg"
mkdir -p "$ROOT/dist"

say "PyInstaller $PYINSTALLER_VERSION"
uv run --frozen --no-sync --with "pyinstaller==$PYINSTALLER_VERSION" \
    pyinstaller --noconfirm --clean --log-level WARN \
    --distpath "$WORK/dist" --workpath "$WORK/work" packaging/branchwise.spec
"$APP/Contents/MacOS/Branchwise" --help >/dev/null

IDENTITY="${APPLE_CODESIGN_IDENTITY:-}"
KEYCHAIN=""
cleanup() { if [ -n "$KEYCHAIN" ]; then security delete-keychain "$KEYCHAIN" || true; fi; }
trap cleanup EXIT

if [ -n "$IDENTITY" ]; then
    if [ -n "${APPLE_CERTIFICATE_P12_BASE64:-}" ]; then
        say "import the signing certificate into a temporary keychain"
        TMPD="${RUNNER_TEMP:-$(mktemp -d)}"
        KEYCHAIN="$TMPD/branchwise-signing.keychain-db"
        KEYCHAIN_PASSWORD=$(uuidgen)
        security create-keychain -p "$KEYCHAIN_PASSWORD" "$KEYCHAIN"
        security set-keychain-settings -lut 3600 "$KEYCHAIN"
        security unlock-keychain -p "$KEYCHAIN_PASSWORD" "$KEYCHAIN"
        echo "$APPLE_CERTIFICATE_P12_BASE64" | base64 --decode > "$TMPD/cert.p12"
        security import "$TMPD/cert.p12" -k "$KEYCHAIN" -P "${APPLE_CERTIFICATE_PASSWORD:-}" \
            -T /usr/bin/codesign
        rm -f "$TMPD/cert.p12"
        security set-key-partition-list -S apple-tool:,apple: -s -k "$KEYCHAIN_PASSWORD" "$KEYCHAIN" >/dev/null
        security list-keychains -d user -s "$KEYCHAIN" $(security list-keychains -d user | tr -d '"')
    fi
    say "codesign with $IDENTITY (hardened runtime)"
    sign() {
        codesign --force --timestamp --options runtime \
            --entitlements packaging/macos/entitlements.plist --sign "$IDENTITY" "$@"
    }
    # Inside out: every Mach-O file, then framework bundles, then the app.
    while IFS= read -r -d '' f; do
        if file -b "$f" | grep -q 'Mach-O'; then sign "$f"; fi
    done < <(find "$APP/Contents" -type f -print0)
    while IFS= read -r -d '' fw; do sign "$fw"; done < <(find "$APP/Contents" -type d -name '*.framework' -print0)
    sign "$APP"
    codesign --verify --deep --strict --verbose=2 "$APP"
else
    say "no APPLE_CODESIGN_IDENTITY: keeping PyInstaller's ad-hoc signature"
fi

say "dmg"
STAGE="$ROOT/build/dmg"
rm -rf "$STAGE" "$DMG" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "Branchwise $VERSION" -srcfolder "$STAGE" -ov -format UDZO -fs HFS+ "$DMG"
if [ -n "$IDENTITY" ]; then codesign --force --timestamp --sign "$IDENTITY" "$DMG"; fi

if [ -n "$IDENTITY" ] && [ -n "${APPLE_ID:-}" ] && [ -n "${APPLE_TEAM_ID:-}" ] && [ -n "${APPLE_APP_PASSWORD:-}" ]; then
    say "notarize"
    xcrun notarytool submit "$DMG" --apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" \
        --password "$APPLE_APP_PASSWORD" --wait
    xcrun stapler staple "$DMG"
else
    say "notarization skipped (APPLE_ID / APPLE_TEAM_ID / APPLE_APP_PASSWORD not all set)"
fi

say "done"
printf 'app       %s  %s\n' "$(du -sh "$APP" | cut -f1)" "$APP"
printf 'artifact  %s  %s\n' "$(du -h "$DMG" | cut -f1)" "$DMG"
printf 'elapsed   %ds\n' "$(($(date +%s) - START))"
