"""Opening a document, from the window's intent to its result in the panels: the read in the worker
(`app.operations.open_document`), its progress in the library row and the header, the long-read
question, and what follows the result (the library row, the banner's warnings, a password prompt,
"lower the budget and retry" after running out of memory). It reports into the window's
`DocumentState` and says what changed (`app.changes`); the panels redraw themselves from that. The
window only calls `open_path`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer

from app import dialogs
from app import operations as ops
from app.changes import Changes
from app.units import fmt_duration
from app.worker import ConfirmRequest, Job, JobError
from engine.documents import DocumentError, WrongPasswordError
from engine.errors import ErrorKind
from engine.progress import Phase, Progress
from engine.workspace import OpenResult


class OpenFlow:
    """Reads documents for `window` (a `MainWindow`: its panels, client, library and `state`)."""

    def __init__(self, window) -> None:
        self.window = window
        self.long_read_box = None       # the open "read it all?" question, if any
        self._estimate_shown_for: int | None = None

    def open_path(self, path: str, password: str | None = None) -> None:
        """Read a document in the worker (prefill, or restore its prefix cache)."""
        w, state = self.window, self.window.state
        path = str(Path(path).expanduser().resolve())
        name = Path(path).name
        w.client.cancel(state.document_jobs())  # a new document replaces what was being read or answered
        w.banner.hide()
        stopped = w.background_read.stop()
        if stopped:  # said, not silent: the user may have been waiting for that read
            w.banner.show_message("info", stopped)
        self._estimate_shown_for = None
        w.store.last_folder = str(Path(path).parent)
        self.close_long_read_box()
        record = w.library.find(path)
        live = state.live
        job = ops.open_document(path, name=name, password=password)
        job.on_progress = lambda event: self._progress(job, event)
        job.on_done = lambda result: self._opened(job, result)
        # What was open before this read replaced it: a cancelled read opens it again.
        previous = state.open_path if state.open_id is not None and state.open_path != path else None
        job.on_error = lambda error: self._failed(job, path, password, error, previous)
        state.reading(path, record, job)
        if live is not None and (record is None or record.id != live.document_id):
            w.answers.detach()  # the answer is cancelled with the open; it is saved, not drawn here
        w.changed.emit(Changes(shown=True, reading=True))
        # After the list's selection followed the read: a new file's row is then the selected one.
        w.library_panel.set_reading(path, name, "reading…")
        w.setWindowTitle(f"Halaman — {name}")
        w.client.submit(job)

    # ------------------------------------------------------------ progress
    def _progress(self, job: Job, event: Progress) -> None:
        if job is self.window.state.open_job:  # a replaced read's last events belong to nobody
            self.show_progress(event)

    def show_progress(self, event: Progress) -> None:
        """A progress event of the read (or of loading the model) in the panels."""
        w = self.window
        w.progress.show_event(event)
        opening = w.state.opening
        if opening is None or event.phase is Phase.LOADING_MODEL:
            return
        w.library_panel.set_reading(opening, Path(opening).name, reading_text(event))
        # The header may show another library document meanwhile: the read's numbers are not its own.
        shows_the_read = w.state.current is None or w.state.being_read(w.state.current)
        if event.phase is Phase.PREFILL and shows_the_read and self._estimate_shown_for != event.total:
            self._estimate_shown_for = event.total
            w.header.set_info(f"{event.total:,} tokens · {w.estimate_text(event.total)}")

    def confirm_long_read(self, job: Job, request: ConfirmRequest) -> None:
        """The worker asks whether to read a long document: ask the user, unless that read was
        replaced or cancelled meanwhile."""
        w = self.window
        path = w.state.opening
        if job is not w.state.open_job or job.cancel.is_set() or path is None:
            request.answer(False)
            return

        def answer(choice: str) -> None:
            request.answer(choice == dialogs.READ)
            if choice == dialogs.SUBFOLDER:
                QTimer.singleShot(0, lambda: w.choose_folder(start=path))

        w.confirm_box = self.long_read_box = dialogs.confirm_long_read(
            w, Path(path).name, request.payload.describe(), folder=Path(path).is_dir(), answer=answer)

    def close_long_read_box(self) -> None:
        """A long-read question whose read ended or was replaced is no longer asked."""
        box, self.long_read_box = self.long_read_box, None
        if box is not None and box.isVisible():
            box.done(0)

    # -------------------------------------------------------------- results
    def _opened(self, job: Job, result: OpenResult) -> None:
        w = self.window
        if w.closed or job is not w.state.open_job:
            return  # superseded by a newer open
        self.close_long_read_box()
        report, document = result.report, result.document
        files = len(document.segments) if document.kind == "repo" else None
        doc_id = w.library.upsert_document(
            path=result.path, title=report.title, kind=report.kind, pages=report.pages, files=files,
            tokens=report.document_tokens, prefix_key=result.prefix_key, config_sig=result.prefix_signature,
        )
        if w.cache_status is not None:  # confirmed by refresh_cache_status below
            w.cache_status = w.cache_status.adding(result.prefix_key, report.document_tokens, result.prefix_signature)
        w.state.opened(job, doc_id, result.path, report, document)
        w.state.show(w.library.document(doc_id))  # even if another document was picked meanwhile
        w.library_panel.set_reading(None)
        w.changed.emit(Changes(shown=True, reading=True, library=True))
        if report.prefix_hit:
            w.statusBar().showMessage(f"{report.title} was ready in {report.seconds:.1f} s: its saved reading was reused.", 10000)
        elif report.unread:
            # no time here: the header gives the read's one time estimate, which the status bar's
            # figure (the plan's) contradicted once the read had measured itself
            w.statusBar().showMessage(f"{report.title} is ready in {report.seconds:.1f} s: ask now, questions re-read the "
                                      "pages they choose. It is read whole in the background (time left above); "
                                      "Cancel (Esc) stops that read.", 20000)
        else:
            w.statusBar().showMessage(
                f"Read {report.title}: {report.document_tokens:,} tokens in {fmt_duration(report.prefill_seconds)} "
                f"({report.prefill_tokens_per_s:,.0f} tokens/s).", 10000)
        if report.warnings:
            w.banner.show_message("warning", warning_note(report.warnings, str(report.recall_notice) if report.recall_notice else None),
                                  document_id=w.state.open_id)
        w.on_memory(result.memory)
        w.conversation.question.setFocus()
        w.refresh_cache_status()
        if report.unread:
            w.background_read.start(result.path, report)

    def _failed(self, job: Job, path: str, password: str | None, error: JobError, previous: str | None = None) -> None:
        w = self.window
        if w.closed or not w.state.read_ended(job):
            return  # superseded by a newer open (which cancelled this one)
        self.close_long_read_box()
        w.library_panel.set_reading(None)
        w.changed.emit(Changes(reading=True, library=True))  # a library document's row shows its own details again
        name = Path(path).name
        if error.kind is not ErrorKind.CANCELLED and isinstance(error.exception, DocumentError) and self._keep_open():
            # The engine reads a new file before it closes the open one: that one is open again, its chat kept.
            if error.kind is ErrorKind.PASSWORD:
                self._ask_password_again(path, password, error)
            else:
                w.banner.show_message("error", f"Could not open {name}: {error.message}")
            return
        if w.state.current is None:
            w.setWindowTitle("Halaman")
        if error.kind is ErrorKind.CANCELLED and previous is not None and Path(previous).exists():
            # The read had replaced the open document; without it nothing would be open at all.
            w.statusBar().showMessage(f"Cancelled reading {name}; opening {Path(previous).name} again.", 8000)
            self.open_path(previous)
        elif error.kind is ErrorKind.CANCELLED:
            w.header.set_info("Opening was cancelled." if w.state.current else "Reading was cancelled: nothing was kept.")
            w.statusBar().showMessage(f"Cancelled reading {name}.", 8000)
        elif error.kind is ErrorKind.PASSWORD:
            self._ask_password_again(path, password, error)
        elif error.kind is ErrorKind.OOM:
            w.header.set_info("Could not open this document.")
            w.banner.show_message("error", error.message, "Lower the budget and retry",
                                  lambda: w.settings_flow.lower_budget_and_retry(path))
        else:
            w.header.set_info("Could not open this document.")
            w.banner.show_message("error", f"Could not open {name}: {error.message}")

    def _keep_open(self) -> bool:
        """After a read that failed before the engine closed the open document: show that one again
        as open (its chat, its header, its background read going on). False when none was open."""
        w = self.window
        if not w.state.kept_open():
            return False
        w.state.show(w.library.document(w.state.open_id))
        w.setWindowTitle(f"Halaman — {Path(w.state.open_path).name}")
        w.changed.emit(Changes(shown=True, reading=True, library=True))
        report = w.state.report
        if report is not None and report.unread:
            w.background_read.start(w.state.open_path, report)
        return True

    def _ask_password_again(self, path: str, password: str | None, error: JobError) -> None:
        """A PDF needs a (the right) password: ask for it; a banner offers it again when the user cancels."""
        name = Path(path).name
        typed = self.ask_password(name, isinstance(error.exception, WrongPasswordError) or password is not None)
        if typed is not None:
            self.open_path(path, password=typed)
        else:
            self.window.banner.show_message("error", f"{name} needs a password to open.", "Enter password…",
                                            lambda: self._retry_password(path))

    def _retry_password(self, path: str) -> None:
        typed = self.ask_password(Path(path).name, False)
        if typed is not None:
            self.open_path(path, password=typed)

    def ask_password(self, name: str, wrong: bool) -> str | None:
        """Ask for a PDF password (modal). None if the user cancels."""
        return dialogs.ask_password(self.window, name, wrong)


def reading_text(event: Progress) -> str:
    """The library row of the document being read: "reading 40 % · ETA 3 min 10 s"."""
    if event.phase is Phase.PREFILL and event.total:
        eta = f" · ETA {fmt_duration(event.eta_s)}" if event.eta_s is not None and event.done < event.total else ""
        return f"reading {100 * event.done // event.total} %{eta}"
    if event.phase is Phase.READING and event.total > 1:
        return f"reading {event.unit} {event.done:,} / {event.total:,}"
    if event.phase is Phase.LOADING_CACHE:
        return "opening its saved reading"
    return "reading…"


def warning_note(warnings: list[str], first: str | None = None, shown: int = 3) -> str:
    """The banner's 'Note: a; b; c (and 2 more)' for an opened document's warnings. `first` (the
    report's `recall_notice`, why recall is off or slower) comes first, so that it is never among
    the ones left out: without it, answers would quietly lose what recall brings back."""
    ordered = sorted(warnings, key=lambda w: w != first)
    more = f" (and {len(ordered) - shown} more)" if len(ordered) > shown else ""
    return "Note: " + "; ".join(ordered[:shown]) + more
