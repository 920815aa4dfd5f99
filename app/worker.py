"""The engine worker: one long-lived QObject on its own QThread owns the `engine.workspace.Workspace`
(model, document session, prefix store). The GUI never calls the workspace itself; it submits
`Job`s. This module is Qt plumbing only: threads, signals, and turning exceptions into messages;
what the engine does and decides is in `engine.workspace`.

    client = EngineClient(settings)                                   # GUI thread
    client.submit(Job("open", lambda workspace, ctx: workspace.open(path, progress=ctx.progress, cancel=ctx.cancel),
                      on_done=show_report, on_error=show_error, on_progress=bar.update))

The window builds its jobs with the named operations in `app.operations`, one per user action.

`Job` is the only shape background work takes (Anki's QueryOp, napari's workers):

* `fn(workspace, ctx)` runs on the worker thread. **It must not touch widgets or the `Library`**; it
  reports through `ctx.progress(...)`, `ctx.text(...)` and returns a result.
* `on_done(result)`, `on_error(JobError)`, `on_progress(Progress)`, `on_text(str)` run on the GUI
  thread (queued signals), in that order of events.
* Every exception becomes a `JobError` with a one-line, readable message (engine errors say what to
  do already); an unexpected one also carries its traceback for the log. Nothing escapes the thread.

Cancel: `client.cancel()` sets the running and queued jobs' `threading.Event`s; the engine checks it
between two layers of prefill or decode and raises `Cancelled` (or ends the answer with
stop_reason "cancelled"), so work stops well within a second.

Memory gauge, and why it is thread-safe: `Workspace.memory()` reads the cache's tensors and
counters, which the worker mutates during prefill and decode, so only the worker calls it — at safe
points between engine steps (each progress event and each streamed piece, at most every
MEMORY_EVERY_S, and at the end of every job) — and emits the resulting `MemoryReport` (frozen, plain
ints). Between those points the GUI refreshes only the device-wide numbers (free memory, process
workspace) with `engine.memory.remeasure`, which reads psutil / `torch.cuda.mem_get_info` and no
engine state, reusing the last report's weights / KV / budget. See `EngineClient.sample_memory`.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from engine.errors import ErrorKind, out_of_memory
from engine.memory import MemoryReport, remeasure
from engine.models.loader import LoadedModel
from engine.progress import Progress
from engine.settings import EngineSettings
from engine.workspace import ModelInfo, SettingsChange, Workspace, error_kind

log = logging.getLogger(__name__)

MEMORY_EVERY_S = 0.2
"""Least time between two memory reports emitted by the worker while a job runs."""


# ----------------------------------------------------------------------------- jobs
@dataclass
class JobError:
    """A failed job, for people: its `ErrorKind` (decided by `engine.workspace.error_kind`) and one
    readable line. A BUG's `details` hold the traceback, which goes to the log, never to the window."""

    kind: ErrorKind
    message: str
    exception: BaseException | None = None
    details: str = ""


def describe_error(exc: BaseException) -> JobError:
    """Turn any exception from an engine call into a readable JobError."""
    kind = error_kind(exc)
    if kind is ErrorKind.CANCELLED:
        return JobError(kind, "Cancelled.", exc)
    if kind is ErrorKind.OOM:
        return JobError(kind, f"Out of {out_of_memory(exc)} memory while working on the document: lower the KV budget "
                              "(Settings › KV budget) or choose a smaller model, then retry.", exc)
    if kind is ErrorKind.BUG:
        details = "".join(traceback.format_exception(exc))
        return JobError(kind, f"Unexpected error ({type(exc).__name__}: {exc}). It was logged; please report it.", exc, details)
    return JobError(kind, str(exc) or type(exc).__name__, exc)


@dataclass(eq=False)
class Job:
    """One engine call to run on the worker thread (see the module docstring for the rules)."""

    name: str
    fn: Callable[[Workspace, JobContext], Any]
    title: str | None = None        # shown in the progress panel while it runs; None: a quiet background job
    on_done: Callable[[Any], None] | None = None
    on_error: Callable[[JobError], None] | None = None
    on_progress: Callable[[Progress], None] | None = None
    on_text: Callable[[str], None] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class ConfirmRequest:
    """A question the worker asks the user mid-job (e.g. "send this to the cloud?").

    The worker waits on `answered` (checking its cancel event); the GUI sets `accepted` and then
    `answered`. Waiting on an Event, not a blocking signal, so closing the window never deadlocks.
    """

    kind: Any                       # app.operations.Confirm (which imports this module)
    payload: Any
    accepted: bool = False
    answered: threading.Event = field(default_factory=threading.Event)

    def answer(self, accepted: bool) -> None:
        self.accepted = accepted
        self.answered.set()


