"""Issue 44's trial, the conversation: the status line kept the last answer's "Continued from your
last question" while a New-question answer was produced, and a question asked after a cancelled
answer was taken as new (the cancelled one was not the previous question any more). The real
embedded model, in the engine and in the window."""

from __future__ import annotations

import os
import threading

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from engine.answer import StopReason  # noqa: E402
from test_app import ask, home, make_window, wait_open  # noqa: E402,F401  (fixtures)
from test_app_source_pane import book_pdf  # noqa: E402
from test_span_recall import NEEDLE_PAGE, QUESTION, book, settings  # noqa: E402

REFERS_BACK = "What else does it say about it?"


def test_a_question_after_a_cancelled_answer_continues_it(smol):
    """The engine: the first answer is cancelled at its first word; "What else does it say about
    it?" still goes on from that question (it refers back) and reads its page again."""
    from engine.session import DocumentSession

    session = DocumentSession(smol, settings().replace(max_new_tokens=64), None)
    session.open(book())
    try:
        cancel = threading.Event()
        cut = session.ask(QUESTION, follow_up=None, on_text=lambda _piece: cancel.set(), cancel=cancel)
        assert cut.stop_reason is StopReason.CANCELLED
        assert cut.recall.spans == (f"page {NEEDLE_PAGE}",)
        again = session.ask(REFERS_BACK, follow_up=None)
        assert "it" in again.continues, again.continues
        assert f"page {NEEDLE_PAGE}" in again.recall.spans, again.recall.spans
    finally:
        session.close()


def test_the_status_follows_the_question_asked_even_after_a_cancelled_answer(make_window, qtbot, tmp_path):
    window = make_window(settings().replace(max_new_tokens=400))
    window.open_path(str(book_pdf(tmp_path)))
    wait_open(qtbot, window)
    status = window.statusBar().currentMessage
    pieces = ask(qtbot, window, "Write a long story about the observatory safe and its combination.", wait=False)
    # a first question continues nothing: no "decided from its words" (the trial: it stayed after the answer)
    assert status() == "Answering your question…", status()
    qtbot.waitUntil(lambda: bool(pieces) or window.state.live is None, timeout=180_000)
    assert pieces and window.state.live is not None, (window.progress.label.text(), window.chat.toPlainText()[-300:])
    window.cancel_work()
    qtbot.waitUntil(lambda: window.state.live is None and not window.client.busy, timeout=30_000)

    ask(qtbot, window, REFERS_BACK, wait=False)  # after the cancelled answer: its words refer back to that question
    qtbot.waitUntil(lambda: "follow-up" in status() or window.state.live is None, timeout=60_000)
    assert status().startswith("Answering as a follow-up to your last question ("), status()
    qtbot.waitUntil(lambda: window.state.live is None, timeout=180_000)
    assert status().startswith("Continued from your last question ("), status()

    window.conversation.new_question.setChecked(True)
    ask(qtbot, window, REFERS_BACK, wait=False)  # while it is answered, the status speaks of this question
    assert not status().startswith("Continued"), status()
    assert "new question" in status(), status()
    window.cancel_work()  # up to 400 tokens: what matters was said while it was answered
    qtbot.waitUntil(lambda: window.state.live is None and not window.client.busy, timeout=30_000)


def test_a_first_answer_leaves_no_answering_status_behind(make_window, qtbot, tmp_path):
    """The trial: after the first answer in each document the status bar still said "Answering:
    whether it continues your last question is decided from its words."."""
    window = make_window(settings().replace(max_new_tokens=24))
    window.open_path(str(book_pdf(tmp_path)))
    wait_open(qtbot, window)
    ask(qtbot, window, QUESTION)
    assert not window.statusBar().currentMessage().startswith("Answering"), window.statusBar().currentMessage()

