"""Start the desktop app: `halaman` with no arguments calls `run()` (see app/entry.py)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.errors import install_error_hooks, setup_logging
from app.window import RESOURCES, MainWindow

log = logging.getLogger(__name__)


def has_display() -> bool:
    """Whether Qt can open a window here (on Linux without X11 or Wayland it would abort)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def create_app(argv: list[str] | None = None) -> QApplication:
    """The QApplication (reused if one exists), named so the OS groups its windows."""
    app = QApplication.instance()
    if app is None:
        QApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName("Halaman")
    app.setOrganizationName("Halaman")
    app.setDesktopFileName("halaman")
    icon = RESOURCES / "halaman.svg"
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    return app


def run(paths: list[str] | None = None) -> int:
    """Open the main window (and, if given, a document), run the event loop, return the exit code."""
    if not has_display():
        print("halaman: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are not set); "
              "run it in a desktop session, or ask from the terminal: halaman ask PATH QUESTION", file=sys.stderr)
        return 1
    log_file = setup_logging()
    app = create_app()
    window = MainWindow()
    install_error_hooks(window)
    window.show()
    document = next((path for path in paths or [] if Path(path).exists()), None)
    if document is not None:  # `halaman PATH`, e.g. from "Open with Halaman" in a file manager
        window.open_path(document)
    log.info("window open%s; log file %s", f" on {document}" if document else "", log_file)
    code = app.exec()
    if window.client.thread.isRunning():
        # A model load cannot be interrupted; the history is already saved, so do not wait for it.
        logging.shutdown()
        os._exit(code)
    return code
