"""Render assets/branchwise.svg into the raster icons the installers need.

    uv run python packaging/make_icons.py

Writes assets/branchwise.png (256 px, Linux .desktop / hicolor theme),
assets/branchwise.ico (Windows, 256 px) and assets/branchwise.icns (macOS, 512 px),
using Qt's own SVG renderer and image writers (the ico and icns image-format plugins
ship with PySide6-Essentials), so no extra tool is needed. Run it after editing the SVG.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"

# (file name, pixel size, Qt image format)
TARGETS = [
    ("branchwise.png", 256, "PNG"),
    ("branchwise.ico", 256, "ICO"),
    ("branchwise.icns", 512, "ICNS"),
]


def render(svg: Path, size: int):
    """Render ``svg`` to a square ARGB QImage of ``size`` x ``size`` pixels."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: {svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication, QImageWriter

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 - plugins need it
    supported = {bytes(f).decode().upper() for f in QImageWriter.supportedImageFormats()}
    svg = ASSETS / "branchwise.svg"
    for name, size, fmt in TARGETS:
        if fmt not in supported:
            print(f"skip {name}: this Qt cannot write {fmt}")
            continue
        out = ASSETS / name
        if not render(svg, size).save(str(out), fmt):
            raise SystemExit(f"make_icons: could not write {out}")
        print(f"wrote {out.relative_to(ASSETS.parent)} ({size} px, {out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
