"""Asking about the open document, from the ask bar to what follows the answer: the question and
an empty answer row in the history, the job in the worker (`app.operations.ask_local` /
`ask_cloud`), the answer streamed by `app.answer_stream`, and then the escalation to the cloud the
workspace decided (`AnswerOutcome.escalation`) or a banner. It reads the window's `DocumentState`
and says when the history changed (`app.changes`): the ask bar waits while an answer streams.

With "Ask all documents" ticked, the question goes to the library's documents
(`app.operations.ask_library`). It is kept in the chat shown while it streams; once the answer
says which documents it read, question and answer move to the first one's history (where they
stay across restarts, and where their sources open), and the chat follows them there.
"""

from __future__ import annotations

from pathlib import Path

from app import operations as ops
from app.answer_stream import LiveAnswer
from app.changes import Changes
from app.worker import JobError
from engine.errors import ErrorKind
from engine.evidence.conversation import ASKED_AS_FOLLOW_UP
from engine.workspace import AnswerOutcome


class AskFlow:
    """Questions for `window` (a `MainWindow`: its conversation, library, client and `state`)."""

    def __init__(self, window) -> None:
        self.window = window
        self._library_question: dict[int, int] = {}  # a library answer's message id -> its question's
        window.answers.ended.connect(self._answer_ended)
        window.conversation.ask_all.toggled.connect(lambda _on: window.changed.emit(Changes()))  # the ask bar

    def ask(self, question: str | None = None, follow_up: bool | None = None) -> None:
        """Ask the local model (the question box's text when `question` is None)."""
        conversation = self.window.conversation
        if question is None:
            question = conversation.question.text().strip()
        if conversation.ask_all.isChecked():
            self.ask_library(question)
            return
        if follow_up is None:  # neither ticked: the engine decides from the question's words
            follow_up = conversation.follow_up_choice()
        self._ask(question, cloud=False, follow_up=follow_up)

    def ask_library(self, question: str) -> None:
        """Ask the library's documents whose files are still there (`Workspace.ask_library`)."""
        w, state = self.window, self.window.state
        if not question or not state.library_ready:
            return
        paths = [record.path for record in w.library.documents() if Path(record.path).exists()]
        doc_id = state.current.id
        w.conversation.take_question()
        question_id = w.library.add_message(doc_id, "user", question)
        w.chat.add_question(question)
        model = w.client.model
        message_id = w.library.add_message(doc_id, "assistant", "", state="streaming", source="local",
                                           model=model.label if model else None)
        self._library_question[message_id] = question_id
        job = ops.ask_library(question, paths)
        w.answers.start(job, document_id=doc_id, message_id=message_id, question=question, source="local")
        w.changed.emit(Changes(history=True))
        w.background_read.pause_for_question()
        w.client.submit(job)

    def ask_cloud(self, question: str | None = None) -> None:
        """Ask the cloud endpoint: the typed question, or the last one asked."""
        typed = question if question is not None else self.window.conversation.question.text().strip()
        self._ask(typed or self._last_question(), cloud=True, reason="user asked")

    def _ask(self, question: str, *, cloud: bool, follow_up: bool | None = False, reason: str = "user asked",
             escalation: bool = False) -> None:
        """Ask locally or in the cloud; `escalation`: the cloud answers the question just answered
        locally (the question is not repeated in the chat)."""
        w, state = self.window, self.window.state
        if not question or state.open_id is None or state.live is not None or state.opening:
            return
        doc_id = state.open_id
        if not escalation:
            w.conversation.take_question()
            w.conversation.reset_new_question()
            if not cloud:  # the last answer's "Continued from …" must not stand beside this one
                first = follow_up is None and not self._asked_before(doc_id, None)
                w.statusBar().showMessage(ANSWERING_FIRST if first else asking_text(follow_up))
            w.library.add_message(doc_id, "user", question)
            w.chat.add_question(question)
        settings, model = w.settings, w.client.model
        model_name = settings.cloud.model if cloud else (model.label if model else None)
        message_id = w.library.add_message(
            doc_id, "assistant", "", state="streaming", source="cloud" if cloud else "local",
            endpoint=settings.cloud.base_url if cloud else None, model=model_name, reason=reason if cloud else None,
        )
        job = ops.ask_cloud(question, reason=reason) if cloud else ops.ask_local(question, follow_up=follow_up)
        w.answers.start(job, document_id=doc_id, message_id=message_id, question=question,
                        source="cloud" if cloud else "local")
        w.changed.emit(Changes(history=True))
        w.background_read.pause_for_question()  # the answer comes next; the read goes on after it
        if not cloud and not escalation and follow_up is None and self._asked_before(doc_id, message_id):
            # its words decide whether it continues the last question: the engine says which way first
            w.client.submit(ops.follow_up_decision(question, follow_up=None,
                                                   on_done=lambda why: self._decided(message_id, why)))
        w.client.submit(job)

    def _decided(self, message_id: int, why: str) -> None:
        """The engine decided whether the question being answered (`message_id`'s) continues the
        last one: the status line says which, while it is answered."""
        live, w = self.window.state.live, self.window
        if live is not None and live.message_id == message_id and not w.closed:
            w.statusBar().showMessage(asking_text(None, why))

    def _asked_before(self, document_id: int, message_id: int | None) -> bool:
        """Whether the chat of `document_id` holds an answer before `message_id`'s (a first question
        continues nothing: no decision to wait for)."""
        return any(m.role == "assistant" and m.id != message_id for m in self.window.library.messages(document_id))

    def _answer_ended(self, live: LiveAnswer, outcome: AnswerOutcome | None, error: JobError | None) -> None:
        """What follows an answer: the escalation to the cloud the workspace decided, or a banner."""
        w = self.window
        question_id = self._library_question.pop(live.message_id, None)
        if outcome is not None and outcome.documents and question_id is not None:
            self._keep_with(outcome.documents[0], live, question_id)
        w.changed.emit(Changes(history=True))
        if w.closed:
            return
        said = self._which_way(live, outcome) if outcome is not None and not outcome.documents else ""
        if said:
            w.statusBar().showMessage(said, 15000)
        elif w.statusBar().currentMessage().startswith("Answering"):  # a first question's: it is answered now
            w.statusBar().clearMessage()
        if outcome is not None and outcome.escalation:
            self._ask(live.question, cloud=True, reason=outcome.escalation, escalation=True)
        elif error is not None and error.kind is ErrorKind.OOM:
            w.banner.show_message("error", error.message, "Lower the budget and retry",
                                  lambda: w.settings_flow.lower_budget_and_retry(w.state.engine_path),
                                  document_id=live.document_id)
        elif error is not None and error.kind is not ErrorKind.CANCELLED:
            w.banner.show_message("error", f"Could not answer: {error.message}", document_id=live.document_id)

    def _which_way(self, live: LiveAnswer, outcome: AnswerOutcome) -> str:
        """The status text that says whether an answer went on from the last question, and why, or
        started afresh ('' for a first question, and for a cloud answer, which is sent no conversation)."""
        continues = outcome.answer.continues
        if continues == ASKED_AS_FOLLOW_UP:
            return "Continued from your last question (Follow-up is ticked)."
        if continues:
            return (f"Continued from your last question ({continues}); tick New question to start afresh, "
                    "or Follow-up to always continue.")
        answers = [m for m in self.window.library.messages(live.document_id) if m.role == "assistant"]
        if live.source != "local" or len(answers) < 2:
            return ""
        return "Answered as a new question: it did not continue your last one (tick Follow-up to continue it)."

    def _keep_with(self, path: str, live: LiveAnswer, question_id: int) -> None:
        """Move a library answer and its question to the history of the document at `path` (the
        first it read), and show that document's chat if the chat showed the question's."""
        w = self.window
        record = w.library.find(path)
        if record is None or record.id == live.document_id or w.library.message(live.message_id) is None:
            return
        for message_id in (question_id, live.message_id):
            w.library.update_message(message_id, document_id=record.id)
        if w.state.current is not None and w.state.current.id == live.document_id and not w.closed:
            w.select_document(record.id)
            w.statusBar().showMessage(f"The answer is kept with {record.title}, the document it read first.", 8000)

    def _last_question(self) -> str:
        current = self.window.state.current
        if current is None:
            return ""
        for message in reversed(self.window.library.messages(current.id)):
            if message.role == "user":
                return message.text
        return ""


ANSWERING_FIRST = "Answering your question…"
"""The status line while a document's first question is answered: it continues nothing."""


def asking_text(follow_up: bool | None, why: str | None = None) -> str:
    """The status line from the moment a local question is asked until its answer says which way
    it went (`AskFlow._which_way`): what the user chose, or, with neither box ticked, what the
    engine decided from its words (`why`: its reason to continue, "" afresh, None not known yet).
    The last answer's "Continued from your last question" stayed there while a New question was
    answered."""
    if follow_up is True:
        return "Answering as a follow-up: it continues your last question (Follow-up is ticked)."
    if follow_up is False:
        return "Answering as a new question: it does not continue your last one (New question was ticked)."
    if why:
        return f"Answering as a follow-up to your last question ({why}); tick New question to start afresh."
    if why == "":
        return "Answering as a new question: it does not continue your last one (tick Follow-up to continue it)."
    return "Answering: whether it continues your last question is decided from its words."
