"""Progress before the first word (issue 44): a question about a document not read whole yet
re-reads the pages it chose before its first word (11-65 s on two busy cores); the window says so
with a percentage ("Reading the chosen pages… 40 %") instead of a silent "Answering…", from the
engine's progress (`Phase.REREADING`), reaching 100 % before the answer streams."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from engine.progress import Phase  # noqa: E402
from engine.session import DocumentSession  # noqa: E402
from test_app import SMALL, ask, home, make_window, wait_open  # noqa: E402,F401,F811  (fixtures)
from test_app_index_first import long_notes  # noqa: E402
from test_span_recall import COMBINATION, QUESTION  # noqa: E402


def test_an_answer_that_re_reads_its_pages_reports_how_far_before_its_first_word(smol, tmp_path):
    session = DocumentSession(smol, SMALL.replace(max_new_tokens=8))
    session.open(str(long_notes(tmp_path)), read_now=False)  # index first: no archive to recall from
    events, first_word = [], []
    answer = session.ask(QUESTION, progress=events.append, on_text=lambda piece: first_word.append(len(events)))
    assert answer.recall is not None and answer.recall.reread
    assert events and all(e.phase is Phase.REREADING and e.unit == "tokens" for e in events)
    assert [e.done for e in events] == sorted(e.done for e in events) and events[0].done > 0
    assert events[-1].done == events[-1].total and len(events) >= 2, events
    assert first_word and first_word[0] == len(events), "every progress event comes before the first word"


def test_the_window_shows_the_re_read_with_a_percentage_before_the_first_word(make_window, qtbot, tmp_path):
    window = make_window(SMALL.replace(max_new_tokens=16))
    window.open_path(str(long_notes(tmp_path)))
    wait_open(qtbot, window, read=False)
    assert window.state.report.unread
    percents: list[int] = []
    labels: list[str] = []
    window.answers.rereading.connect(percents.append)
    window.answers.rereading.connect(lambda _p: labels.append(window.progress.label.text()))
    ask(qtbot, window, QUESTION)
    answer = [m for m in window.library.messages(window.state.open_id) if m.role == "assistant"][-1]
    assert COMBINATION in answer.text and json.loads(answer.recall_json)["reread"] is True
    assert percents and min(percents) > 0 and percents[-1] == 100 and percents == sorted(percents), percents
    assert labels[0].startswith("Reading the chosen pages… ") and labels[-1].startswith("Reading the chosen pages… 100 %"), labels