class JobContext:
    """What a job's `fn` may use besides the workspace: the cancel event and the ways to report
    (`progress` and `text` are the callbacks to hand to the workspace's calls)."""

    def __init__(self, worker: EngineWorker, job: Job) -> None:
        self._worker = worker
        self.job = job
        self.cancel = job.cancel
        self._last_memory = 0.0

    def progress(self, event: Progress) -> None:
        self._worker.progress.emit(self.job, event)
        self.checkpoint()

    def text(self, piece: str) -> None:
        self._worker.text.emit(self.job, piece)
        self.checkpoint()

    def checkpoint(self, *, force: bool = False) -> None:
        """A safe point between engine steps: emit a memory report (at most every MEMORY_EVERY_S)."""
        now = time.monotonic()
        if not force and now - self._last_memory < MEMORY_EVERY_S:
            return
        self._last_memory = now
        report = self._worker.workspace.memory()
        if report is not None:
            self._worker.memory.emit(report)

    def confirm(self, kind: Any, payload: Any) -> bool:
        """Ask the user (on the GUI thread; `kind`: an `app.operations.Confirm`) and wait for the answer;
        False if cancelled or closing."""
        if self.cancel.is_set() or self._worker.closing.is_set():
            return False  # replaced or cancelled already: nobody should be asked
        request = ConfirmRequest(kind, payload)
        self._worker.confirm.emit(self.job, request)
        while not request.answered.wait(0.1):
            if self.cancel.is_set() or self._worker.closing.is_set():
                return False
        return request.accepted


# --------------------------------------------------------------------------- worker
class EngineWorker(QObject):
    """Lives on the engine thread and owns the workspace there. `run(job)` is its only slot;
    everything else is signals."""

    started = Signal(object)              # job
    progress = Signal(object, object)     # job, engine.session.Progress
    text = Signal(object, str)            # job, streamed piece
    memory = Signal(object)               # engine.memory.MemoryReport
    done = Signal(object, object)         # job, result
    failed = Signal(object, object)       # job, JobError
    confirm = Signal(object, object)      # job, ConfirmRequest
    model_loaded = Signal(object)         # ModelInfo

    def __init__(self, workspace: Workspace) -> None:
        super().__init__()
        self.workspace = workspace
        self.closing = threading.Event()
        # Called on this thread whenever the workspace has loaded a model (a job that needs one
        # loads it: the first one, and the first after a model change).
        workspace.on_model_loaded = self.model_loaded.emit

    @Slot(object)
    def run(self, job: Job) -> None:
        if self.closing.is_set() or job.cancel.is_set():
            self.failed.emit(job, JobError(ErrorKind.CANCELLED, "Cancelled."))
            return
        ctx = JobContext(self, job)
        self.started.emit(job)
        try:
            result = job.fn(self.workspace, ctx)
        except BaseException as exc:  # noqa: BLE001 - the thread must survive anything a job raises
            error = describe_error(exc)
            if error.kind is ErrorKind.BUG:
                log.error("job %s failed:\n%s", job.name, error.details)
            elif error.kind is not ErrorKind.CANCELLED:
                log.info("job %s: %s", job.name, error.message)
            self.failed.emit(job, error)
        else:
            self.done.emit(job, result)
        finally:
            try:
                ctx.checkpoint(force=True)
            except Exception:  # noqa: BLE001 - a gauge reading is never worth a failure
                log.exception("memory report after %s", job.name)


