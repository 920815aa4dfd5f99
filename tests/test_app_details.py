"""The trial's rough edges in the real window (issue 32, minor items), each as a user met it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

from importlib import metadata  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from engine.documents import load_document  # noqa: E402
from test_app import home, make_window, pick, text_doc, wait_open  # noqa: E402,F401  (fixtures)
from window_driver import add_document, window_without_model  # noqa: E402


def test_the_follow_up_box_starts_unticked_for_another_document(qtbot, home, tmp_path):
    """Item 13: a follow-up continues the conversation shown; ticked for one document, it must not
    carry over to the next one's first question."""
    window = window_without_model(qtbot)
    first, second = text_doc(tmp_path, "first.txt"), text_doc(tmp_path, "second.txt")
    first_id = add_document(window, first, load_document(first))
    second_id = add_document(window, second, load_document(second))
    pick(window, first_id)
    window.conversation.follow_up.setChecked(True)
    pick(window, first_id)  # the same document again: still ticked
    assert window.conversation.follow_up.isChecked()
    pick(window, second_id)
    assert not window.conversation.follow_up.isChecked()
    window.close()


def test_about_says_which_version_is_installed():
    """Item 13: Help › About names the version."""
    from app.dialogs import about_text

    assert f"<b>Halaman</b> {metadata.version('halaman')}<br>" in about_text()


def test_typing_while_another_document_is_read_stays_in_the_question_box(make_window, qtbot, tmp_path):
    """Item 9: the question box had the keyboard when a second read began; it was disabled, the
    keyboard went to a button, and a typed space opened the Open dialog. Now the next question
    can be typed while the document is read, and only Ask waits for it."""
    window = make_window()
    window.open_path(str(text_doc(tmp_path)))
    wait_open(qtbot, window)
    window.activateWindow()
    question = window.conversation.question
    question.setFocus()
    qtbot.waitUntil(question.hasFocus, timeout=5_000)
    long = tmp_path / "long.txt"
    long.write_text("The quick brown fox jumps over the lazy dog near the river bank. " * 300, encoding="utf-8")
    window.open_path(str(long))
    assert window.state.opening is not None
    assert QApplication.focusWidget() is question, QApplication.focusWidget()
    qtbot.keyClicks(question, "What does the fox do")
    qtbot.keyClick(question, Qt.Key.Key_Return)  # not sent while the document is read
    assert window.state.live is None and question.text() == "What does the fox do"
    assert not window.conversation.ask_button.isEnabled() and QApplication.activeModalWidget() is None
    window.cancel_work()
    # The notes open again (a cancelled read reopens what it replaced) and, index first, are read
    # whole in the background.
    qtbot.waitUntil(lambda: window.state.opening is None and not window.client.busy, timeout=120_000)
    assert QApplication.activeModalWidget() is None
    window.close()


def test_the_source_pane_empties_when_the_chat_moves_to_another_document(qtbot, home, tmp_path):
    """Item 6: a page stays in the pane only beside its own document's chat; another document
    shown, or a new one being read, empties it."""
    window = window_without_model(qtbot)
    first, second = text_doc(tmp_path, "first.txt"), text_doc(tmp_path, "second.txt")
    first_id = add_document(window, first, load_document(first))
    second_id = add_document(window, second, load_document(second))
    pane = window.source_pane

    def show_first() -> None:
        pick(window, first_id)
        window.chat.citation_clicked.emit("first.txt", None)
        qtbot.waitUntil(lambda: pane.isVisible() and "first.txt" in pane.title.text(), timeout=20_000)
        assert pane.code.toPlainText()

    show_first()
    pick(window, second_id)
    assert pane.isVisible() and pane.empty and "first.txt" not in pane.title.text() and pane.code.toPlainText() == ""
    assert not pane.next_button.isEnabled() and "Click a page or file" in pane.note.text()
    show_first()
    window.open_path(str(text_doc(tmp_path, "third.txt")))  # a new document read (it fails here: no model)
    assert pane.empty and "first.txt" not in pane.title.text()
    window.close()


