"""Driving the real window without a model: documents read by the real readers and added to its
library as an open adds them, answers streamed through the real worker thread and answer stream as
if the model had written them, tooltips shown as a hovering mouse shows them, and a named pipe that
tells whether anything opened it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from app.changes import Changes
from app.library_panel import ID_ROLE
from app.window import MainWindow
from app.worker import Job
from engine.answer import Answer, StopReason
from engine.attended import AttendedSpan
from engine.documents import Document
from engine.errors import ModelError

ANSWER_TIMEOUT_MS = 30_000


def no_model(_settings):
    """The model factory of a window that never loads one: an open fails where the model loads."""
    raise ModelError("no model in this test")


def window_without_model(qtbot, library=None) -> MainWindow:
    """A shown window whose worker has no model, its start-up job done."""
    window = MainWindow(model_factory=no_model, load_model=False, library=library)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: not window.client.busy, timeout=30_000)
    return window


def add_document(window: MainWindow, path: Path | str, document: Document) -> int:
    """`document` (read from `path`) in the library as an open adds it; returns its id."""
    files = len(document.segments) if document.kind == "repo" else None
    document_id = window.library.upsert_document(path=str(path), title=document.title, kind=document.kind,
                                                 pages=document.pages, files=files)
    window.changed.emit(Changes(library=True))
    return document_id


def notes_and_other(qtbot, folder: Path) -> tuple[MainWindow, int, int]:
    """A window without a model whose library holds two text files written into `folder`, the
    first ("notes.txt") selected: (window, its id, the other's id)."""
    from engine.documents import load_document

    notes = folder / "notes.txt"
    notes.write_text("Revenue rose 12 % in 2024.\n", encoding="utf-8")
    other = folder / "other.txt"
    other.write_text("Nothing here.\n", encoding="utf-8")
    window = window_without_model(qtbot)
    other_id = add_document(window, other, load_document(other))
    document_id = add_document(window, notes, load_document(notes))
    pick(window, document_id)
    return window, document_id, other_id


def pick(window: MainWindow, document_id: int) -> None:
    """Click a document in the library list (the panel emits `selected`)."""
    items = [window.library_panel.list.item(row) for row in range(window.library_panel.list.count())]
    window.library_panel.list.setCurrentItem(next(item for item in items if item.data(ID_ROLE) == document_id))


def hover(window: MainWindow, document_id: int) -> str:
    """Rest the mouse on a library row: the tooltip Qt shows for it (its text as given)."""
    view = window.library_panel.list
    item = next(view.item(row) for row in range(view.count()) if view.item(row).data(ID_ROLE) == document_id)
    at = view.visualItemRect(item).center()
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.Type.ToolTip, at, view.viewport().mapToGlobal(at)))
    QApplication.processEvents()
    shown = QToolTip.text()
    QToolTip.showText(QPoint(), "")
    return shown


def stream_answer(qtbot, window: MainWindow, document_id: int, question: str, text: str, *, pieces: int = 4,
                  passages: list[AttendedSpan] | None = None, mean_logprob: float = 0.0) -> float:
    """Ask `question` about the shown document and stream `text` in `pieces` as its answer, as
    `app.ask_flow` does with the model's (`passages`: what it attended; `mean_logprob`: how sure
    it was of its words); returns the seconds until the answer was shown whole."""
    window.library.add_message(document_id, "user", question)
    window.chat.add_question(question)
    message_id = window.library.add_message(document_id, "assistant", "", state="streaming", source="local")
    step = max(1, -(-len(text) // pieces))

    def write(workspace, ctx):
        for at in range(0, len(text), step):
            ctx.text(text[at:at + step])
        return workspace.outcome(Answer(question, text, token_ids=[], prompt_tokens=0, time_to_first_token_s=0.0,
                                        decode_tokens_per_s=0.0, prefix_hit=False, stop_reason=StopReason.END,
                                        mean_logprob=mean_logprob, passages=list(passages or [])))

    job = Job("ask", write, title="Answering…")
    window.answers.start(job, document_id=document_id, message_id=message_id, question=question, source="local")
    began = time.monotonic()
    window.client.submit(job)
    qtbot.waitUntil(lambda: window.state.live is None, timeout=ANSWER_TIMEOUT_MS)
    return time.monotonic() - began


class Probe:
    """A named pipe at `path` and a writer process that waits for readers: `opened` says whether
    anything opened the pipe to read (Qt reading an image it names, say). Nothing blocks: for each
    reader the writer marks that it came, hands over a few bytes that are no image and closes (Qt
    tries a failed image again at the next layout). A process, not a thread: Qt holds Python's lock
    while it reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._marker = path.with_name(path.name + ".opened")
        os.mkfifo(path)
        # A reader that closes before reading all would end the writer with SIGPIPE.
        serve = 'trap "" PIPE; while :; do exec 3>"$0"; : > "$1"; printf "no image" >&3; exec 3>&-; done'
        self._writer = subprocess.Popen(["sh", "-c", serve, str(path), str(self._marker)])

    @property
    def opened(self) -> bool:
        return self._marker.exists()

    def close(self) -> None:
        """Stop the writer and remove the pipe (a later read finds no file instead of waiting)."""
        self._writer.kill()
        self._writer.wait(timeout=10)
        self.path.unlink()
