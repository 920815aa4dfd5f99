"""The main window: library sidebar + memory gauge on the left; document header, progress, chat and
question box on the right; drag-and-drop (PDF, folder, text file) anywhere.

The window never calls the engine's workspace: every call is a `Job` submitted to the worker thread
(`app.worker`), whose callbacks come back here on the GUI thread. What a result implies (a settings
change, an answer's library record, a lower budget) the engine decides (`engine.workspace`). The
library and the chat history (`app.library`) are touched only here, on the GUI thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QMimeData, QSettings, Qt, QTimer, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QDragEnterEvent, QDropEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox, QFileDialog, QFrame, QHBoxLayout, QInputDialog, QLabel, QLineEdit, QListWidget, QListWidgetItem,
    QMainWindow, QMenu, QMessageBox, QProgressBar, QPushButton, QSplitter, QStackedWidget, QVBoxLayout, QWidget,
)

from app.chat import ChatView, normalise_label
from app.gauge import MemoryGauge
from app.library import CACHED, STALE, DocumentRecord, Library, config_signature
from app.settings_dialog import SettingsDialog
from app.units import fmt_duration
from app.worker import ConfirmRequest, EngineClient, Job, JobError
from engine import paths
from engine.answer import Answer
from engine.cloud import CloudPlan, escalation_reason
from engine.documents import WrongPasswordError
from engine.errors import HalamanError
from engine.estimate import KNOWN_SHAPES, estimate
from engine.session import Progress
from engine.settings import EngineSettings, load_settings, save_settings
from engine.units import format_bytes, size_ratio
from engine.workspace import ModelInfo, OpenResult, SettingsChange, answer_record, lowered_budget

log = logging.getLogger(__name__)

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
GAUGE_BUSY_MS = 250      # gauge refresh while work runs (at least twice a second)
GAUGE_IDLE_MS = 2000
SAVE_PARTIAL_EVERY_S = 2.0
STATUS_TEXT = {CACHED: "cached", STALE: "stale", "not cached": "not cached"}


@dataclass
class LiveAnswer:
    """The answer being streamed: where it goes in the history."""

    job: Job
    document_id: int
    message_id: int
    question: str
    source: str
    text: str = ""
    pieces: int = 0
    saved_at: float = 0.0


class DropArea(QFrame):
    """The empty state: a big target for dropping documents, and buttons for the file dialogs."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.setObjectName("dropArea")
        self.setAcceptDrops(False)  # the window handles drops everywhere
        title = QLabel("Drop a PDF, a code folder or a text file here")
        title.setObjectName("dropTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint = QLabel("Halaman reads the whole document once, keeps a compressed KV cache of it,\n"
                      "and answers questions with a small model on this computer.")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint.setObjectName("dropHint")
        open_file = QPushButton("Open file…")
        open_file.clicked.connect(window.choose_file)
        open_folder = QPushButton("Open folder…")
        open_folder.clicked.connect(window.choose_folder)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(open_file)
        buttons.addWidget(open_folder)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addStretch(1)
        layout.addWidget(title)
        layout.addWidget(hint)
        layout.addSpacing(12)
        layout.addLayout(buttons)
        layout.addStretch(1)

    def set_highlight(self, on: bool) -> None:
        self.setProperty("dragging", on)
        self.style().unpolish(self)
        self.style().polish(self)


class Banner(QFrame):
    """A one-line message above the chat: errors (red), warnings (amber), info (blue), with an
    optional action button."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action = QPushButton()
        self.action.hide()
        close = QPushButton("Dismiss")
        close.setFlat(True)
        close.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        layout.addWidget(close)
        self.kind = ""
        self._callback = None
        self.action.clicked.connect(self._act)
        self.hide()

    def show_message(self, kind: str, text: str, action: str | None = None, callback=None) -> None:
        self.kind = kind
        self.setProperty("kind", kind)
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        self._callback = callback
        self.action.setVisible(bool(action))
        if action:
            self.action.setText(action)
        self.show()

    @property
    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""

    def _act(self) -> None:
        self.hide()
        if self._callback:
            self._callback()


class ProgressPanel(QFrame):
    """Progress of the running job: bar, what it is doing (tokens done / total, tokens/s, ETA), Cancel."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.setObjectName("progressPanel")
        self.label = QLabel()
        self.label.setObjectName("progressLabel")
        self.bar = QProgressBar()
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(10)
        self.cancel = QPushButton("Cancel")
        self.cancel.setToolTip("Stop reading or answering (Esc)")
        self.cancel.clicked.connect(window.cancel_work)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.cancel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        layout.addLayout(top)
        layout.addWidget(self.bar)
        self.hide()

    def set_busy(self, text: str) -> None:
        self.label.setText(text)
        self.bar.setRange(0, 0)
        self.show()

    def set_progress(self, text: str, done: int, total: int) -> None:
        self.label.setText(text)
        self.bar.setRange(0, max(total, 1))
        self.bar.setValue(min(done, total))
        self.show()