def test_with_the_source_pane_open_the_window_fits_a_small_screen_and_the_memory_text_is_not_clipped(qtbot, home, tmp_path):
    """Item 7: with the pane open the window could not be narrower than 1,266 px, so a citation
    widened a 1,024 px window off a small screen; the memory panel clipped its text."""
    from PySide6.QtWidgets import QLabel

    from engine.kvcache.cache import MemoryBreakdown
    from engine.memory import MemoryReport

    window = window_without_model(qtbot)
    window.resize(1024, 700)
    path = text_doc(tmp_path)
    document_id = add_document(window, path, load_document(path))
    pick(window, document_id)
    window.chat.citation_clicked.emit(path.name, None)
    qtbot.waitUntil(lambda: window.source_pane.isVisible() and path.name in window.source_pane.title.text(), timeout=20_000)
    assert window.minimumSizeHint().width() <= 1024 and window.width() == 1024
    window.gauge.set_report(MemoryReport("cpu", 400 << 20, MemoryBreakdown(codes_bytes=37 << 20, residual_bytes=1 << 20),
                                         150 << 20, 16 << 30, 9 << 30, 48 << 20))
    side = window.splitter.sizes()[0]
    window.splitter.setSizes([window.splitter.widget(0).minimumSizeHint().width(), *window.splitter.sizes()[1:]])
    qtbot.waitUntil(lambda: window.splitter.sizes()[0] < side or side <= 300, timeout=5_000)
    for label in window.memory_panel.findChildren(QLabel):
        if label.isVisible() and label.text():
            assert label.wordWrap() or label.sizeHint().width() <= label.width(), label.text()
    window.close()


def test_a_reads_numbers_stay_out_of_another_documents_header(make_window, qtbot, tmp_path):
    """Item 13: while one document is read, the header of another one the user looks at showed the
    read's token count and memory estimate as if they were its own. (Recall off: the read comes
    before any question, as for every document that index first cannot answer from its pages.)"""
    from test_app import SMALL

    window = make_window(SMALL.replace(recall=SMALL.recall.replace(recall_tokens=0)))
    notes = text_doc(tmp_path)
    window.open_path(str(notes))
    wait_open(qtbot, window)
    notes_id = window.state.open_id
    long = tmp_path / "long.txt"
    long.write_text("The quick brown fox jumps over the lazy dog near the river bank. " * 300, encoding="utf-8")
    window.open_path(str(long))
    pick(window, notes_id)  # looked at while the long one is read
    assert window.header.title.text() == "notes.txt"
    qtbot.waitUntil(lambda: window.progress.label.text().startswith("Reading the document:")
                    and window.progress.bar.maximum() > 1000, timeout=60_000)  # the long one's prefill
    total = window.progress.bar.maximum()
    assert f"{total:,} tokens" not in window.header.info.text(), window.header.info.text()
    assert window.header.title.text() == "notes.txt"
    window.cancel_work()
    qtbot.waitUntil(lambda: window.state.opening is None and not window.client.busy, timeout=10_000)
    window.close()


def test_a_short_document_kept_whole_still_shows_what_its_answer_attended(make_window, qtbot, tmp_path):
    """Item 4: a document small enough to be kept whole is never recalled, and its answers had no
    "Attended:" line and no highlights: click-to-check disappeared exactly for short documents."""
    from test_app import SMALL, ask

    window = make_window(SMALL.replace(cache=SMALL.cache.replace(budget_tokens=1024)))  # room for the notes and a question
    notes = text_doc(tmp_path)
    window.open_path(str(notes))
    wait_open(qtbot, window)
    ask(qtbot, window, "When is the meeting?")
    answer = window.library.messages(window.state.open_id)[-1]
    assert "off" in answer.recall, "kept whole: nothing recalled"
    assert [source.label for source in answer.sources] == ["notes.txt"] and answer.passages
    assert "Attended: notes.txt (100 %)" in window.chat.toPlainText().splitlines()
    window.chat.citation_clicked.emit("notes.txt", answer.id)
    pane = window.source_pane
    qtbot.waitUntil(lambda: pane.isVisible() and "notes.txt" in pane.title.text(), timeout=10_000)
    assert pane.marked_lines == [1] and pane.passages
    window.close()


def test_loading_says_the_model_is_converted_only_when_it_is(qtbot, smol, tmp_path, monkeypatch):
    """Item 13: "(the first start converts it once)" was shown at every start, converted or not."""
    from app.notices import ProgressPanel
    from engine.models.loader import conversion_pending
    from engine.progress import CONVERTING_MODEL_UNIT, Phase, Progress

    assert not conversion_pending("default"), "the session's model was converted here already"
    assert not conversion_pending("HuggingFaceTB/SmolLM2-360M-Instruct") and not conversion_pending("/no/such.gguf")
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "fresh"))
    assert conversion_pending("default"), "a fresh cache has no converted copy"
    panel = ProgressPanel()
    qtbot.addWidget(panel)
    panel.show_event(Progress(Phase.LOADING_MODEL, 0, 0, "model"))
    assert panel.label.text().startswith("Loading the model") and "convert" not in panel.label.text()
    panel.show_event(Progress(Phase.LOADING_MODEL, 0, 0, CONVERTING_MODEL_UNIT))
    assert "its first start converts it, once" in panel.label.text()
    panel.finish()
