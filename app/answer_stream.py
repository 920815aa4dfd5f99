"""One answer's way from the worker to the chat history: its pieces stream into the chat and the
progress panel (decode speed, time left), its text is saved every SAVE_PARTIAL_EVERY_S (a crash
keeps what arrived), and at the end its record (decided by the workspace: `AnswerOutcome.record`)
replaces the streaming row. Closing the window mid-answer saves what arrived (the cancelled result normally still arrives and
is saved as "cancelled"; if the worker does not stop in time, the row is marked "interrupted").

The window starts an answer (`start`) and hears how it ended (`ended(live, outcome, error)`): it
does what follows (the escalation the outcome carries, a banner). One answer streams at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.chat import ChatView
from app.notices import ProgressPanel
from app.units import fmt_duration
from app.worker import Job, JobError
from engine.answer import StopReason
from engine.errors import ErrorKind
from engine.library import Library
from engine.progress import Phase, Progress
from engine.workspace import AnswerOutcome

SAVE_PARTIAL_EVERY_S = 2.0


@dataclass
class LiveAnswer:
    """The answer being streamed: where it goes in the history, and how fast it comes."""

    job: Job
    document_id: int
    message_id: int
    question: str
    source: str                     # "local" or "cloud"
    text: str = ""
    pieces: int = 0
    saved_at: float = 0.0
    first_piece_at: float | None = None

    def progress_text(self, max_new_tokens: int) -> str:
        """"Answering… 37 tokens so far · 12.3 tokens/s · at most 18 s left" (a local answer stops at
        `max_new_tokens`, so that bounds the decode time left; a cloud answer has no such bound)."""
        what = "Cloud answer" if self.source == "cloud" else "Answering"
        text = f"{what}… {self.pieces} tokens so far"
        if self.first_piece_at is None or self.pieces < 2:
            return text
        elapsed = time.monotonic() - self.first_piece_at
        if elapsed <= 0:
            return text
        rate = (self.pieces - 1) / elapsed
        text += f" · {rate:,.1f} tokens/s"
        if self.source != "cloud" and rate > 0:
            text += f" · at most {fmt_duration(max(0, max_new_tokens - self.pieces) / rate)} left"
        return text


class AnswerStream(QObject):
    """Streams one answer at a time into `chat`, `progress` and `library` (GUI thread only).

    `max_new_tokens()`: the longest local answer now (the settings can change between two answers).
    Signal `ended(live, outcome, error)`: `outcome` is the workspace's `AnswerOutcome` (None when
    the user declined to send to the cloud, or on error), `error` the JobError or None."""

    ended = Signal(object, object, object)
    rereading = Signal(int)   # percent of the chosen pages re-read before the answer's first word

    def __init__(self, library: Library, chat: ChatView, progress: ProgressPanel, *,
                 max_new_tokens: Callable[[], int], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.library, self.chat, self.progress = library, chat, progress
        self._max_new_tokens = max_new_tokens
        self.live: LiveAnswer | None = None
        self._shown = False     # the chat shows the live answer's document

    def start(self, job: Job, *, document_id: int, message_id: int, question: str, source: str) -> None:
        """Route `job`'s text and result here; the caller submits it."""
        self.live = LiveAnswer(job, document_id, message_id, question, source, saved_at=time.monotonic())
        job.on_text = self.on_text
        job.on_progress = lambda event: self._progress(job, event)
        job.on_done = lambda outcome: self._finish(job, outcome, None)
        job.on_error = lambda error: self._finish(job, None, error)
        self.chat.begin_answer("Halaman · cloud" if source == "cloud" else "Halaman")
        self._shown = True

    def detach(self) -> None:
        """The chat moves to another document (or this one is removed) while the answer streams: it
        is still saved, but no longer drawn."""
        if self.live is not None and self._shown:
            self.chat.drop_answer()
        self._shown = False

    def on_text(self, piece: str) -> None:
        live = self.live
        if live is None:
            return
        now = time.monotonic()
        if live.first_piece_at is None:
            live.first_piece_at = now
        live.text += piece
        live.pieces += 1
        if self._shown:
            self.chat.append_text(piece)
        self.progress.show_answering(live.progress_text(self._max_new_tokens()))
        if now - live.saved_at > SAVE_PARTIAL_EVERY_S:
            self.library.update_message(live.message_id, text=live.text)
            live.saved_at = now

    def _progress(self, job: Job, event: Progress) -> None:
        """Before the first word, a local answer re-reads the pages it chose (a document not read
        whole yet): shown in the progress panel instead of a silent "Answering…"."""
        live = self.live
        if live is None or live.job is not job or event.phase is not Phase.REREADING or live.pieces:
            return
        self.progress.show_rereading(event)
        self.rereading.emit(100 * event.done // max(event.total, 1))

    def save_partial(self) -> None:
        """Save what has arrived so far (before the worker is stopped)."""
        if self.live is not None and self.library.message(self.live.message_id) is not None:
            self.library.update_message(self.live.message_id, text=self.live.text)

    def interrupt(self) -> None:
        """The worker did not deliver the answer's end before the window closed: keep what arrived as
        "interrupted"."""
        if self.live is not None and self.library.message(self.live.message_id) is not None:
            self.library.update_message(self.live.message_id, text=self.live.text, state="interrupted")
            self.live = None

    def _finish(self, job: Job, outcome: AnswerOutcome | None, error: JobError | None) -> None:
        live = self.live
        if live is None or live.job is not job:
            return
        self.live = None
        if error is not None and error.kind is ErrorKind.CANCELLED:
            fields = dict(text=live.text, state="cancelled", stop_reason=StopReason.CANCELLED)
        elif error is not None:
            fields = dict(text=(live.text + "\n\n" if live.text else "") + f"_{error.message}_", state="error",
                          stop_reason=StopReason.ERROR)
        elif outcome is None:  # the user declined to send it to the cloud
            fields = dict(text=live.text or "_(not sent)_", state="cancelled", stop_reason=StopReason.CANCELLED)
        else:
            fields = outcome.record.fields()
        if self.library.message(live.message_id) is not None:  # None: its document was removed meanwhile
            self.library.update_message(live.message_id, **fields)
            if self._shown:
                self.chat.finish_answer(self.library.message(live.message_id))
        self._shown = False
        self.ended.emit(live, outcome, error)
