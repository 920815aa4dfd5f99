"""Index first in the window, on the real default model: a document the cache cannot keep whole is
answerable as soon as its index exists; its whole read runs in the background, pauses for a
question and goes on after it; once read, questions recall from its saved reading."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from test_app import SMALL, ask, home, make_window, wait_open  # noqa: E402,F401,F811  (fixtures)
from test_span_recall import COMBINATION, QUESTION, book  # noqa: E402

READ_TIMEOUT_MS = 600_000


def long_notes(tmp_path):
    """The span-recall book as a text file, three times over (~6k tokens, ~24 chunks of 256) with
    the combination in the first copy: the whole read outlasts a question."""
    text = "\n\n".join(segment.text for segment in book().segments)
    filler = text.replace("combination of the observatory safe", "colour of the harbour crane")
    path = tmp_path / "logbook.txt"
    path.write_text("\n\n".join([text, filler, filler]), encoding="utf-8")
    return path


def test_a_question_asked_during_the_background_read_is_answered_first(make_window, qtbot, tmp_path):
    window = make_window(SMALL.replace(max_new_tokens=16))
    started: list[str] = []
    window.client.job_started.connect(lambda job: started.append(job.name))
    window.open_path(str(long_notes(tmp_path)))
    wait_open(qtbot, window, read=False)
    assert window.state.report.unread and window.background_read.running
    ask(qtbot, window, QUESTION)
    doc_id = window.state.open_id
    first = [m for m in window.library.messages(doc_id) if m.role == "assistant"][-1]
    assert COMBINATION in first.text and json.loads(first.recall_json)["reread"] is True and not first.prefix_hit
    qtbot.waitUntil(lambda: not window.background_read.running, timeout=READ_TIMEOUT_MS)
    assert [name for name in started if name in ("open", "read", "ask")] == ["open", "read", "ask", "read"]
    qtbot.waitUntil(lambda: not window.client.busy, timeout=60_000)
    assert window.library.document(doc_id).prefix_key in window.cache_status.keys
    ask(qtbot, window, QUESTION)
    second = [m for m in window.library.messages(doc_id) if m.role == "assistant"][-1]
    assert COMBINATION in second.text and json.loads(second.recall_json)["reread"] is False


def test_esc_stops_the_answer_first_then_the_background_read_and_questions_still_re_read(make_window, qtbot, tmp_path):
    window = make_window(SMALL.replace(max_new_tokens=200))
    window.open_path(str(long_notes(tmp_path)))
    wait_open(qtbot, window, read=False)
    assert window.background_read.running
    ask(qtbot, window, "Describe every page of the logbook in detail.", wait=False)
    qtbot.waitUntil(lambda: window.client.current is not None and window.client.current.name == "ask", timeout=120_000)
    window.cancel_work()  # Esc while the answer streams: the answer stops, the read goes on
    qtbot.waitUntil(lambda: window.state.live is None, timeout=60_000)
    qtbot.waitUntil(lambda: window.client.current is not None and window.client.current.name == "read", timeout=60_000)
    assert window.background_read.running and "whole read was stopped" not in window.statusBar().currentMessage()
    window.cancel_work()  # Esc again: the read stops
    qtbot.waitUntil(lambda: not window.background_read.running and not window.client.busy, timeout=60_000)
    assert "whole read was stopped" in window.statusBar().currentMessage()
    ask(qtbot, window, QUESTION)
    answer = [m for m in window.library.messages(window.state.open_id) if m.role == "assistant"][-1]
    assert COMBINATION in answer.text and json.loads(answer.recall_json)["reread"] is True
    assert not answer.prefix_hit, "no saved reading exists to have been reused"


def test_before_the_background_read_the_window_says_how_long_it_takes_and_that_it_can_be_cancelled(make_window, qtbot,
                                                                                                   tmp_path):
    """Issue 32 (window, second pass), item 6: once a document opened index first is answerable,
    before its whole read has got far, the header and the status line say in plain words how long
    that read will take here, that questions can be asked now and that the read can be cancelled;
    once cancelled, the header no longer offers to."""
    from app.units import fmt_duration

    window = make_window(SMALL)
    window.open_path(str(long_notes(tmp_path)))
    wait_open(qtbot, window, read=False)
    report = window.state.report
    assert report.unread and window.background_read.running
    assert report.read_plan is not None and report.read_plan.tokens == report.document_tokens
    took = f"about {fmt_duration(report.read_plan.seconds)}"
    header, status = window.header.info.text(), window.statusBar().currentMessage()
    for line in (header, status):
        assert "ask now" in line.lower() and "cancel" in line.lower(), line
    # issue 44: one time estimate, the header's; the status line gave the plan's figure beside it
    assert took in header and "about" not in status, status
    window.cancel_work()
    qtbot.waitUntil(lambda: not window.background_read.running and not window.client.busy, timeout=60_000)
    header = window.header.info.text()
    assert "cancel" not in header.lower() and "read was stopped" in header, header
