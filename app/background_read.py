"""The whole read of a document opened index first (`DocumentSession.open(read_now=False)`), run in
the worker after the open, between questions.

A document is answerable seconds after it is opened: questions re-read the pages they choose. The
read that makes later answers faster (and the document's saved reading) then runs as a background
job. A question pauses it between two chunks (`DocumentSession.read(pause=…)`): the read job
returns, the question (queued behind it) is answered, and the read is submitted again after it, going
on from the chunk it stopped at. Cancel stops it; the document stays answerable, and the chunks read
are kept in the prefix cache (`engine.read_checkpoint`): the next open goes on from there, even
after a restart, and its progress starts where the read stopped.
"""

from __future__ import annotations

import threading
from pathlib import Path

from app import operations as ops
from app.changes import Changes
from app.panel_refresh import document_header
from app.units import fmt_duration
from app.worker import Job, JobError
from engine.errors import ErrorKind
from engine.open_document import OpenReport
from engine.progress import Phase, Progress


class BackgroundRead:
    """The background read for `window` (a `MainWindow`). At most one runs: the open document's."""

    def __init__(self, window) -> None:
        self.window = window
        self.job: Job | None = None
        self.path: str | None = None
        self._pause: threading.Event | None = None
        self.share = 0.0  # how much of the document the read has done (0..1): `stop` says it
        self.stopped = False  # the open document's read was cancelled or failed: it is not read whole
        window.progress.ticked.connect(self._redraw_time_left)

    @property
    def left_s(self) -> float | None:
        """The read's time left, seconds (None before it is measured): the progress line's own
        figure (`ProgressPanel.time_left`), which the header and the library row show too."""
        return self.window.progress.time_left.seconds if self.job is not None else None

    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self, path: str, report: OpenReport | None = None) -> None:
        """Read the open document (`path`, opened index first) whole, in the background; its
        progress starts where an earlier read of it stopped (`report.read_from`)."""
        self.stop()
        self.path, self.share = path, 0.0
        self.window.progress.time_left.clear()
        self._submit()
        if report is not None and report.read_from:
            self.show_progress(self.job, Progress(Phase.PREFILL, report.read_from, report.document_tokens, "tokens"))

    def stop(self) -> str | None:
        """Cancel the read (a new document replaces this one, or the window closes). Returns what
        to tell the user when a read was under way ("Reading book.pdf whole stopped at 37 %: …"),
        else None."""
        job, self.job, self._pause = self.job, None, None
        self.stopped = False  # another document, or none, follows
        if job is None:
            return None
        self.window.client.cancel([job])
        self.window.library_panel.set_reading(None)
        share = f" at {self.share:.0%}" if self.share else ""
        return (f"Reading {Path(self.path).name} whole stopped{share}: what was read is kept, and the read goes on "
                "from there the next time you open it.")

    def pause_for_question(self) -> None:
        """A question is about to be submitted: the read stops after its current chunk, and goes on
        once the question is answered (its job is queued behind the question's)."""
        if self._pause is not None:
            self._pause.set()

    def _submit(self) -> None:
        pause = threading.Event()
        job = ops.read_document(pause=pause)
        job.on_progress = lambda event: self.show_progress(job, event)
        job.on_done = lambda report: self._done(job, report)
        job.on_error = lambda error: self._failed(job, error)
        self.job, self._pause = job, pause
        self.window.client.submit(job)

    def show_progress(self, job: Job, event: Progress) -> None:
        """A progress event of `job` (the read running now; a replaced read's are dropped): the progress
        line, the library row and the header's time left."""
        if job is not self.job:
            return
        self.window.progress.show_event(event)
        self.share = event.done / event.total if event.total else 0.0
        self._redraw_time_left()

    def _redraw_time_left(self) -> None:
        """The header and the library row with the progress line's time left (at each event and
        each tick of its countdown), so the three say the same."""
        if self.job is None:
            return
        w, left_s = self.window, self.left_s
        document_header(w)
        left = f", about {fmt_duration(left_s)} left" if left_s is not None else ""
        w.library_panel.set_reading(self.path, Path(self.path).name,
                                    f"answering from the parts it chooses; reading it whole: {self.share:.0%}{left}")

    def _done(self, job: Job, report: OpenReport | None) -> None:
        if job is not self.job:
            return
        w = self.window
        if report is None:  # paused for a question: go on after it
            self._submit()
            return
        self.job = self._pause = None
        w.library_panel.set_reading(None)
        w.changed.emit(Changes(shown=True, library=True))  # the header's memory line, the row's "cached"
        w.statusBar().showMessage(f"Read {report.title} whole in {fmt_duration(report.prefill_seconds)}: later "
                                  "questions start from its saved reading.", 10000)
        w.refresh_cache_status()

    def _failed(self, job: Job, error: JobError) -> None:
        if job is not self.job:
            return
        self.job = self._pause = None
        self.stopped = True
        w = self.window
        w.library_panel.set_reading(None)
        w.changed.emit(Changes(shown=True))  # the header no longer offers to cancel a read that is over
        if error.kind is ErrorKind.CANCELLED:
            w.statusBar().showMessage("The whole read was stopped: questions keep re-reading the pages they "
                                      "choose; opening the document again reads it.", 10000)
        else:
            w.banner.show_message("warning", f"The document could not be read whole ({error.message}); questions "
                                             "keep re-reading the pages they choose.", document_id=w.state.open_id)
