"""A "New question" control (issue 44): the window lets the user say the next question does not
continue the last one, whatever its words; it is sent as `follow_up=False`, unticked again once
asked, and the status bar says which way each answer went."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from test_app import ask, home, make_window, wait_open  # noqa: E402,F401  (fixtures)
from test_app_source_pane import book_pdf  # noqa: E402
from test_span_recall import QUESTION, settings  # noqa: E402

REFERS_BACK = "What else does it say about it?"


def test_new_question_starts_afresh_once_and_the_status_says_which_way_each_answer_went(make_window, qtbot, tmp_path):
    window = make_window(settings())
    window.open_path(str(book_pdf(tmp_path)))
    wait_open(qtbot, window)
    conversation = window.conversation
    assert conversation.new_question.isVisible() and conversation.new_question.isEnabled()
    ask(qtbot, window, QUESTION)

    ask(qtbot, window, REFERS_BACK)  # nothing ticked: its words ("it") continue the last question
    assert window.statusBar().currentMessage().startswith("Continued from your last question ("), \
        window.statusBar().currentMessage()

    conversation.follow_up.setChecked(True)
    conversation.new_question.setChecked(True)  # the two exclude each other
    assert not conversation.follow_up.isChecked()
    ask(qtbot, window, REFERS_BACK)  # the same words, asked as a new question
    assert window.statusBar().currentMessage().startswith("Answered as a new question"), \
        window.statusBar().currentMessage()
    assert not conversation.new_question.isChecked(), "New question is for one question only"
    assert conversation.follow_up_choice() is None

    ask(qtbot, window, REFERS_BACK)  # unticked again: the engine decides from the words once more
    assert window.statusBar().currentMessage().startswith("Continued from your last question"), \
        window.statusBar().currentMessage()
