"""File › Export: the conversation the chat shows, as Markdown (`engine.history`), into a file the
user names. The open document's text is at hand; another one's is read again from its file (a
short wait, on a click the user made), so that every citation is checked and its sentence quoted."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from engine.documents import Document
from engine.documents.parsed_cache import load_reusing
from engine.errors import HalamanError
from engine.history import conversation_markdown


def export_name(path: str) -> str:
    """The export's suggested base name for the document at `path`: a file's name without its
    suffix, a folder's whole name ("requests-2.34.2", not "requests-2.34"), "conversation" when
    there is none."""
    source = Path(path)
    name = source.name if source.is_dir() or not source.suffix.strip(".").isalpha() else source.stem
    return name or "conversation"


def export_suggestion(path: str) -> Path:
    """Where the export of the conversation about the document at `path` is suggested: beside the
    document (a file's folder; a folder's parent, not inside what Halaman reads), named after it
    (`export_name`); the user's documents folder (else home) when that folder is gone. Not the
    folder of the last document opened: that was another document's."""
    source = Path(path)
    folder = source.parent
    if not folder.is_dir():
        documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
        folder = Path(documents) if documents and Path(documents).is_dir() else Path.home()
    return folder / f"{export_name(path)} (conversation).md"


def export_conversation(window, path: str | None = None) -> Path | None:
    """Write the conversation about the document `window` (a `MainWindow`) shows to `path` (None:
    ask where, in a file dialog). Returns where it was written, None when nothing was (no
    document shown, the dialog cancelled, the file could not be written: then the banner says why)."""
    record = window.state.current
    if record is None:
        window.statusBar().showMessage("Choose a document in the library first: its conversation is what is exported.", 8000)
        return None
    if path is None:
        suggested = export_suggestion(record.path)
        path, _ = QFileDialog.getSaveFileName(window, "Export the conversation", str(suggested),
                                              "Markdown (*.md);;All files (*)")
        if not path:
            return None
    document = window.state.document if window.state.is_open(record) else _read(record.path, window.settings)
    messages = window.library.messages(record.id)
    target = Path(path)
    try:
        target.write_text(conversation_markdown(record, messages, document), encoding="utf-8")
    except OSError as exc:
        window.banner.show_message("error", f"Could not export the conversation to {target}: {exc.strerror or exc}")
        return None
    questions = sum(1 for m in messages if m.role == "user")
    window.statusBar().showMessage(f"Exported {questions} question{'s' if questions != 1 else ''} and their answers "
                                   f"to {target}.", 10000)
    return target


def _read(path: str, settings) -> Document | None:
    """The document at `path` as Halaman reads it, None when it cannot be read now."""
    QGuiApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        return load_reusing(path, include_generated=settings.include_generated_files)
    except HalamanError:
        return None
    finally:
        QGuiApplication.restoreOverrideCursor()
