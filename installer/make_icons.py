"""Render resources/halaman.svg to the bitmaps the installers need, once, when the SVG changes:

    resources/halaman.png   256 px: the hicolor 256x256 icon (Linux) and the Tk window icon
    resources/halaman.ico   16-256 px: the Start-menu shortcut and Settings > Apps (Windows)

Needs PySide6 (QtSvg renders the SVG) and Pillow (writes the multi-size ICO), both in the dev
environment: `.venv/bin/python installer/make_icons.py`. The results are committed, so building a
release (build.py) needs neither.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def render_png(svg: Path, size: int) -> bytes:
    from PySide6.QtCore import QBuffer, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(["make_icons", "-platform", "offscreen"])
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())


def main() -> int:
    from PIL import Image

    svg = RESOURCES / "halaman.svg"
    png = render_png(svg, 256)
    (RESOURCES / "halaman.png").write_bytes(png)
    Image.open(io.BytesIO(png)).save(RESOURCES / "halaman.ico", sizes=[(s, s) for s in (16, 24, 32, 48, 64, 128, 256)])
    print(f"wrote {RESOURCES / 'halaman.png'} and {RESOURCES / 'halaman.ico'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