class EngineClient(QObject):
    """The GUI thread's handle on the worker: submit jobs, cancel them, shut the thread down.

    Signals (GUI thread): `busy_changed(bool)`, `job_started(job)`, `memory(MemoryReport)`,
    `model_loaded(ModelInfo)`, `confirm(job, ConfirmRequest)`.
    """

    busy_changed = Signal(bool)
    job_started = Signal(object)
    memory = Signal(object)
    model_loaded = Signal(object)
    confirm = Signal(object, object)
    _submit = Signal(object)

    def __init__(self, settings: EngineSettings, model_factory: Callable[[EngineSettings], LoadedModel] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings           # the GUI thread's; the worker's is workspace.settings (see apply_settings)
        self.workspace = Workspace(settings, model_factory)
        self.model: ModelInfo | None = None
        self.last_memory: MemoryReport | None = None
        self._pending: list[Job] = []
        self._closed = False
        self.current: Job | None = None
        self.thread = QThread()
        self.thread.setObjectName("halaman-engine")
        self.worker = EngineWorker(self.workspace)
        self.worker.moveToThread(self.thread)
        self._submit.connect(self.worker.run)
        self.worker.model_loaded.connect(self._on_model_loaded)
        self.worker.started.connect(self._on_started)
        self.worker.progress.connect(self._on_progress)
        self.worker.text.connect(self._on_text)
        self.worker.memory.connect(self._on_memory)
        self.worker.done.connect(self._on_done)
        self.worker.failed.connect(self._on_failed)
        self.worker.confirm.connect(self.confirm)
        self.thread.start()

    # -- submitting
    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def submit(self, job: Job) -> Job:
        was_busy = self.busy
        self._pending.append(job)
        self._submit.emit(job)
        if not was_busy:
            self.busy_changed.emit(True)
        return job

    def cancel(self, jobs: Iterable[Job | None] | None = None) -> None:
        """Stop the running job and drop the queued ones (each ends with a cancelled JobError); with
        `jobs`, only those (the handles `submit` returned; None entries and finished jobs are skipped)."""
        chosen = None if jobs is None else {job for job in jobs if job is not None}
        for job in list(self._pending):
            if chosen is None or job in chosen:
                job.cancel.set()

    def apply_settings(self, new: EngineSettings, *, on_done: Callable[[SettingsChange], None] | None = None,
                       on_error: Callable[[JobError], None] | None = None) -> SettingsChange:
        """Use `new` settings: decide what the change implies (`SettingsChange.between`, the one call
        per apply), make it this client's settings now and the workspace's in the worker, in order
        with the jobs before and after it. Returns the change at once, so the caller can act on it
        before the worker has applied it; `on_done(change)` once it has (the model is forgotten here
        after RELOAD_MODEL). If the worker refuses the settings, this client goes back to the old ones."""
        old, change = self.settings, SettingsChange.between(self.settings, new)
        self.settings = new

        def done(applied: SettingsChange) -> None:
            if applied is SettingsChange.RELOAD_MODEL:
                self.model = None  # unloaded by the workspace; `model_loaded` brings the next one
            if on_done is not None:
                on_done(applied)

        def failed(error: JobError) -> None:
            if self.settings is new:
                self.settings = old
            if on_error is not None:
                on_error(error)

        self.submit(Job("apply settings", lambda workspace, ctx: workspace.apply_settings(new, change),
                        on_done=done, on_error=failed))
        return change

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Cancel everything, let the worker release the model, quit the thread and wait for it.
        Returns False if the thread did not end in time (e.g. a model load, which cannot be cancelled)."""
        if not self.thread.isRunning():
            return True
        self.worker.closing.set()
        self.cancel()
        self.thread.quit()  # ends the thread's event loop once the running job returns
        finished = self.thread.wait(int(timeout_s * 1000))
        if finished:
            self.workspace.shutdown()  # the thread is gone: nothing else touches the workspace now
            # Deliver what the worker sent before it stopped (e.g. a cancelled answer's last pieces
            # and its result), so the window can save it; after this, late signals are ignored.
            QCoreApplication.sendPostedEvents(self)
        else:
            log.warning("the engine thread did not stop within %.0f s", timeout_s)
        self._closed = True
        return finished

    # -- memory between the worker's reports
    def sample_memory(self) -> MemoryReport | None:
        """The last report with the device-wide numbers measured again now (thread-safe: reads
        psutil / torch.cuda.mem_get_info only, never the session)."""
        last = self.last_memory
        if last is None or self.model is None:
            return last
        return remeasure(last, self.model.device)

    # -- worker signals, on the GUI thread
    @Slot(object)
    def _on_started(self, job: Job) -> None:
        if self._closed:
            return
        self.current = job
        self.job_started.emit(job)

    @Slot(object, object)
    def _on_progress(self, job: Job, event: Progress) -> None:
        if self._closed:
            return
        if job.on_progress:
            job.on_progress(event)

    @Slot(object, str)
    def _on_text(self, job: Job, piece: str) -> None:
        if self._closed:
            return
        if job.on_text:
            job.on_text(piece)

    @Slot(object)
    def _on_memory(self, report: MemoryReport) -> None:
        if self._closed:
            return
        self.last_memory = report
        self.memory.emit(report)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        if self._closed:
            return
        self.model = info
        self.model_loaded.emit(info)

    @Slot(object, object)
    def _on_done(self, job: Job, result: Any) -> None:
        if self._closed:
            return
        self._finish(job)
        if job.on_done:
            job.on_done(result)

    @Slot(object, object)
    def _on_failed(self, job: Job, error: JobError) -> None:
        if self._closed:
            return
        self._finish(job)
        if job.on_error:
            job.on_error(error)

    def _finish(self, job: Job) -> None:
        if job in self._pending:
            self._pending.remove(job)
        if self.current is job:
            self.current = None
        if not self._pending:
            self.busy_changed.emit(False)