class MainWindow(QMainWindow):
    """The app window. `model_factory` lets tests hand over an already loaded model."""

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
        self.settings = settings
        self.library = library or Library()
        self.client = EngineClient(settings, model_factory, parent=self)
        self.cached_keys: set[str] | None = None
        self.current: DocumentRecord | None = None      # shown in the chat
        self.open_document_id: int | None = None        # open in the engine, ready for questions
        self.opening: str | None = None                 # path being opened
        self.segments: dict[str, str] = {}              # citation label -> text of the open document
        self.live: LiveAnswer | None = None
        self.last_report = None
        self._open_job: Job | None = None
        self._loading_since: float | None = None
        self._last_prefill: tuple[Progress, float] | None = None
        self._estimate_shown_for: int | None = None
        self.settings_dialog: SettingsDialog | None = None
        self.confirm_box: QMessageBox | None = None
        self.citation_box: QMessageBox | None = None

        self._build_ui()
        self._build_menu()
        self._connect()
        self.refresh_library()
        self._update_input()
        self._update_estimate()
        self._restore_geometry()
        if startup_problem:
            self.banner.show_message("error", startup_problem)
        if load_model:
            self.load_model()
        self.refresh_cache_status()

    # =================================================================== UI
    def _build_ui(self) -> None:
        # Sidebar: library, memory gauge, estimate.
        self.library_list = QListWidget()
        self.library_list.setObjectName("library")
        self.library_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.library_list.setUniformItemSizes(False)
        self.library_list.setSpacing(2)
        self.library_list.setWordWrap(False)
        self.library_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.library_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.library_list.setAcceptDrops(False)
        lib_title = QLabel("Library")
        lib_title.setObjectName("sectionTitle")
        add_file = QPushButton("Open…")
        add_file.clicked.connect(self.choose_file)
        add_folder = QPushButton("Folder…")
        add_folder.clicked.connect(self.choose_folder)
        head = QHBoxLayout()
        head.addWidget(lib_title, 1)
        head.addWidget(add_file)
        head.addWidget(add_folder)
        self.gauge = MemoryGauge()
        self.estimate_label = QLabel()
        self.estimate_label.setObjectName("estimate")
        self.estimate_label.setWordWrap(True)
        sidebar = QWidget()
        sidebar.setObjectName("sidebar")
        side = QVBoxLayout(sidebar)
        side.setContentsMargins(10, 10, 10, 10)
        side.addLayout(head)
        side.addWidget(self.library_list, 1)
        side.addSpacing(6)
        side.addWidget(self.gauge)
        side.addWidget(self.estimate_label)

        # Main column.
        self.doc_title = QLabel("No document open")
        self.doc_title.setObjectName("docTitle")
        self.doc_info = QLabel("")
        self.doc_info.setObjectName("docInfo")
        self.doc_info.setWordWrap(True)
        self.open_button = QPushButton("Open")
        self.open_button.setToolTip("Read this document (a saved prefix cache skips the prefill)")
        self.open_button.clicked.connect(self._open_current)
        self.open_button.hide()
        header = QWidget()
        header.setObjectName("docHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(14, 10, 14, 8)
        titles = QVBoxLayout()
        titles.addWidget(self.doc_title)
        titles.addWidget(self.doc_info)
        hl.addLayout(titles, 1)
        hl.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignTop)
        self.progress = ProgressPanel(self)
        self.banner = Banner(self)
        self.drop_area = DropArea(self)
        self.chat = ChatView()
        self.chat.setAcceptDrops(False)
        self.chat.viewport().setAcceptDrops(False)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.drop_area)
        self.stack.addWidget(self.chat)
        self.question = QLineEdit()
        self.question.setObjectName("question")
        self.question.setAcceptDrops(False)
        self.question.setClearButtonEnabled(True)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setDefault(True)
        self.cloud_button = QPushButton("Ask the cloud")
        self.cloud_button.setToolTip("Send this question (and what fits of the document) to the cloud endpoint in Settings")
        self.follow_up = QCheckBox("Follow-up")
        self.follow_up.setToolTip("Continue from the previous answer instead of starting fresh from the document")
        input_row = QHBoxLayout()
        input_row.setContentsMargins(12, 8, 12, 12)
        input_row.addWidget(self.question, 1)
        input_row.addWidget(self.follow_up)
        input_row.addWidget(self.ask_button)
        input_row.addWidget(self.cloud_button)
        main = QWidget()
        main.setObjectName("mainColumn")
        column = QVBoxLayout(main)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(header)
        column.addWidget(self.progress)
        column.addWidget(self.banner)
        column.addWidget(self.stack, 1)
        column.addLayout(input_row)

        splitter = QSplitter()
        splitter.addWidget(sidebar)
        splitter.addWidget(main)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([330, 790])
        splitter.setChildrenCollapsible(False)
        sidebar.setMinimumWidth(280)
        self.splitter = splitter
        self.setCentralWidget(splitter)
        self.model_status = QLabel("Loading the model…")
        self.statusBar().addWidget(self.model_status, 1)
        self.setStyleSheet(STYLE)
        self.resize(1100, 720)

        self.gauge_timer = QTimer(self)
        self.gauge_timer.setInterval(GAUGE_IDLE_MS)
        self.gauge_timer.timeout.connect(self._refresh_gauge)
        self.gauge_timer.start()
        self.phase_timer = QTimer(self)
        self.phase_timer.setInterval(500)
        self.phase_timer.timeout.connect(self._tick_phase)

    def _build_menu(self) -> None:
        menu = self.menuBar().addMenu("&File")
        self.action_open = QAction("&Open…", self, shortcut=QKeySequence.StandardKey.Open, triggered=self.choose_file)
        self.action_open_folder = QAction("Open &Folder…", self, shortcut=QKeySequence("Ctrl+Shift+O"), triggered=self.choose_folder)
        self.action_settings = QAction("&Settings…", self, shortcut=QKeySequence("Ctrl+,"), triggered=self.show_settings)
        self.action_settings.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.action_cancel = QAction("&Cancel", self, shortcut=QKeySequence(Qt.Key.Key_Escape), triggered=self.cancel_work)
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit, triggered=self.close)
        for action in (self.action_open, self.action_open_folder, None, self.action_settings, self.action_cancel, None, quit_action):
            menu.addSeparator() if action is None else menu.addAction(action)
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(QAction("Open the &log folder", self, triggered=self._open_log_folder))
        help_menu.addAction(QAction("&About Halaman", self, triggered=self._about))

    def _connect(self) -> None:
        self.library_list.currentItemChanged.connect(self._library_selected)
        self.library_list.itemDoubleClicked.connect(lambda _item: self._open_current())
        self.library_list.customContextMenuRequested.connect(self._library_menu)
        self.question.returnPressed.connect(self.ask)
        self.ask_button.clicked.connect(self.ask)
        self.cloud_button.clicked.connect(self.ask_cloud)
        self.chat.citation_clicked.connect(self.show_citation)
        self.client.memory.connect(self._on_memory)
        self.client.busy_changed.connect(self._on_busy)
        self.client.confirm.connect(self._on_confirm)
        self.client.model_loaded.connect(self._on_model_loaded)
        self.client.job_started.connect(self._on_job_started)

    # ============================================================= model
    def load_model(self) -> None:
        self.model_status.setText(f"Loading the model ({self._model_name()})…")
        self.client.run("load model", lambda workspace, ctx: workspace.ensure_model(ctx.progress), title="Loading the model…",
                        on_progress=self._on_progress, on_done=self._model_ready, on_error=self._model_failed)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        threads = f", {info.threads} thread{'s' if info.threads != 1 else ''}" if info.threads else ""
        self.model_status.setText(
            f"Model: {info.label} on {info.device.upper()}{threads} · weights {format_bytes(info.weight_bytes)} "
            f"({info.weights_label}) · loaded in {info.load_seconds:.1f} s"
        )
        self._update_estimate()

    def _model_ready(self, info: ModelInfo) -> None:
        self._loading_since = None
        self._on_model_loaded(info)

    def _model_failed(self, error: JobError) -> None:
        self._loading_since = None
        if self._closed:
            return
        self.model_status.setText("No model loaded")
        if error.kind != "cancelled":
            self.banner.show_message("error", f"Could not load the model: {error.message}", "Settings…", self.show_settings)

    # ========================================================== documents
    def choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a document", str(Path.home()),
            "Documents (*.pdf *.txt *.md *.rst *.py *.json *.csv *.html *.tex);;PDF files (*.pdf);;All files (*)",
        )
        if path:
            self.open_path(path)

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a code folder", str(Path.home()))
        if path:
            self.open_path(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if local_paths(event.mimeData()):
            event.acceptProposedAction()
            self.drop_area.set_highlight(True)
        else:
            event.ignore()

    def dragLeaveEvent(self, event) -> None:
        self.drop_area.set_highlight(False)

    def dropEvent(self, event: QDropEvent) -> None:
        self.drop_area.set_highlight(False)
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

    def open_path(self, path: str, password: str | None = None) -> None:
        """Read a document in the worker (prefill, or restore its prefix cache)."""
        path = str(Path(path).expanduser().resolve())
        self.client.cancel({"open", "ask", "cloud"})  # a new document replaces what was being read or answered
        self.banner.hide()
        self.opening = path
        self.open_document_id = None
        self.segments = {}
        self._estimate_shown_for = None
        record = self.library.find(path)
        if record is not None:
            self.current = record
            self._select(record.id)
            self._show_current()
        else:
            self.current = None
            self.doc_title.setText(Path(path).name)
            self.doc_info.setText("Reading…")
            self.chat.clear()
            self.stack.setCurrentWidget(self.chat)
        self.open_button.hide()
        self.setWindowTitle(f"Halaman — {Path(path).name}")
        job = Job("open", lambda workspace, ctx: workspace.open(path, password=password, progress=ctx.progress, cancel=ctx.cancel),
                  title=f"Opening {Path(path).name}…", on_progress=self._on_progress)
        job.on_done = lambda result: self._opened(job, result)
        job.on_error = lambda error: self._open_failed(job, path, password, error)
        self._open_job = job
        self._update_input()
        self.client.submit(job)

    def _opened(self, job: Job, result: OpenResult) -> None:
        if job is not self._open_job or self._closed:
            return  # superseded by a newer open
        self._open_job = None
        report, document = result.report, result.document
        files = len(document.segments) if document.kind == "repo" else None
        doc_id = self.library.upsert_document(
            path=result.path, title=report.title, kind=report.kind, pages=report.pages, files=files,
            tokens=report.document_tokens, prefix_key=result.prefix_key, config_sig=config_signature(self.settings),
        )
        if self.cached_keys is not None and result.prefix_key:
            self.cached_keys.add(result.prefix_key)  # confirmed by refresh_cache_status below
        self.opening = None
        self.open_document_id = doc_id
        self.last_report = report
        self.segments = {s.label: s.text for s in document.segments}
        self.chat.labels = set(self.segments)
        self.refresh_library(select=doc_id)
        if report.prefix_hit:
            self.statusBar().showMessage(f"Prefix cache hit: {report.title} was ready in {report.seconds:.1f} s, no prefill needed.", 10000)
        else:
            self.statusBar().showMessage(
                f"Read {report.title}: prefilled {report.document_tokens:,} tokens in {fmt_duration(report.prefill_seconds)} "
                f"({report.prefill_tokens_per_s:,.0f} tokens/s).", 10000)
        if report.warnings:
            self.banner.show_message("warning", warning_note(report.warnings))
        self._on_memory(result.memory)
        self._update_input()
        self.question.setFocus()
        self.refresh_cache_status()

    def _open_failed(self, job: Job, path: str, password: str | None, error: JobError) -> None:
        if job is not self._open_job or self._closed:
            return  # superseded by a newer open (which cancelled this one)
        self._open_job = None
        self.opening = None
        self._update_input()
        name = Path(path).name
        if error.kind == "cancelled":
            self.doc_info.setText("Opening was cancelled.")
            self.statusBar().showMessage(f"Cancelled reading {name}.", 8000)
            return
        if error.kind == "password":
            wrong = isinstance(error.exception, WrongPasswordError) or password is not None
            typed = self.ask_password(name, wrong)
            if typed is not None:
                self.open_path(path, password=typed)
            else:
                self.banner.show_message("error", f"{name} needs a password to open.", "Enter password…",
                                         lambda: self._retry_password(path))
            return
        self.doc_info.setText("Could not open this document.")
        if error.kind == "oom":
            self.banner.show_message("error", error.message, "Lower the budget and retry", lambda: self.lower_budget_and_retry(path))
            return
        self.banner.show_message("error", f"Could not open {name}: {error.message}")

    def _retry_password(self, path: str) -> None:
        typed = self.ask_password(Path(path).name, False)
        if typed is not None:
            self.open_path(path, password=typed)

    def ask_password(self, name: str, wrong: bool) -> str | None:
        """Ask for a PDF password (modal). None if the user cancels."""
        prompt = (f"That password does not open {name}. Try again:" if wrong else f"{name} is protected by a password:")
        text, ok = QInputDialog.getText(self, "Password needed", prompt, QLineEdit.EchoMode.Password)
        return text if ok else None

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

    # ============================================================== ask
    def ask(self) -> None:
        self._ask(self.question.text().strip(), cloud=False)

    def ask_cloud(self) -> None:
        question = self.question.text().strip() or self._last_question()
        self._ask(question, cloud=True, reason="user asked")

    def _ask(self, question: str, *, cloud: bool, reason: str = "user asked", escalation: bool = False) -> None:
        """Ask locally or in the cloud; `escalation`: the cloud answers the question just answered
        locally (the question is not repeated in the chat)."""
        if not question or self.open_document_id is None or self.live is not None or self.opening:
            return
        doc_id = self.open_document_id
        follow_up = self.follow_up.isChecked() and not cloud
        if not escalation:
            self.question.clear()
            self.library.add_message(doc_id, "user", question)
        model_name = self.settings.cloud.model if cloud else (self.client.model.label if self.client.model else None)
        message_id = self.library.add_message(
            doc_id, "assistant", "", state="streaming", source="cloud" if cloud else "local",
            endpoint=self.settings.cloud.base_url if cloud else None, model=model_name, reason=reason if cloud else None,
        )
        if not escalation:
            self.chat.add_question(question)
        self.chat.begin_answer("Halaman · cloud" if cloud else "Halaman")
        if cloud:
            def fn(workspace, ctx):
                # "ask before sending": the worker waits for the dialog (`_on_confirm`)
                confirm = (lambda plan: ctx.confirm("cloud", plan)) if workspace.settings.cloud.ask_before_sending else None
                return workspace.ask_cloud(question, reason=reason, on_text=ctx.text, cancel=ctx.cancel, confirm=confirm)
        else:
            def fn(workspace, ctx):
                return workspace.ask(question, follow_up=follow_up, on_text=ctx.text, cancel=ctx.cancel)
        job = Job("cloud" if cloud else "ask", fn, title="Asking the cloud…" if cloud else "Answering…",
                  on_text=self._on_answer_text)
        self.live = LiveAnswer(job, doc_id, message_id, question, "cloud" if cloud else "local", saved_at=time.monotonic())
        job.on_done = lambda answer: self._answered(job, answer)
        job.on_error = lambda error: self._answer_failed(job, error)
        self._update_input()
        self.client.submit(job)

    def _on_answer_text(self, piece: str) -> None:
        live = self.live
        if live is None:
            return
        live.text += piece
        live.pieces += 1
        self.chat.append_text(piece)
        self.progress.set_busy(f"{'Cloud answer' if live.source == 'cloud' else 'Answering'}… {live.pieces} tokens so far")
        if time.monotonic() - live.saved_at > SAVE_PARTIAL_EVERY_S:
            self.library.update_message(live.message_id, text=live.text)
            live.saved_at = time.monotonic()

    def _answered(self, job: Job, answer: Answer | None) -> None:
        live = self.live
        if live is None or live.job is not job:
            return
        self.live = None
        if answer is None:  # the user declined to send it to the cloud
            fields = dict(text=live.text or "_(not sent)_", state="cancelled", stop_reason="cancelled")
        else:
            fields = answer_record(answer, model=self.client.model, recall=self.settings.recall).fields()
        self.library.update_message(live.message_id, **fields)
        message = self.library.message(live.message_id)
        self.chat.finish_answer(message)
        self._update_input()
        # The policy is pure (the answer, its document's report, the settings): None for a cloud or
        # cancelled answer, or with automatic escalation off.
        reason = escalation_reason(answer, self.last_report, self.settings) if answer and self.last_report else None
        if reason and not self._closed:
            self._ask(live.question, cloud=True, reason=reason, escalation=True)

    def _answer_failed(self, job: Job, error: JobError) -> None:
        live = self.live
        if live is None or live.job is not job:
            return
        self.live = None
        state = "cancelled" if error.kind == "cancelled" else "error"
        text = live.text if state == "cancelled" else (live.text + "\n\n" if live.text else "") + f"_{error.message}_"
        self.library.update_message(live.message_id, text=text, state=state, stop_reason=state)
        self.chat.finish_answer(self.library.message(live.message_id))
        self._update_input()
        if self._closed:
            return
        if error.kind == "oom":
            self.banner.show_message("error", error.message, "Lower the budget and retry",
                                     lambda: self.lower_budget_and_retry(self._open_path()))
        elif error.kind != "cancelled":
            self.banner.show_message("error", f"Could not answer: {error.message}")

    def _last_question(self) -> str:
        if self.current is None:
            return ""
        for message in reversed(self.library.messages(self.current.id)):
            if message.role == "user":
                return message.text
        return ""

    def _on_confirm(self, job: Job, request: ConfirmRequest) -> None:
        """The worker asks before sending something to the cloud: show what would be sent."""
        plan: CloudPlan = request.payload
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Send to the cloud?")
        cut = " (cut to fit the endpoint's context)" if plan.was_cut else ""
        box.setText(f"Send this question and part of “{plan.document_title}” to {plan.endpoint} (model {plan.model})?")
        info = (f"Question: {plan.question}\n"
                f"Document: {plan.document_tokens_sent:,} of {plan.document_tokens_total:,} tokens, "
                f"{len(plan.segments_sent)} pages/files{cut}")
        if plan.warnings:
            info += "\n\n" + "\n".join(f"• {w}" for w in plan.warnings)
        box.setInformativeText(info)
        box.setDetailedText("Segments sent:\n" + "\n".join(plan.segments_sent))
        send = box.addButton("Send", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Don't send", QMessageBox.ButtonRole.RejectRole)
        box.finished.connect(lambda _r: request.answer(box.clickedButton() is send))
        self.confirm_box = box
        box.open()

    # ============================================================ cancel
    def cancel_work(self) -> None:
        """Cancel whatever the worker is doing (prefill, answer); it stops within a second."""
        if self.client.busy:
            self.client.cancel()
            self.progress.label.setText("Cancelling…")

    # =========================================================== library
    def refresh_library(self, select: int | None = None) -> None:
        keep = select if select is not None else (self.current.id if self.current else None)
        self.library_list.blockSignals(True)
        self.library_list.clear()
        for record in self.library.documents():
            status = self.library.status(record, self.cached_keys, self.settings)
            details = " · ".join(x for x in (
                record.size_text, f"{record.tokens:,} tokens" if record.tokens else "", STATUS_TEXT[status]) if x)
            item = QListWidgetItem(f"{record.title}\n{details}")
            item.setData(Qt.ItemDataRole.UserRole, record.id)
            item.setData(Qt.ItemDataRole.UserRole + 1, status)
            item.setToolTip(f"{record.title}\n{record.path}\nprefix cache: {status}")
            if record.id == self.open_document_id:
                font = item.font()
                font.setBold(True)
                item.setFont(font)
            self.library_list.addItem(item)
            if record.id == keep:
                self.library_list.setCurrentItem(item)
        self.library_list.blockSignals(False)
        if keep is not None:
            self.current = self.library.document(keep)
            self._show_current()

    def refresh_cache_status(self) -> None:
        """Ask the worker which prefix caches are on disk, then redraw the library."""
        def done(keys: set[str]) -> None:
            self.cached_keys = keys
            self.refresh_library()

        self.client.run("cache status", lambda workspace, ctx: workspace.cached_keys(), on_done=done)

    def library_status(self, document_id: int) -> str:
        record = self.library.document(document_id)
        return self.library.status(record, self.cached_keys, self.settings) if record else ""

    def _select(self, document_id: int) -> None:
        for row in range(self.library_list.count()):
            item = self.library_list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == document_id:
                self.library_list.setCurrentItem(item)
                return

    def _library_selected(self, item: QListWidgetItem | None, _previous=None) -> None:
        if item is None:
            return
        self.current = self.library.document(item.data(Qt.ItemDataRole.UserRole))
        self._show_current()

    def _show_current(self) -> None:
        record = self.current
        if record is None:
            self.stack.setCurrentWidget(self.drop_area)
            self.doc_title.setText("No document open")
            self.doc_info.setText("")
            self.open_button.hide()
            self._update_input()
            return
        self.stack.setCurrentWidget(self.chat)
        self.doc_title.setText(record.title)
        is_open = record.id == self.open_document_id
        if not self.chat.streaming:
            self.chat.labels = set(self.segments) if is_open else None
            self.chat.show_messages(self.library.messages(record.id))
        self.doc_info.setText(self._document_info(record, is_open))
        self.open_button.setVisible(not is_open and self.opening != record.path)
        self._update_input()

    def _document_info(self, record: DocumentRecord, is_open: bool) -> str:
        parts = [record.size_text]
        if record.tokens:
            parts.append(f"{record.tokens:,} tokens")
        report = self.last_report if is_open else None
        if report is not None:
            parts.append(f"KV cache {format_bytes(report.kv.total_bytes)} vs {format_bytes(report.full_fp16_bytes)} full FP16 "
                         f"({size_ratio(report.full_fp16_bytes, report.kv.total_bytes)})")
            parts.append("prefix cache hit" if report.prefix_hit else "prefilled")
            parts.append(f"positions {report.position_mode}")
        elif record.tokens:
            parts.append(self._estimate_text(record.tokens))
        if not is_open and self.opening != record.path:
            parts.append(f"prefix cache: {self.library.status(record, self.cached_keys, self.settings)} — not open")
        return " · ".join(p for p in parts if p)

    def _open_current(self) -> None:
        if self.current is not None and self.current.id != self.open_document_id:
            if not Path(self.current.path).exists():
                self.banner.show_message("error", f"{self.current.path} is no longer there: it was moved or deleted.")
                return
            self.open_path(self.current.path)

    def _open_path(self) -> str | None:
        record = self.library.document(self.open_document_id) if self.open_document_id else None
        return record.path if record else self.opening

    def _library_menu(self, pos) -> None:
        item = self.library_list.itemAt(pos)
        if item is None:
            return
        doc_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Open", self._open_current)
        menu.addAction("Remove from library (and its chat)", lambda: self.remove_document(doc_id))
        menu.exec(self.library_list.viewport().mapToGlobal(pos))

    def remove_document(self, document_id: int) -> None:
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
        """Show the cited page or file of the open document."""
        text = self.segments.get(label) or self.segments.get(normalise_label(label))
        if text is None:
            self.statusBar().showMessage(f"“{label}” is not a page or file of the open document.", 6000)
            return
        box = QMessageBox(self)
        box.setWindowTitle(label)
        box.setText(f"<b>{label}</b>")
        box.setInformativeText(text[:1500] + ("…" if len(text) > 1500 else ""))
        self.citation_box = box
        box.open()

    # ========================================================= settings
    def show_settings(self) -> None:
        profile = self.client.model.profile if self.client.model else None
        tokens = self.last_report.document_tokens if self.last_report and self.open_document_id else None
        dialog = SettingsDialog(self.settings, profile=profile, parent=self, document_tokens=tokens)
        dialog.clear_cache_requested.connect(lambda: self.clear_prefix_cache(dialog))
        self.client.run("cache usage", lambda workspace, ctx: workspace.prefix_cache_usage(),
                        on_done=lambda usage: self.settings_dialog is dialog and dialog.set_cache_usage(*usage))
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

        self.client.run("clear cache", lambda workspace, ctx: workspace.clear_prefix_cache(), on_done=done,
                        on_error=lambda error: self.banner.show_message("error", f"Could not clear the prefix cache: {error.message}"))

    def apply_settings(self, new: EngineSettings | None, *, retry_path: str | None = None) -> None:
        """Use `new` settings now, without a restart, and do what the workspace says the change
        implies (`SettingsChange`): reload the model, re-open the current document (prefix caches
        are keyed by the policy, so only those of the old policy miss), or nothing.
        `retry_path`: open this document afterwards anyway."""
        if new is None:
            return
        # The same decision the workspace returns, known now: work under the old settings stops,
        # and no question is taken until the document is open again under the new ones.
        expected = SettingsChange.between(self.settings, new)
        document = self._open_path()
        if expected.reopens_document:
            self.client.cancel({"open", "ask", "cloud"})
        if retry_path or (expected.reopens_document and document):
            self.opening = retry_path or document
            self.open_document_id = None
        self.settings = new
        self.client.settings = new

        def done(change: SettingsChange) -> None:
            if self._closed:
                return
            if change is SettingsChange.RELOAD_MODEL:
                self.client.model = None
                self.model_status.setText("Model changed: loading it…")
                self.load_model()
            reopen = retry_path or (document if change.reopens_document else None)
            if reopen:
                self.open_path(reopen)
            self.refresh_cache_status()
            self._update_input()
            self._update_estimate()

        self.client.run("apply settings", lambda workspace, ctx: workspace.apply_settings(new), on_done=done,
                        on_error=lambda error: self.banner.show_message("error", f"Could not apply the settings: {error.message}"))
        self._update_input()

    # ===================================================== progress, memory
    def _on_job_started(self, job: Job) -> None:
        """The progress panel follows the running job (one runs at a time)."""
        self._loading_since = None
        self._last_prefill = None
        if job.title:
            self.progress.set_busy(job.title)
            self.phase_timer.start()
        else:
            self.progress.hide()
            self.phase_timer.stop()

    def _tick_phase(self) -> None:
        """Between two progress events (a prefill chunk can take a minute on a busy CPU): count the
        ETA down, and show how long a model load has taken so far."""
        if self._last_prefill is not None:
            event, at = self._last_prefill
            self._show_prefill(event, time.monotonic() - at)
        if self._loading_since is not None:
            elapsed = time.monotonic() - self._loading_since
            self.progress.set_busy(f"Loading the model ({self._model_name()}) — {fmt_duration(elapsed)} "
                                   "(the first start converts it once, about 20 s)")

    def _model_name(self) -> str:
        return "embedded SmolLM2-135M" if self.settings.model == "default" else Path(self.settings.model).name

    def _show_prefill(self, event: Progress, since_s: float = 0.0) -> None:
        eta = fmt_duration(max(0.0, event.eta_s - since_s)) if event.eta_s is not None else "estimating…"
        self.progress.set_progress(
            f"Prefill {event.done:,} / {event.total:,} tokens · {event.tokens_per_s:,.1f} tokens/s · ETA {eta}",
            event.done, event.total)

    def _on_progress(self, event: Progress) -> None:
        self._loading_since = None
        self._last_prefill = None
        if event.phase == "loading model":
            self._loading_since = time.monotonic()
            self._tick_phase()
        elif event.phase == "reading":
            if event.total > 1:
                self.progress.set_progress(f"Reading {event.unit} {event.done:,} / {event.total:,}", event.done, event.total)
            else:
                self.progress.set_busy("Reading the document…")
        elif event.phase == "tokenizing":
            self.progress.set_busy("Tokenizing…")
        elif event.phase == "loading cache":
            if event.done >= event.total:
                self.progress.set_progress("Prefix cache hit — restoring the saved KV cache, no prefill needed", 1, 1)
            else:
                self.progress.set_busy("Looking for a saved prefix cache…")
        elif event.phase == "prefill":
            self._show_prefill(event)
            if event.done < event.total:
                self._last_prefill = (event, time.monotonic())
            if self._estimate_shown_for != event.total:
                self._estimate_shown_for = event.total
                self.doc_info.setText(f"{event.total:,} tokens · {self._estimate_text(event.total)}")

    def _on_busy(self, busy: bool) -> None:
        self.gauge_timer.setInterval(GAUGE_BUSY_MS if busy else GAUGE_IDLE_MS)
        self._refresh_gauge()
        if not busy:
            self._last_prefill = None
            self.progress.hide()
            self.phase_timer.stop()
        self._update_input()

    def _on_memory(self, report) -> None:
        self.client.last_memory = report if report is not None else self.client.last_memory
        if report is not None:
            self.gauge.set_report(report)
        self._update_estimate()

    def _refresh_gauge(self) -> None:
        report = self.client.sample_memory()
        if report is not None:
            self.gauge.set_report(report)

    def _estimate_text(self, tokens: int) -> str:
        profile = self.client.model.profile if self.client.model else KNOWN_SHAPES["smollm2-135m"]
        try:
            est = estimate(profile, self.settings.cache, tokens, self.settings.recall)
        except HalamanError as exc:
            return str(exc)
        text = (f"KV estimate: {format_bytes(est.compressed_bytes)} compressed vs {format_bytes(est.full_bytes)} full FP16 "
                f"({size_ratio(est.full_bytes, est.compressed_bytes)})")
        if est.archive_bytes:
            text += f" · archive on disk: {format_bytes(est.archive_bytes)}"
        memory = self.client.last_memory
        if memory is not None:
            if est.peak_bytes <= memory.device_free_bytes:
                full = "a full cache would fit too" if est.full_bytes <= memory.device_free_bytes else "a full cache would not"
                text += f" — fits in the {format_bytes(memory.device_free_bytes)} free ({full})"
            else:
                text += f" — does NOT fit in the {format_bytes(memory.device_free_bytes)} free: lower the budget"
        return text

    def _update_estimate(self) -> None:
        policy = self.settings.cache
        profile = self.client.model.profile if self.client.model else KNOWN_SHAPES["smollm2-135m"]
        try:
            at_budget = estimate(profile, policy, policy.budget_tokens, self.settings.recall)
        except HalamanError:
            return
        recall = (f" Recall brings back up to {self.settings.recall.recall_tokens:,} tokens per question "
                  f"(+{format_bytes(at_budget.recall_bytes)} while answering)." if at_budget.recall_bytes else " Recall is off.")
        self.estimate_label.setText(
            f"Budget {policy.budget_tokens:,} tokens (sink {policy.sink_tokens} + window {policy.window_tokens:,} "
            f"+ heavy hitters), INT{policy.kv_bits}: at most {format_bytes(at_budget.compressed_bytes)} of KV cache "
            f"per document, whatever its length.{recall}"
        )

    def _update_input(self) -> None:
        cloud_ok = self.settings.cloud.enabled
        self.cloud_button.setVisible(cloud_ok)
        ready = (self.open_document_id is not None and self.current is not None and self.current.id == self.open_document_id
                 and self.opening is None and self.live is None)
        self.question.setEnabled(ready)
        self.ask_button.setEnabled(ready)
        self.cloud_button.setEnabled(ready)
        self.follow_up.setEnabled(ready)
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
        self.question.setPlaceholderText(hint)
        self.action_cancel.setEnabled(self.client.busy)

    # ============================================================ closing
    def closeEvent(self, event) -> None:
        """Cancel the work, stop the worker thread, keep every message (a streamed answer is saved
        as far as it got)."""
        if self._closed:
            event.accept()
            return
        self._closed = True
        self.gauge_timer.stop()
        self.phase_timer.stop()
        self._save_geometry()
        if self.live is not None:
            self.library.update_message(self.live.message_id, text=self.live.text)
        # Cancels, stops the thread, then delivers what the worker sent before it stopped (the
        # cancelled answer's result), which the callbacks above save as usual.
        self.client.shutdown()
        if self.live is not None:
            self.library.update_message(self.live.message_id, text=self.live.text, state="interrupted")
            self.live = None
        self.library.close()
        super().closeEvent(event)

    def _settings_store(self) -> QSettings:
        return QSettings(str(paths.config_dir() / "window.ini"), QSettings.Format.IniFormat)

    def _save_geometry(self) -> None:
        store = self._settings_store()
        store.setValue("geometry", self.saveGeometry())
        store.setValue("splitter", self.splitter.saveState())

    def _restore_geometry(self) -> None:
        store = self._settings_store()
        if store.value("geometry") is not None:
            self.restoreGeometry(store.value("geometry"))
        if store.value("splitter") is not None:
            self.splitter.restoreState(store.value("splitter"))

    def _open_log_folder(self) -> None:
        from app.errors import log_path

        QDesktopServices.openUrl(QUrl.fromLocalFile(str(log_path().parent)))

    def _about(self) -> None:
        QMessageBox.about(self, "About Halaman",
                          "<b>Halaman</b><br>Ask questions about whole documents with a small local model "
                          "over a compressed (sink + window + heavy-hitter, INT4) KV cache.")


def warning_note(warnings: list[str], shown: int = 3) -> str:
    """The banner's 'Note: a; b; c (and 2 more)' for an opened document's warnings. "recall is off
    for this document: ..." comes first, so that it is never among the ones left out: without it,
    answers would quietly lose what recall brings back."""
    ordered = sorted(warnings, key=lambda w: not w.startswith("recall is off"))
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
