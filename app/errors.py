"""Last-resort error handling: unexpected exceptions and Qt warnings go to a log file and, for
exceptions, to a dialog — never to a bare traceback on the terminal or a crash.

Engine errors do not come here: the worker turns them into readable messages in the window
(`app.worker.describe_error`). This is for bugs: an exception in a slot on the GUI thread
(`sys.excepthook`), in another Python thread (`threading.excepthook`), or a Qt critical message
(`qInstallMessageHandler`).
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QtMsgType, Signal, qInstallMessageHandler
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from app.untrusted import literal_rich_text
from engine import paths

log = logging.getLogger("halaman")


def log_path() -> Path:
    folder = paths.data_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "halaman.log"


def setup_logging(level: int = logging.INFO) -> Path:
    """Log to a rotating file in the data dir (and keep stderr for warnings). Returns the file."""
    path = log_path()
    root = logging.getLogger()
    if not any(isinstance(h, logging.handlers.RotatingFileHandler) and Path(h.baseFilename) == path for h in root.handlers):
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=2 * 1024 * 1024, backupCount=3, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
        root.addHandler(handler)
    root.setLevel(min(root.level or level, level))
    return path


class ErrorReporter(QObject):
    """Shows unexpected errors in a dialog (on the GUI thread, whatever thread raised them)."""

    _show = Signal(str, str)

    def __init__(self, parent_widget: QWidget | None = None) -> None:
        super().__init__()
        self.parent_widget = parent_widget
        self.shown: list[str] = []          # messages shown so far (for tests)
        self.dialogs: list[QMessageBox] = []
        self.previous_qt_handler = None
        self._show.connect(self._show_dialog)

    def report(self, exc_type, exc, tb, where: str = "") -> None:
        details = "".join(traceback.format_exception(exc_type, exc, tb))
        log.error("unexpected error%s:\n%s", f" in {where}" if where else "", details)
        self._show.emit(f"{exc_type.__name__}: {exc}", details)

    def _show_dialog(self, message: str, details: str) -> None:
        self.shown.append(message)
        box = QMessageBox(self.parent_widget)
        box.setIcon(QMessageBox.Icon.Critical)
        box.setWindowTitle("Halaman — unexpected error")
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setText("Something went wrong that Halaman did not expect. Your documents and chat history are safe.")
        box.setInformativeText(literal_rich_text(f"{message}\n\nDetails were written to {log_path()}."))
        box.setDetailedText(details)
        box.open()  # non-blocking: the app keeps running
        self.dialogs = [d for d in self.dialogs if d.isVisible()] + [box]


_reporter: ErrorReporter | None = None


def install_error_hooks(parent_widget: QWidget | None = None) -> ErrorReporter:
    """Install sys.excepthook, threading.excepthook and a Qt message handler. Returns the reporter."""
    global _reporter
    setup_logging()
    _reporter = ErrorReporter(parent_widget)
    reporter = _reporter

    def excepthook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            QApplication.quit()
            return
        reporter.report(exc_type, exc, tb, "the window")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        reporter.report(args.exc_type, args.exc_value, args.exc_traceback, f"thread {args.thread.name if args.thread else '?'}")

    sys.excepthook = excepthook
    threading.excepthook = thread_hook
    reporter.previous_qt_handler = qInstallMessageHandler(_qt_message_handler)
    return reporter


_QT_LEVELS = {
    QtMsgType.QtDebugMsg: logging.DEBUG,
    QtMsgType.QtInfoMsg: logging.INFO,
    QtMsgType.QtWarningMsg: logging.WARNING,
    QtMsgType.QtCriticalMsg: logging.ERROR,
    QtMsgType.QtFatalMsg: logging.CRITICAL,
}


def _qt_message_handler(mode, context, message: str) -> None:
    logging.getLogger("halaman.qt").log(_QT_LEVELS.get(mode, logging.WARNING), "%s", message)
