"""The main window, wired from panels: the library sidebar (`app.library_panel`) and the memory
panel (`app.memory_panel`) on the left; the document header (`app.document_header`), the banner and
progress strips (`app.notices`) and the conversation (`app.conversation`, whose answers stream
through `app.answer_stream`) on the right. Panels emit
intents; this window turns them into named operations (`app.operations`) for the worker thread
(`app.worker`) and shows the results in the panels. Drops (PDF, folder, text file) work anywhere.

What a result implies (a settings change, an answer's library record, a lower budget) the engine
decides (`engine.workspace`). The library and the chat history (`app.library`) are touched only on
the GUI thread (here, in `app.answer_stream` and `app.library_panel.library_rows`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QMimeData, QSettings, Qt, QTimer, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QDragEnterEvent, QDropEvent, QIcon, QKeySequence
from PySide6.QtWidgets import QFileDialog, QLabel, QMainWindow, QSplitter, QVBoxLayout, QWidget

from app import dialogs
from app import operations as ops
from app.answer_stream import AnswerStream, LiveAnswer
from app.chat import normalise_label
from app.conversation import Conversation
from app.document_header import DocumentHeader, document_info
from app.library import DocumentRecord, Library, config_signature
from app.library_panel import LibraryPanel, library_rows
from app.memory_panel import MemoryPanel, document_estimate
from app.notices import Banner, ProgressPanel
from app.settings_dialog import SettingsDialog
from app.source_pane import SourcePane
from app.units import fmt_duration
from app.worker import ConfirmRequest, EngineClient, Job, JobError
from engine import paths
from engine.documents import OPEN_DIALOG_SUFFIXES, WrongPasswordError
from engine.errors import ErrorKind, HalamanError
from engine.estimate import KNOWN_SHAPES
from engine.models.profile import ModelProfile
from engine.session import Phase, Progress
from engine.settings import EngineSettings, load_settings, save_settings
from engine.units import format_bytes
from engine.workspace import AnswerOutcome, ModelInfo, OpenResult, SettingsChange, lowered_budget

log = logging.getLogger(__name__)

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
GAUGE_BUSY_MS = 250      # gauge refresh while work runs (at least twice a second)
GAUGE_IDLE_MS = 2000
OPEN_FILTER = (f"Documents ({' '.join('*' + s for s in OPEN_DIALOG_SUFFIXES)});;PDF files (*.pdf);;All files (*)")


class MainWindow(QMainWindow):
    """The app window. `model_factory` lets tests hand over an already loaded model.

    State (the GUI thread's view of the engine): `current` is the document shown in the chat,
    `open_document_id` the one open in the engine (ready for questions), `opening` the path being
    read, `live` the answer being streamed."""

    def __init__(self, settings: EngineSettings | None = None, *, model_factory=None, library: Library | None = None,
                 load_model: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("Halaman")
        icon = RESOURCES / "halaman.svg"
        if icon.exists():
            self.setWindowIcon(QIcon(str(icon)))
        self.setAcceptDrops(True)
        self._closed = False
        startup_problem = None
        if settings is None:
            try:
                settings = load_settings()
            except HalamanError as exc:
                startup_problem = f"{exc} — using the default settings for now."
                settings = EngineSettings()
        self.library = library or Library()
        self.client = EngineClient(settings, model_factory, parent=self)
        self.cached_keys: set[str] | None = None
        self.current: DocumentRecord | None = None
        self.open_document_id: int | None = None
        self.opening: str | None = None
        self.segments: dict[str, str] = {}              # citation label -> text of the open document
        self.document = None                            # the open engine.documents.Document (the source pane's)
        self.passages = []                              # the last local answer's attended passages
        self.last_report = None
        self._open_job: Job | None = None
        self._estimate_shown_for: int | None = None
        self.settings_dialog: SettingsDialog | None = None
        self.confirm_box = None
        self._long_read_box = None

        self._build()
        self._build_menu()
        self._connect()
        self.refresh_library()
        self._update_input()
        self.memory_panel.show_budget(self.settings, self._profile())
        self._restore_geometry()
        if startup_problem:
            self.banner.show_message("error", startup_problem)
        if load_model:
            self.load_model()
        self.refresh_cache_status()

    # ================================================================ layout
    def _build(self) -> None:
        self.library_panel = LibraryPanel()
        self.memory_panel = MemoryPanel()
        self.header = DocumentHeader()
        self.progress = ProgressPanel()
        self.banner = Banner()
        self.conversation = Conversation()
        self.chat = self.conversation.chat
        self.gauge = self.memory_panel.gauge
        self.answers = AnswerStream(self.library, self.chat, self.progress, parent=self,
                                    max_new_tokens=lambda: self.settings.max_new_tokens)

        sidebar = QWidget()
        sidebar.setObjectName("sidebar")
        sidebar.setMinimumWidth(280)
        side = QVBoxLayout(sidebar)
        side.setContentsMargins(10, 10, 10, 10)
        side.addWidget(self.library_panel, 1)
        side.addSpacing(6)
        side.addWidget(self.memory_panel)
        main = QWidget()
        main.setObjectName("mainColumn")
        column = QVBoxLayout(main)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        for widget, stretch in ((self.header, 0), (self.progress, 0), (self.banner, 0), (self.conversation, 1)):
            column.addWidget(widget, stretch)
        self.splitter = QSplitter()
        self.splitter.addWidget(sidebar)
        self.splitter.addWidget(main)
        self.source_pane = SourcePane()
        self.source_pane.hide()  # until a source or citation is clicked; its close button hides it
        self.splitter.addWidget(self.source_pane)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([330, 790])
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)
        self.model_status = QLabel("Loading the model…")
        self.statusBar().addWidget(self.model_status, 1)
        self.setStyleSheet(STYLE)
        self.resize(1100, 720)
        self.gauge_timer = QTimer(self)
        self.gauge_timer.setInterval(GAUGE_IDLE_MS)
        self.gauge_timer.timeout.connect(self._refresh_gauge)
        self.gauge_timer.start()

    def _build_menu(self) -> None:
        menu = self.menuBar().addMenu("&File")
        self.action_open = QAction("&Open…", self, shortcut=QKeySequence.StandardKey.Open, triggered=self.choose_file)
        self.action_open_folder = QAction("Open &Folder…", self, shortcut=QKeySequence("Ctrl+Shift+O"), triggered=lambda: self.choose_folder())
        self.action_settings = QAction("&Settings…", self, shortcut=QKeySequence("Ctrl+,"), triggered=self.show_settings)
        self.action_settings.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.action_cancel = QAction("&Cancel", self, shortcut=QKeySequence(Qt.Key.Key_Escape), triggered=self.cancel_work)
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit, triggered=self.close)
        for action in (self.action_open, self.action_open_folder, None, self.action_settings, self.action_cancel, None, quit_action):
            menu.addSeparator() if action is None else menu.addAction(action)
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(QAction("Open the &log folder", self, triggered=self.open_log_folder))
        help_menu.addAction(QAction("&About Halaman", self, triggered=lambda: dialogs.show_about(self)))

    def _connect(self) -> None:
        """Panel intents -> the window's actions; worker signals -> panels."""
        library = self.library_panel
        library.selected.connect(self.select_document)
        library.open_requested.connect(self.open_document)
        library.remove_requested.connect(self.remove_document)
        library.open_file_requested.connect(self.choose_file)
        library.open_folder_requested.connect(self.choose_folder)
        self.header.open_clicked.connect(self._open_current)
        conversation = self.conversation
        conversation.ask_requested.connect(self.ask)
        conversation.ask_cloud_requested.connect(self.ask_cloud)
        conversation.citation_clicked.connect(self.show_citation)
        conversation.open_file_requested.connect(self.choose_file)
        conversation.open_folder_requested.connect(self.choose_folder)
        self.progress.cancel_clicked.connect(self.cancel_work)
        self.answers.ended.connect(self._answer_ended)
        self.client.memory.connect(self._on_memory)
        self.client.busy_changed.connect(self._on_busy)
        self.client.confirm.connect(self._on_confirm)
        self.client.model_loaded.connect(self._on_model_loaded)
        self.client.job_started.connect(lambda job: self.progress.job_started(job.title))

    @property
    def settings(self) -> EngineSettings:
        """The settings in use (the client's: it changes them, `apply_settings`)."""
        return self.client.settings

    # ================================================================= model
    def load_model(self) -> None:
        self.model_status.setText(f"Loading the model ({self._model_name()})…")
        self.progress.model_name = self._model_name()
        self.client.submit(ops.load_model(on_progress=self._on_progress, on_done=self._on_model_loaded,
                                          on_error=self._model_failed))

    def _on_model_loaded(self, info: ModelInfo) -> None:
        threads = f", {info.threads} thread{'s' if info.threads != 1 else ''}" if info.threads else ""
        self.model_status.setText(
            f"Model: {info.label} on {info.device.upper()}{threads} · weights {format_bytes(info.weight_bytes)} "
            f"({info.weights_label}) · loaded in {info.load_seconds:.1f} s"
        )
        self.memory_panel.show_budget(self.settings, self._profile())

    def _model_failed(self, error: JobError) -> None:
        if self._closed:
            return
        self.model_status.setText("No model loaded")
        if error.kind is not ErrorKind.CANCELLED:
            self.banner.show_message("error", f"Could not load the model: {error.message}", "Settings…", self.show_settings)

    def _model_name(self) -> str:
        return "embedded SmolLM2-135M" if self.settings.model == "default" else Path(self.settings.model).name

    def _profile(self) -> ModelProfile:
        return self.client.model.profile if self.client.model else KNOWN_SHAPES["smollm2-135m"]

    # ============================================================ choosing
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a document", self._last_folder(), OPEN_FILTER)
        if path:
            self.open_path(path)

    def choose_folder(self, *, start: str | None = None) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a code folder", start or self._last_folder())
        if path:
            self.open_path(path)

    def _last_folder(self) -> str:
        """Where the file dialogs start: the folder of the last document opened (kept across runs)."""
        folder = self._window_store().value("last_folder")
        return folder if folder and Path(folder).is_dir() else str(Path.home())

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

    # ============================================================= opening
    def open_path(self, path: str, password: str | None = None) -> None:
        """Read a document in the worker (prefill, or restore its prefix cache)."""
        path = str(Path(path).expanduser().resolve())
        name = Path(path).name
        self.client.cancel(self._document_jobs())  # a new document replaces what was being read or answered
        self.banner.hide()
        self.opening = path
        self.open_document_id = None
        self.segments, self.document, self.passages = {}, None, []
        self._estimate_shown_for = None
        self._window_store().setValue("last_folder", str(Path(path).parent))
        self._close_long_read_box()
        record = self.library.find(path)
        self.current = record
        self.library_panel.select(record.id if record else None)
        self.library_panel.set_reading(path, name, "reading…")
        if self.live is not None and (record is None or record.id != self.live.document_id):
            self.answers.detach()  # the answer is cancelled with the open; it is saved, not drawn here
        if record is not None:
            self._show_current()
        else:
            self.header.show_document(name, "Reading…", can_open=False)
            self.chat.clear()
            self.conversation.show_chat()
        self.setWindowTitle(f"Halaman — {name}")
        job = ops.open_document(path, name=name, password=password)
        job.on_progress = lambda event: self._on_open_progress(job, event)
        job.on_done = lambda result: self._opened(job, result)
        job.on_error = lambda error: self._open_failed(job, path, password, error)
        self._open_job = job
        self._update_input()
        self.client.submit(job)

    def _opened(self, job: Job, result: OpenResult) -> None:
        if job is not self._open_job or self._closed:
            return  # superseded by a newer open
        self._open_job = None
        self._close_long_read_box()
        report, document = result.report, result.document
        files = len(document.segments) if document.kind == "repo" else None
        doc_id = self.library.upsert_document(
            path=result.path, title=report.title, kind=report.kind, pages=report.pages, files=files,
            tokens=report.document_tokens, prefix_key=result.prefix_key, config_sig=config_signature(self.settings),
        )
        if self.cached_keys is not None and result.prefix_key:
            self.cached_keys.add(result.prefix_key)  # confirmed by refresh_cache_status below
        self.opening = None
        self.library_panel.set_reading(None)
        self.open_document_id = doc_id
        self.last_report = report
        self.segments = {s.label: s.text for s in document.segments}
        self.document, self.passages = document, []
        self.chat.labels = set(self.segments)
        self.refresh_library(select=doc_id)
        if report.prefix_hit:
            self.statusBar().showMessage(f"Prefix cache hit: {report.title} was ready in {report.seconds:.1f} s, no prefill needed.", 10000)
        else:
            self.statusBar().showMessage(
                f"Read {report.title}: prefilled {report.document_tokens:,} tokens in {fmt_duration(report.prefill_seconds)} "
                f"({report.prefill_tokens_per_s:,.0f} tokens/s).", 10000)
        if report.warnings:
            self.banner.show_message("warning", warning_note(report.warnings, str(report.recall_notice) if report.recall_notice else None))
        self._on_memory(result.memory)
        self._update_input()
        self.conversation.question.setFocus()
        self.refresh_cache_status()

    def _open_failed(self, job: Job, path: str, password: str | None, error: JobError) -> None:
        if job is not self._open_job or self._closed:
            return  # superseded by a newer open (which cancelled this one)
        self._open_job = None
        self._close_long_read_box()
        self.opening = None
        self.library_panel.set_reading(None)
        self.refresh_library()  # a library document's row shows its own details again
        self._update_input()
        name = Path(path).name
        if self.current is None:
            self.setWindowTitle("Halaman")
        if error.kind is ErrorKind.CANCELLED:
            self.header.set_info("Opening was cancelled." if self.current else "Reading was cancelled: nothing was kept.")
            self.statusBar().showMessage(f"Cancelled reading {name}.", 8000)
            return
        if error.kind is ErrorKind.PASSWORD:
            wrong = isinstance(error.exception, WrongPasswordError) or password is not None
            typed = self.ask_password(name, wrong)
            if typed is not None:
                self.open_path(path, password=typed)
            else:
                self.banner.show_message("error", f"{name} needs a password to open.", "Enter password…",
                                         lambda: self._retry_password(path))
            return
        self.header.set_info("Could not open this document.")
        if error.kind is ErrorKind.OOM:
            self.banner.show_message("error", error.message, "Lower the budget and retry", lambda: self.lower_budget_and_retry(path))
            return
        self.banner.show_message("error", f"Could not open {name}: {error.message}")

    def _retry_password(self, path: str) -> None:
        typed = self.ask_password(Path(path).name, False)
        if typed is not None:
            self.open_path(path, password=typed)

    def ask_password(self, name: str, wrong: bool) -> str | None:
        """Ask for a PDF password (modal). None if the user cancels."""
        return dialogs.ask_password(self, name, wrong)

    def lower_budget_and_retry(self, path: str | None = None) -> None:
        """After running out of memory: lower the KV budget (`engine.workspace.lowered_budget`), save, retry."""
        new = lowered_budget(self.settings)
        try:
            save_settings(new)
        except (HalamanError, OSError) as exc:
            self.banner.show_message("error", f"Could not save the lower budget: {exc}")
            return
        self.statusBar().showMessage(f"KV budget lowered to {new.cache.budget_tokens:,} tokens.", 8000)
        self.apply_settings(new, retry_path=path)

    # ================================================================= asking
    def ask(self, question: str | None = None, follow_up: bool | None = None) -> None:
        """Ask the local model (the question box's text when `question` is None)."""
        if question is None:
            question = self.conversation.question.text().strip()
        if follow_up is None:
            follow_up = self.conversation.follow_up.isChecked()
        self._ask(question, cloud=False, follow_up=follow_up)

    def ask_cloud(self, question: str | None = None) -> None:
        """Ask the cloud endpoint: the typed question, or the last one asked."""
        question = (question if question is not None else self.conversation.question.text().strip()) or self._last_question()
        self._ask(question, cloud=True, reason="user asked")

    @property
    def live(self) -> LiveAnswer | None:
        """The answer being streamed, if any."""
        return self.answers.live

    def _ask(self, question: str, *, cloud: bool, follow_up: bool = False, reason: str = "user asked",
             escalation: bool = False) -> None:
        """Ask locally or in the cloud; `escalation`: the cloud answers the question just answered
        locally (the question is not repeated in the chat)."""
        if not question or self.open_document_id is None or self.live is not None or self.opening:
            return
        doc_id = self.open_document_id
        if not escalation:
            self.conversation.take_question()
            self.library.add_message(doc_id, "user", question)
            self.chat.add_question(question)
        model_name = self.settings.cloud.model if cloud else (self.client.model.label if self.client.model else None)
        message_id = self.library.add_message(
            doc_id, "assistant", "", state="streaming", source="cloud" if cloud else "local",
            endpoint=self.settings.cloud.base_url if cloud else None, model=model_name, reason=reason if cloud else None,
        )
        job = ops.ask_cloud(question, reason=reason) if cloud else ops.ask_local(question, follow_up=follow_up)
        self.answers.start(job, document_id=doc_id, message_id=message_id, question=question,
                           source="cloud" if cloud else "local")
        self._update_input()
        self.client.submit(job)

    def _answer_ended(self, live: LiveAnswer, outcome: AnswerOutcome | None, error: JobError | None) -> None:
        """What follows an answer: the escalation to the cloud the workspace decided
        (`AnswerOutcome.escalation`), or a banner."""
        self._update_input()
        if self._closed:
            return
        if outcome is not None and outcome.answer.cloud is None:
            self.passages = outcome.answer.passages
        if outcome is not None and outcome.escalation:
            self._ask(live.question, cloud=True, reason=outcome.escalation, escalation=True)
        elif error is None:
            return
        elif error.kind is ErrorKind.OOM:
            self.banner.show_message("error", error.message, "Lower the budget and retry",
                                     lambda: self.lower_budget_and_retry(self._open_path()))
        elif error.kind is not ErrorKind.CANCELLED:
            self.banner.show_message("error", f"Could not answer: {error.message}")

    def _last_question(self) -> str:
        if self.current is None:
            return ""
        for message in reversed(self.library.messages(self.current.id)):
            if message.role == "user":
                return message.text
        return ""

    def _on_confirm(self, job: Job, request: ConfirmRequest) -> None:
        """The worker asks the user mid-job: send this to the cloud?, or read this long document?"""
        if request.kind is ops.Confirm.CLOUD:
            self.confirm_box = dialogs.confirm_cloud(self, request.payload, request.answer)
            return
        if job is not self._open_job or job.cancel.is_set() or self.opening is None:
            request.answer(False)  # a read that was replaced or cancelled meanwhile: do not ask
            return
        path = self.opening

        def answer(choice: str) -> None:
            request.answer(choice == dialogs.READ)
            if choice == dialogs.SUBFOLDER:
                QTimer.singleShot(0, lambda: self.choose_folder(start=path))

        self.confirm_box = self._long_read_box = dialogs.confirm_long_read(
            self, Path(path).name, request.payload.describe(), folder=Path(path).is_dir(), answer=answer)

    def _close_long_read_box(self) -> None:
        """A long-read question whose read ended or was replaced is no longer asked."""
        box, self._long_read_box = self._long_read_box, None
        if box is not None and box.isVisible():
            box.done(0)

    def cancel_work(self) -> None:
        """Cancel whatever the worker is doing (prefill, answer); it stops within a second."""
        if self.client.busy:
            self.client.cancel()
            self.progress.cancelling()

    # ================================================================ library
    def refresh_library(self, select: int | None = None) -> None:
        keep = select if select is not None else (self.current.id if self.current else None)
        rows = library_rows(self.library, self.cached_keys, self.settings, self.open_document_id)
        self.library_panel.show_documents(rows, keep)
        if keep is not None:
            self.current = self.library.document(keep)
            self._show_current()

    def refresh_cache_status(self) -> None:
        """Ask the worker which prefix caches are on disk, then redraw the library."""
        def done(keys: set[str]) -> None:
            self.cached_keys = keys
            self.refresh_library()

        self.client.submit(ops.cached_prefix_keys(on_done=done))

    def library_status(self, document_id: int) -> str:
        record = self.library.document(document_id)
        return self.library.status(record, self.cached_keys, self.settings) if record else ""

    def select_document(self, document_id: int) -> None:
        """Show a library document's chat (it is not read until opened)."""
        self.current = self.library.document(document_id)
        self._show_current()

    def open_document(self, document_id: int) -> None:
        """Open a library document (double click, context menu, header button)."""
        self.select_document(document_id)
        self._open_current()

    def _show_current(self) -> None:
        record = self.current
        if record is None:
            self.conversation.show_empty()
            self.header.show_nothing()
            self._update_input()
            return
        self.conversation.show_chat()
        is_open = record.id == self.open_document_id
        if not self.chat.streaming:
            self.chat.labels = set(self.segments) if is_open else None
            self.chat.show_messages(self.library.messages(record.id))
        being_read = self.opening == record.path
        status = None if is_open or being_read else self.library.status(record, self.cached_keys, self.settings)
        info = document_info(record, self.last_report if is_open else None,
                             estimate=self._estimate_text(record.tokens) if record.tokens else "", not_open_status=status)
        self.header.show_document(record.title, info, can_open=not is_open and not being_read)
        self._update_input()

    def _open_current(self) -> None:
        if self.current is not None and self.current.id != self.open_document_id and self.opening != self.current.path:
            if not Path(self.current.path).exists():
                self.banner.show_message("error", f"{self.current.path} is no longer there: it was moved or deleted.")
                return
            self.open_path(self.current.path)

    def _document_jobs(self) -> list[Job | None]:
        """The jobs that belong to the document: its read and the answer being streamed."""
        return [self._open_job, self.live.job if self.live else None]

    def _open_path(self) -> str | None:
        record = self.library.document(self.open_document_id) if self.open_document_id else None
        return record.path if record else self.opening

    def remove_document(self, document_id: int) -> None:
        if self.live is not None and self.live.document_id == document_id:
            self.answers.detach()
        if document_id == self.open_document_id:
            if self.client.busy:
                self.client.cancel()
            self.open_document_id = None
        self.library.remove_document(document_id)
        if self.current and self.current.id == document_id:
            self.current = None
        self.refresh_library()
        self._show_current()

    def show_citation(self, label: str) -> None:
        """Show the cited page or file of the open document in the source pane, the last local
        answer's attended passages in it highlighted."""
        labels = [s.label for s in self.document.segments] if self.document else []
        found = label if label in labels else normalise_label(label)
        if found not in labels:
            self.statusBar().showMessage(f"“{label}” is not a page or file of the open document.", 6000)
            return
        if self.source_pane.isHidden():  # opened beside the chat, half of the chat's width
            self.source_pane.show()
            side, chat, pane = self.splitter.sizes()
            self.splitter.setSizes([side, (chat + pane) // 2, (chat + pane) - (chat + pane) // 2])
        self.source_pane.show_segment(self.document, labels.index(found), self.passages)

    # =============================================================== settings
    def show_settings(self) -> None:
        profile = self.client.model.profile if self.client.model else None
        tokens = self.last_report.document_tokens if self.last_report and self.open_document_id else None
        dialog = SettingsDialog(self.settings, profile=profile, parent=self, document_tokens=tokens)
        dialog.clear_cache_requested.connect(lambda: self.clear_prefix_cache(dialog))
        self.client.submit(ops.prefix_cache_usage(
            on_done=lambda usage: self.settings_dialog is dialog and dialog.set_cache_usage(*usage)))
        dialog.accepted.connect(lambda: self.apply_settings(dialog.saved))
        self.settings_dialog = dialog
        dialog.open()

    def clear_prefix_cache(self, dialog: SettingsDialog | None = None) -> None:
        def done(removed: int) -> None:
            self.cached_keys = set()
            self.refresh_library()
            if dialog is not None:
                dialog.set_cache_usage(0, 0)
            self.statusBar().showMessage(f"Removed {removed} saved prefix cache{'s' if removed != 1 else ''}.", 8000)

        self.client.submit(ops.clear_prefix_cache(
            on_done=done, on_error=lambda error: self.banner.show_message("error", f"Could not clear the prefix cache: {error.message}")))

    def apply_settings(self, new: EngineSettings | None, *, retry_path: str | None = None) -> None:
        """Use `new` settings now, without a restart, and do what the change implies
        (`SettingsChange`, decided once by the client, which applies it in the worker): reload the
        model, re-open the current document (prefix caches are keyed by the policy, so only those
        of the old policy miss), or nothing. `retry_path`: open this document afterwards anyway."""
        if new is None:
            return
        document = self._open_path()
        before = (self.opening, self.open_document_id)

        def failed(error: JobError) -> None:
            # Nothing will reopen the document: the ask bar must not wait for it forever.
            if (self.opening, self.open_document_id) == (retry_path or document, None) and self._open_job is None:
                self.opening, self.open_document_id = before
                self._update_input()
            self.banner.show_message("error", f"Could not apply the settings: {error.message}")

        def done(change: SettingsChange) -> None:
            if self._closed:
                return
            if change is SettingsChange.RELOAD_MODEL:
                self.model_status.setText("Model changed: loading it…")
                self.load_model()
            reopen = retry_path or (document if change.reopens_document else None)
            if reopen:
                self.open_path(reopen)
            self.refresh_cache_status()
            self._update_input()
            self.memory_panel.show_budget(self.settings, self._profile())

        change = self.client.apply_settings(new, on_done=done, on_error=failed)
        # Work under the old settings stops, and no question is taken until the document is open
        # again under the new ones.
        if change.reopens_document:
            self.client.cancel(self._document_jobs())
        if retry_path or (change.reopens_document and document):
            self.opening = retry_path or document
            self.open_document_id = None
        self._update_input()

    # ======================================================= progress, memory
    def _on_open_progress(self, job: Job, event: Progress) -> None:
        if job is self._open_job:  # a replaced read's last events belong to nobody
            self._on_progress(event)

    def _on_progress(self, event: Progress) -> None:
        self.progress.show_event(event)
        if self.opening is None or event.phase is Phase.LOADING_MODEL:
            return
        self.library_panel.set_reading(self.opening, Path(self.opening).name, reading_text(event))
        if event.phase is Phase.PREFILL and self._estimate_shown_for != event.total:
            self._estimate_shown_for = event.total
            self.header.set_info(f"{event.total:,} tokens · {self._estimate_text(event.total)}")

    def _on_busy(self, busy: bool) -> None:
        self.gauge_timer.setInterval(GAUGE_BUSY_MS if busy else GAUGE_IDLE_MS)
        self._refresh_gauge()
        if not busy:
            self.progress.finish()
        self._update_input()

    def _on_memory(self, report) -> None:
        self.client.last_memory = report if report is not None else self.client.last_memory
        if report is not None:
            self.memory_panel.show_report(report)

    def _refresh_gauge(self) -> None:
        report = self.client.sample_memory()
        if report is not None:
            self.memory_panel.show_report(report)

    def _estimate_text(self, tokens: int) -> str:
        return document_estimate(self.settings, self._profile(), tokens, self.client.last_memory)

    def _update_input(self) -> None:
        ready = (self.open_document_id is not None and self.current is not None and self.current.id == self.open_document_id
                 and self.opening is None and self.live is None)
        if self.opening is not None:
            hint = "Reading the document — you can ask as soon as it is ready (Esc to cancel)"
        elif self.live is not None:
            hint = "Answering… (Esc to stop)"
        elif self.current is not None and self.current.id != self.open_document_id:
            hint = "Open this document to ask about it"
        elif ready:
            hint = f"Ask about {self.current.title}…"
        else:
            hint = "Open or drop a document to ask about it"
        self.conversation.set_ready(ready, hint, cloud=self.settings.cloud.enabled)
        self.action_cancel.setEnabled(self.client.busy)

    # ================================================================ closing
    def closeEvent(self, event) -> None:
        """Cancel the work, stop the worker thread, keep every message (a streamed answer is saved
        as far as it got)."""
        if self._closed:
            event.accept()
            return
        self._closed = True
        self.gauge_timer.stop()
        self.progress.finish()
        self._save_geometry()
        self.answers.save_partial()
        # Cancels, stops the thread, then delivers what the worker sent before it stopped (the
        # cancelled answer's result), which the answer stream saves as usual.
        self.client.shutdown()
        self.answers.interrupt()
        self.library.close()
        super().closeEvent(event)

    def _window_store(self) -> QSettings:
        """Window state kept across runs (geometry, splitter, last folder): window.ini in the config folder."""
        return QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)

    def _save_geometry(self) -> None:
        store = self._window_store()
        store.setValue("geometry", self.saveGeometry())
        store.setValue("splitter", self.splitter.saveState())

    def _restore_geometry(self) -> None:
        store = self._window_store()
        if store.value("geometry") is not None:
            self.restoreGeometry(store.value("geometry"))
        if store.value("splitter") is not None:
            self.splitter.restoreState(store.value("splitter"))

    def open_log_folder(self) -> None:
        from app.errors import log_path

        QDesktopServices.openUrl(QUrl.fromLocalFile(str(log_path().parent)))


def reading_text(event: Progress) -> str:
    """The library row of the document being read: "reading 40 % · ETA 3 min 10 s"."""
    if event.phase is Phase.PREFILL and event.total:
        eta = f" · ETA {fmt_duration(event.eta_s)}" if event.eta_s is not None and event.done < event.total else ""
        return f"reading {100 * event.done // event.total} %{eta}"
    if event.phase is Phase.READING and event.total > 1:
        return f"reading {event.unit} {event.done:,} / {event.total:,}"
    if event.phase is Phase.LOADING_CACHE:
        return "restoring its prefix cache"
    return "reading…"


def warning_note(warnings: list[str], first: str | None = None, shown: int = 3) -> str:
    """The banner's 'Note: a; b; c (and 2 more)' for an opened document's warnings. `first` (the
    report's `recall_notice`, why recall is off or slower) comes first, so that it is never among
    the ones left out: without it, answers would quietly lose what recall brings back."""
    ordered = sorted(warnings, key=lambda w: w != first)
    more = f" (and {len(ordered) - shown} more)" if len(ordered) > shown else ""
    return "Note: " + "; ".join(ordered[:shown]) + more


def local_paths(mime: QMimeData) -> list[str]:
    """Local file and folder paths in drag-and-drop data."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


STYLE = """
#sidebar { background: #F6F5F9; }
#sectionTitle { font-weight: 600; font-size: 13px; color: #333; }
#library { border: 1px solid #E0DDE8; border-radius: 6px; background: white; }
#library::item { padding: 4px 6px; border-bottom: 1px solid #F0EEF4; color: #222; }
#library::item:selected { background: #E6DDF5; color: #111; }
#gaugeTitle { font-weight: 600; color: #333; }
#gaugeLegend, #estimate { color: #444; font-size: 11px; }
#docHeader { border-bottom: 1px solid #E6E3EC; }
#docTitle { font-size: 16px; font-weight: 600; }
#docInfo { color: #555; }
#progressPanel { background: #F3F0FA; border-bottom: 1px solid #E0D8F0; }
#progressPanel QProgressBar { border: none; background: #E2DAF2; border-radius: 5px; }
#progressPanel QProgressBar::chunk { background: #8E5CC7; border-radius: 5px; }
#banner { border-bottom: 1px solid #DDD; }
#banner[kind="error"] { background: #FDECEA; color: #8A1C1C; }
#banner[kind="warning"] { background: #FFF6E0; color: #6B4E00; }
#banner[kind="info"] { background: #E8F1FB; color: #1D4E80; }
#dropArea { border: 2px dashed #C9C0DA; border-radius: 12px; margin: 24px; background: #FBFAFD; }
#dropArea[dragging="true"] { border-color: #8E5CC7; background: #F3EDFB; }
#dropTitle { font-size: 18px; font-weight: 600; color: #444; }
#dropHint { color: #666; }
QTextBrowser { border: none; background: white; }
#question { padding: 6px 8px; border: 1px solid #CFC8DC; border-radius: 6px; }
"""
