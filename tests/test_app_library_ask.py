"""Asking the whole library from the window, on the real default model (issue 30): with "Ask all
documents" ticked, a question about a library of three text files is answered from the one that
holds the answer, whichever document the chat showed; the answer names the documents it was asked
across, its first source names that document, clicking it shows that file in the source pane with
the answer's line marked, and the question and answer are kept in that document's history, where
the source still opens after a restart. Unticked, a question is asked of the open document as before."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

from pathlib import Path  # noqa: E402
from urllib.parse import quote  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from engine.documents import load_document  # noqa: E402
from test_app import anchors, ask, home, make_window, wait_open  # noqa: E402,F401,F811  (fixtures)
from test_library_ask import other_book  # noqa: E402
from test_span_recall import COMBINATION, QUESTION, settings  # noqa: E402
from window_driver import add_document, pick  # noqa: E402

NEEDLE = f"The combination of the observatory safe is {COMBINATION}."


def library_files(folder: Path) -> list[Path]:
    """Three text files of the span-recall book's kind of prose, one sentence a line; only the
    second ("beacon.txt") holds the combination, on its line 9."""
    paths = []
    for name, seed, note in (("almanac", 1, None), ("beacon", 2, (2, NEEDLE)), ("cellar", 3, None)):
        text = "\n".join(line for segment in other_book(name, seed, pages=3, note=note).segments
                         for line in segment.text.replace(". ", ".\n").splitlines())
        path = folder / f"{name}.txt"
        path.write_text(text + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def click_link(qtbot, view, href: str) -> None:
    """Click the link `href` in a chat view, where it is drawn."""
    cursor = view.textCursor()
    cursor.setPosition(anchors(view)[href] + 1)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center())


def test_asking_all_documents_answers_from_the_one_that_holds_it_and_keeps_it_there(make_window, qtbot, tmp_path):
    almanac, beacon, cellar = library_files(tmp_path)
    window = make_window(settings())
    ids = [add_document(window, path, load_document(path)) for path in (almanac, beacon, cellar)]
    pick(window, ids[0])  # the chat shows the almanac, which is not even open
    assert not window.conversation.question.isEnabled(), "unticked, a document that is not open cannot be asked"
    window.conversation.ask_all.setChecked(True)
    ask(qtbot, window, QUESTION)

    kept = window.library.messages(ids[1])
    assert [m.role for m in kept] == ["user", "assistant"] and kept[0].text == QUESTION
    assert window.library.messages(ids[0]) == [], "moved to the document the answer read first"
    answer = kept[1]
    assert answer.state == "done" and COMBINATION in answer.text, answer.text
    assert answer.text.startswith("Asked across 3 documents; read beacon.txt")
    first = answer.sources[0]
    assert (first.document, first.document_source, first.label) == ("beacon.txt", str(beacon), "beacon.txt")
    assert window.state.current.id == ids[1], "the chat follows the answer to its document"

    assert "Attended: [beacon.txt] (" in window.chat.toPlainText(), "a library answer's source names its document"
    href = f"cite:{quote('beacon.txt')}#{answer.id}"
    click_link(qtbot, window.chat, href)
    pane = window.source_pane
    qtbot.waitUntil(pane.isVisible, timeout=10_000)
    qtbot.waitUntil(lambda: window.sources.shown_id == ids[1], timeout=10_000)
    shown = load_document(beacon).segments[0].text  # the file as the model read it
    assert pane.code.toPlainText() == shown
    needle_line = beacon.read_text(encoding="utf-8").splitlines().index(NEEDLE) + 1
    assert needle_line in pane.marked_lines, (needle_line, pane.marked_lines, pane.passages)
    assert pane.passages and all(p.document_source == str(beacon) for p in pane.passages)
    window.close()

    # After a restart the stored answer's source still opens the beacon, not the document shown.
    again = make_window(settings())
    pick(again, ids[1])
    click_link(qtbot, again.chat, href)
    qtbot.waitUntil(lambda: again.source_pane.isVisible() and again.sources.shown_id == ids[1], timeout=10_000)
    assert again.source_pane.code.toPlainText() == shown
    assert needle_line in again.source_pane.marked_lines


def test_unticked_a_question_is_asked_of_the_open_document_as_before(make_window, qtbot, tmp_path):
    almanac, beacon, cellar = library_files(tmp_path)
    window = make_window(settings())
    for path in (almanac, cellar):
        add_document(window, path, load_document(path))
    window.open_path(str(beacon))
    wait_open(qtbot, window)
    assert not window.conversation.ask_all.isChecked()
    started: list[str] = []
    window.client.job_started.connect(lambda job: started.append(job.name))
    ask(qtbot, window, QUESTION)
    messages = window.library.messages(window.state.open_id)
    assert started == ["ask"] and [m.role for m in messages] == ["user", "assistant"]
    assert COMBINATION in messages[1].text and not messages[1].text.startswith("Asked across")
    assert messages[1].sources and all(s.document is None for s in messages[1].sources)


def test_a_stored_library_answer_opens_each_source_in_its_own_document_with_its_own_highlights(qtbot, home, tmp_path):
    """No model: a library answer kept with the almanac whose source is in the beacon opens the
    beacon's file with the beacon's passage only, and stays shown when the library refreshes."""
    import json

    from app.changes import Changes
    from engine.answer import Source
    from engine.attended import AttendedSpan
    from window_driver import window_without_model

    almanac, beacon, _cellar = library_files(tmp_path)
    window = window_without_model(qtbot)
    almanac_id, beacon_id = (add_document(window, path, load_document(path)) for path in (almanac, beacon))
    shown = load_document(beacon).segments[0].text
    at = shown.index(NEEDLE)
    passages = [AttendedSpan(0, "almanac.txt", None, None, 0, 20, 0.4, str(almanac)),
                AttendedSpan(0, "beacon.txt", None, None, at, at + len(NEEDLE), 0.6, str(beacon))]
    sources = [Source("beacon.txt", 0.6, document="beacon.txt", document_source=str(beacon)),
               Source("almanac.txt", 0.4, document="almanac.txt", document_source=str(almanac))]
    window.library.add_message(almanac_id, "user", QUESTION)
    message_id = window.library.add_message(
        almanac_id, "assistant", f"Asked across 3 documents; read beacon.txt, almanac.txt.\n\nIt is {COMBINATION}.",
        source="local", sources_json=json.dumps([s.__dict__ for s in sources]),
        passages_json=json.dumps([p.__dict__ for p in passages]))
    pick(window, almanac_id)
    assert "Attended: [beacon.txt] (60 %) · [almanac.txt] (40 %)" in window.chat.toPlainText()
    click_link(qtbot, window.chat, f"cite:{quote('beacon.txt')}#{message_id}")
    pane = window.source_pane
    qtbot.waitUntil(lambda: pane.isVisible() and pane.code.toPlainText() == shown, timeout=10_000)
    assert pane.passages == [passages[1]] and pane.marked_lines == [shown[:at].count("\n") + 1]
    window.changed.emit(Changes(library=True))  # e.g. the saved readings' status came back
    assert pane.code.toPlainText() == shown and pane.passages == [passages[1]], "not emptied: it is this chat's answer"
    assert window.library.messages(beacon_id) == []
