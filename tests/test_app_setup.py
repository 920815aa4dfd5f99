"""The system libraries PySide6's wheels need are installed (.ci/run and the README's set-up install
them on a bare Debian): every shared library Qt's GUI, widgets and the offscreen and X11 (xcb)
platform plugins link against resolves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PySide6 = pytest.importorskip("PySide6")
QT = Path(PySide6.__file__).resolve().parent / "Qt"
NEEDED = [
    "lib/libQt6Core.so.6", "lib/libQt6Gui.so.6", "lib/libQt6Widgets.so.6", "lib/libQt6DBus.so.6",
    "lib/libQt6XcbQpa.so.6", "plugins/platforms/libqoffscreen.so", "plugins/platforms/libqxcb.so",
]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd (Linux)")
@pytest.mark.parametrize("relative", NEEDED)
def test_qt_libraries_and_platform_plugins_resolve(relative):
    path = QT / relative
    assert path.exists(), f"{path} is not in this PySide6 wheel"
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    missing = [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]
    assert missing == [], f"{relative} needs {missing}: run .ci/run as root or apt-get install them (README)"


def test_qt_calls_do_not_leak_references_to_none_true_or_false():
    """PySide6 6.12.0 on Python 3.11 drops a reference to None on every void call (a paint event,
    QPainter.setBrush, QLabel.setText...); None's count reaches zero after minutes of painting and
    the interpreter aborts ("none_dealloc"). pyproject.toml pins a version without the bug."""
    import gc
    import os
    import sys

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QColor, QPainter
    from PySide6.QtWidgets import QApplication, QLabel, QWidget

    app = QApplication.instance() or QApplication([])

    class Painted(QWidget):
        def paintEvent(self, _event):
            painter = QPainter(self)
            painter.setBrush(QColor("red"))
            painter.drawRect(QRectF(1, 1, 5, 5))
            painter.end()

    widget, label = Painted(), QLabel("x")
    widget.show()
    label.show()
    app.processEvents()

    def counts():
        gc.collect()
        return sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)

    before = counts()
    for i in range(300):
        widget.repaint()
        label.setText(str(i))
        label.setVisible(True)
    after = counts()
    widget.close()
    label.close()
    assert all(a - b > -50 for a, b in zip(after, before, strict=True)), f"references to None/True/False lost: {before} -> {after}"
