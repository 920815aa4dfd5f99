"""The main window, wired from panels: the library sidebar (`app.library_panel`) and the memory
panel (`app.memory_panel`) on the left; the document header (`app.document_header`), the banner and
progress strips (`app.notices`) and the conversation (`app.conversation`, whose answers stream
through `app.answer_stream`) on the right. Panels emit
intents; this window turns them into named operations (`app.operations`) for the worker thread
(`app.worker`). Opening a document is `app.open_flow`, asking `app.ask_flow`, changing settings
`app.settings_flow`; they report into the window's `DocumentState` (`app.document_state`) and then
say what changed on the `changed` signal (a `Changes`, `app.changes`), from which each panel
refreshes itself (`app.panel_refresh`). Drops (PDF, folder, text file) work anywhere.

What a result implies (a settings change, an answer's library record, a lower budget) the engine
decides (`engine.workspace`). The library and the chat history (`engine.library`) are touched only on
the GUI thread (here, in `app.answer_stream` and `app.library_panel.library_rows`).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QDragEnterEvent, QDropEvent, QIcon
from PySide6.QtWidgets import QFileDialog, QMainWindow

from app import dialogs
from app import operations as ops
from app.ask_flow import AskFlow
from app.background_read import BackgroundRead
from app.changes import Changes
from app.document_state import DocumentState
from app.first_run import DEMO_STATUS, say_once_if_demo
from app.memory_panel import document_estimate
from app.open_flow import OpenFlow
from app.panel_refresh import connect_panels
from app.settings_flow import SettingsFlow
from app.source_flow import SourceFlow
from app.window_layout import build_menu, build_panels
from app.window_store import WindowStore
from app.worker import ConfirmRequest, EngineClient, Job, JobError
from engine.documents import OPEN_DIALOG_SUFFIXES
from engine.errors import ErrorKind, HalamanError
from engine.estimate import KNOWN_SHAPES
from engine.library import Library
from engine.models.profile import ModelProfile
from engine.settings import EngineSettings, load_settings
from engine.units import format_bytes
from engine.workspace import CacheStatus, ModelInfo

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
OPEN_FILTER = (f"Documents ({' '.join('*' + s for s in OPEN_DIALOG_SUFFIXES)});;PDF files (*.pdf);;All files (*)")


class MainWindow(QMainWindow):
    """The app window. `model_factory` lets tests hand over an already loaded model. Which document
    is shown, open, read or answered is `state` (`DocumentState`). Signal `changed(Changes)`: what
    an operation changed, emitted once it is done (the panels refresh themselves from it)."""

    changed = Signal(object)

    def __init__(self, settings: EngineSettings | None = None, *, model_factory=None, library: Library | None = None,
                 load_model: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("Halaman")
        icon = RESOURCES / "halaman.svg"
        if icon.exists():
            self.setWindowIcon(QIcon(str(icon)))
        self.setAcceptDrops(True)
        self.closed = False
        startup_problem = None
        settings_warnings: list[str] = []
        if settings is None:
            try:
                settings = load_settings(warn=settings_warnings.append)
            except HalamanError as exc:
                startup_problem = f"{exc} — using the default settings for now."
                settings = EngineSettings()
        self.library = library or Library()
        self.client = EngineClient(settings, model_factory, parent=self)
        self.cache_status: CacheStatus | None = None   # the prefix store's, from the worker
        self.confirm_box = None
        self.store = WindowStore()
        build_panels(self)
        self.state = DocumentState(self.answers)
        self.reader = OpenFlow(self)
        self.background_read = BackgroundRead(self)
        self.settings_flow = SettingsFlow(self)
        self.asker = AskFlow(self)
        self.sources = SourceFlow(self)
        build_menu(self)
        self._connect()
        self.changed.emit(Changes(library=True, settings=True, model=True))  # the panels' first drawing
        self.store.restore(self)
        if startup_problem:
            self.banner.show_message("error", startup_problem)
        elif settings_warnings:
            self.banner.show_message("warning", "; ".join(settings_warnings))
        if load_model:
            self.load_model()
        self.refresh_cache_status()

    def _connect(self) -> None:
        """Panel intents -> the window's actions; worker signals -> panels; changes -> panels."""
        connect_panels(self)
        library = self.library_panel
        library.selected.connect(self.select_document)
        library.open_requested.connect(self.open_document)
        library.remove_requested.connect(self.remove_document)
        library.open_file_requested.connect(self.choose_file)
        library.open_folder_requested.connect(self.choose_folder)
        self.header.open_clicked.connect(self.open_current)
        conversation = self.conversation
        conversation.ask_requested.connect(self.asker.ask)
        conversation.ask_cloud_requested.connect(self.asker.ask_cloud)
        conversation.citation_clicked.connect(self.show_citation)
        self.source_pane.closed.connect(lambda: setattr(self.store, "pane_width", self.source_pane.width()))
        conversation.open_file_requested.connect(self.choose_file)
        conversation.open_folder_requested.connect(self.choose_folder)
        self.progress.cancel_clicked.connect(self.cancel_work)
        self.client.memory.connect(self.on_memory)
        self.client.busy_changed.connect(lambda _busy: self.changed.emit(Changes(busy=True)))
        self.client.confirm.connect(self._on_confirm)
        self.client.model_loaded.connect(self._on_model_loaded)
        self.client.job_started.connect(lambda job: self.progress.job_started(job.title))

    # ================================================================= model
    def load_model(self) -> None:
        self.model_status.setText(f"Loading the model ({self._model_name()})…")
        self.progress.model_name = self._model_name()
        self.client.submit(ops.load_model(on_progress=self.reader.show_progress, on_done=self._on_model_loaded,
                                          on_error=self._model_failed))

    def _on_model_loaded(self, info: ModelInfo) -> None:
        threads = f", {info.threads} thread{'s' if info.threads != 1 else ''}" if info.threads else ""
        self.model_status.setText(
            f"Model: {info.label} on {info.device.upper()}{threads} · weights {format_bytes(info.weight_bytes)} "
            f"({info.weights_label}) · loaded in {info.load_seconds:.1f} s" + DEMO_STATUS * (self.settings.model == "default")
        )
        self.changed.emit(Changes(model=True))
        say_once_if_demo(self)

    def _model_failed(self, error: JobError) -> None:
        if self.closed:
            return
        self.model_status.setText("No model loaded")
        if error.kind is not ErrorKind.CANCELLED:
            self.banner.show_message("error", f"Could not load the model: {error.message}", "Settings…", self.show_settings)

    def _model_name(self) -> str:
        return "embedded SmolLM2-135M" if self.settings.model == "default" else Path(self.settings.model).name

    def profile(self) -> ModelProfile:
        return self.client.model.profile if self.client.model else KNOWN_SHAPES["smollm2-135m"]

    # ============================================================ choosing
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a document", self.store.last_folder, OPEN_FILTER)
        if path:
            self.open_path(path)

    def choose_folder(self, *, start: str | None = None) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a code folder", start or self.store.last_folder)
        if path:
            self.open_path(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if local_paths(event.mimeData()):
            event.acceptProposedAction()
            self.conversation.drop_area.set_highlight(True)
        else:
            event.ignore()

    def dragLeaveEvent(self, event) -> None:
        self.conversation.drop_area.set_highlight(False)

    def dropEvent(self, event: QDropEvent) -> None:
        self.conversation.drop_area.set_highlight(False)
        if self.handle_drop(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def handle_drop(self, mime: QMimeData) -> bool:
        """Open the first local file or folder in `mime` (what a drop carries). False if none."""
        found = local_paths(mime)
        if not found:
            return False
        self.open_path(found[0])
        if len(found) > 1:
            self.banner.show_message("info", f"Opened {Path(found[0]).name}; drop one document at a time "
                                             f"({len(found) - 1} more were left out).")
        return True

    # ================================================================= asking
    def _on_confirm(self, job: Job, request: ConfirmRequest) -> None:
        """The worker asks the user mid-job: send this to the cloud?, or read this long document?"""
        if request.kind is ops.Confirm.CLOUD:
            self.confirm_box = dialogs.confirm_cloud(self, request.payload, request.answer)
        else:
            self.reader.confirm_long_read(job, request)

    def cancel_work(self) -> None:
        """Cancel what the worker is doing; it stops within a second. While an answer streams, only
        the answer: a background read it paused goes on after it (Esc twice stops both)."""
        if not self.client.busy:
            return
        live = self.state.live
        self.client.cancel([live.job] if live is not None else None)
        self.progress.cancelling()

    # ================================================================ library
    def refresh_cache_status(self) -> None:
        """Ask the worker which prefix caches are on disk and still apply (the library's rows show it)."""
        def done(status: CacheStatus) -> None:
            self.cache_status = status
            self.changed.emit(Changes(library=True))

        token_counts = {record.tokens for record in self.library.documents() if record.tokens}
        self.client.submit(ops.prefix_cache_status(token_counts, on_done=done))

    def library_status(self, document_id: int) -> str:
        """The prefix-cache status of a library document (`Library.status`)."""
        record = self.library.document(document_id)
        return self.library.status(record, self.cache_status, self.settings) if record else ""

    def select_document(self, document_id: int) -> None:
        """Show a library document's chat (it is not read until opened)."""
        self.state.show(self.library.document(document_id))
        self.changed.emit(Changes(shown=True))

    def open_document(self, document_id: int) -> None:
        """Open a library document (double click, context menu, header button)."""
        self.select_document(document_id)
        self.open_current()

    def open_current(self) -> None:
        """Read the shown document, unless it is open or being read already."""
        record = self.state.current
        if record is not None and not self.state.is_open(record) and not self.state.being_read(record):
            if not Path(record.path).exists():
                self.banner.show_message("error", f"{record.path} is no longer there: it was moved or deleted.")
                return
            self.open_path(record.path)

    def open_path(self, path: str, password: str | None = None) -> None:
        """Read a document in the worker (`OpenFlow.open_path`)."""
        self.reader.open_path(path, password)

    def remove_document(self, document_id: int) -> None:
        """Forget a library document and its chat; stop its read and its answer."""
        live = self.state.live
        if live is not None and live.document_id == document_id:
            self.answers.detach()
        if document_id == self.state.open_id and self.client.busy:
            self.client.cancel()
        self.state.removed(document_id)
        self.library.remove_document(document_id)
        self.changed.emit(Changes(shown=True, library=True, history=True))

    def show_citation(self, label: str, message_id: int | None = None) -> None:
        """Show the cited page or file in the source pane, from the document answer `message_id`
        belongs to (`SourceFlow.show_citation`)."""
        self.sources.show_citation(label, message_id)

    def open_source_pane(self) -> None:
        """Show the source pane beside the chat (`SourceFlow.open_pane`)."""
        self.sources.open_pane()

    # =============================================================== settings
    @property
    def settings(self) -> EngineSettings:
        """The settings in use (the client's: it changes them, `EngineClient.apply_settings`)."""
        return self.client.settings

    def show_settings(self) -> None:
        """Open the Settings dialog (`SettingsFlow`)."""
        self.settings_flow.show_settings()

    def apply_settings(self, new: EngineSettings | None, *, retry_path: str | None = None) -> None:
        """Use `new` settings now (`SettingsFlow.apply_settings`)."""
        self.settings_flow.apply_settings(new, retry_path=retry_path)

    # ======================================================= progress, memory
    def on_memory(self, report) -> None:
        self.client.last_memory = report if report is not None else self.client.last_memory
        if report is not None:
            self.memory_panel.show_report(report)

    def refresh_gauge(self) -> None:
        report = self.client.sample_memory()
        if report is not None:
            self.memory_panel.show_report(report)

    def estimate_text(self, tokens: int) -> str:
        return document_estimate(self.settings, self.profile(), tokens, self.client.last_memory)

    # ================================================================ closing
    def closeEvent(self, event) -> None:
        """Cancel the work, stop the worker thread, keep every message (a streamed answer is saved
        as far as it got)."""
        if self.closed:
            event.accept()
            return
        self.closed = True
        self.gauge_timer.stop()
        self.progress.finish()
        self.store.save(self)
        self.answers.save_partial()
        # Cancels, stops the thread, then delivers what the worker sent before it stopped (the
        # cancelled answer's result), which the answer stream saves as usual.
        self.client.shutdown()
        self.answers.interrupt()
        self.library.close()
        super().closeEvent(event)

    def open_log_folder(self) -> None:
        from app.errors import log_path

        QDesktopServices.openUrl(QUrl.fromLocalFile(str(log_path().parent)))


def local_paths(mime: QMimeData) -> list[str]:
    """Local file and folder paths in drag-and-drop data."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]

