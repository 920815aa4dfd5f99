"""The window's document state in one small object: which library document the chat shows, which
one is open in the engine, which path is being read (and by which job), the open document itself,
and the answer being streamed. The open flow (`app.open_flow`), the settings flow
(`app.settings_flow`) and the window report into it (`reading`, `opened`, `read_ended`,
`reopening`, `removed`, `show`) and then say what changed (`app.changes`); everything else reads it
(`ready`, `is_open`, `being_read`, `document_jobs`) instead of comparing five fields by hand.

GUI thread only, like the widgets that show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.answer_stream import AnswerStream, LiveAnswer
from app.worker import Job
from engine.documents import Document
from engine.library import DocumentRecord
from engine.open_document import OpenReport


@dataclass
class DocumentState:
    """Where the documents are, for the window.

    current: the library document the chat shows (None: nothing, or a new file being read).
    open_id: the library id of the document open in the engine, ready for questions.
    opening: the path being read; open_job: the job reading it (a replaced read's results are
    ignored: `opened` and `read_ended` say whether a job is still the one that counts).
    open_path: the path of the document open in the engine. report / document: what its open
    returned (`report` stays after the document closes, for the header). `answers`: where the
    answer being streamed lives (`live`)."""

    answers: AnswerStream
    current: DocumentRecord | None = None
    open_id: int | None = None
    opening: str | None = None
    open_job: Job | None = None
    open_path: str | None = None
    report: OpenReport | None = None
    document: Document | None = None
    segments: dict[str, str] = field(default_factory=dict)  # citation label -> text of the open document
    # What was open before the read now under way replaced it (`kept_open`): (open_id, open_path, report, document, segments).
    _kept: tuple | None = field(default=None, repr=False)

    # -------------------------------------------------------------- reports
    def show(self, record: DocumentRecord | None) -> None:
        """The chat now shows `record` (it is not read until opened)."""
        self.current = record

    def reading(self, path: str, record: DocumentRecord | None, job: Job) -> None:
        """`job` reads `path` (`record`: its library row, if it has one): it replaces whatever was
        open or being read, and the chat shows it. What was open is remembered until the read ends
        (`kept_open`): the engine closes it only once the new file has been read."""
        if self.open_id is not None:
            self._kept = (self.open_id, self.open_path, self.report, self.document, self.segments)
        elif self.opening is not None:  # a read replaced mid-way may have closed it in the engine already
            self._kept = None
        self.opening, self.open_job, self.current = path, job, record
        self.open_id = self.open_path = self.document = None
        self.segments = {}

    def kept_open(self) -> bool:
        """The read that replaced the open document failed before the engine closed that one
        (`engine.session.DocumentSession.open` reads the new file first): it is the open document
        again, as it was. False when nothing was open before (or it was already given back)."""
        kept, self._kept = self._kept, None
        if kept is None or self.opening is not None or self.open_id is not None:
            return False
        self.open_id, self.open_path, self.report, self.document, self.segments = kept
        return True

    def opened(self, job: Job, doc_id: int, path: str, report: OpenReport, document: Document) -> bool:
        """`job` has read its document (library id `doc_id`). False when a newer read replaced it."""
        if job is not self.open_job:
            return False
        self.opening = self.open_job = self._kept = None
        self.open_id, self.open_path, self.report, self.document = doc_id, path, report, document
        self.segments = {s.label: s.text for s in document.segments}
        return True

    def read_ended(self, job: Job) -> bool:
        """`job` failed or was cancelled. False when a newer read replaced it (then nothing changes)."""
        if job is not self.open_job:
            return False
        self.opening = self.open_job = None
        return True

    def reopening(self, path: str) -> tuple[str | None, int | None]:
        """A settings change will read `path` again: no question until it is open. Returns what to
        give `reopen_failed` if the change is refused."""
        before = (self.opening, self.open_id)
        self.opening, self.open_id = path, None
        return before

    def reopen_failed(self, path: str, before: tuple[str | None, int | None]) -> bool:
        """The settings change that was to read `path` again was refused: nothing will reopen it,
        so the state goes back to `before` (unless another read started meanwhile). True if it did."""
        if (self.opening, self.open_id) != (path, None) or self.open_job is not None:
            return False
        self.opening, self.open_id = before
        return True

    def removed(self, doc_id: int) -> None:
        """The library document `doc_id` is gone."""
        if self._kept is not None and self._kept[0] == doc_id:
            self._kept = None
        if doc_id == self.open_id:
            self.open_id = self.open_path = self.document = None
            self.segments = {}
        if self.current is not None and self.current.id == doc_id:
            self.current = None

    # -------------------------------------------------------------- queries
    @property
    def live(self) -> LiveAnswer | None:
        """The answer being streamed, if any."""
        return self.answers.live

    def is_open(self, record: DocumentRecord | None) -> bool:
        """`record` is the document open in the engine."""
        return record is not None and record.id == self.open_id

    def being_read(self, record: DocumentRecord | None) -> bool:
        """`record` is the document being read now."""
        return record is not None and self.opening == record.path

    @property
    def ready(self) -> bool:
        """A question can be asked: the chat shows the open document, nothing is read or answered."""
        return self.is_open(self.current) and self.opening is None and self.live is None

    @property
    def library_ready(self) -> bool:
        """A question to the whole library can be asked: the chat shows a library document (it
        holds the question until the answer says which document it belongs to), nothing is read or
        answered. No document needs to be open: the library question opens its own."""
        return self.current is not None and self.opening is None and self.live is None

    @property
    def engine_path(self) -> str | None:
        """The path the engine has open, or is reading."""
        return self.open_path if self.open_id is not None else self.opening

    def document_jobs(self) -> list[Job]:
        """The jobs that belong to the document: its read and the answer being streamed (what a new
        document, or a settings change that reopens it, cancels)."""
        return [job for job in (self.open_job, self.live.job if self.live else None) if job is not None]
