"""The changes broadcast (`app.changes`, `app.panel_refresh`): an operation says once what it
changed, on the window's `changed` signal, and the panels it names redraw themselves from it; a
panel that shows none of the named fields is left alone. A real window, offscreen, with the
embedded model for the open and the answer."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.changes import Changes  # noqa: E402
from app.window import MainWindow  # noqa: E402
from engine.documents import load_document  # noqa: E402
from engine.settings import save_settings  # noqa: E402
from test_app import ANSWER_TIMEOUT_MS, SMALL, ask, text_doc, wait_open  # noqa: E402
from window_driver import window_without_model  # noqa: E402


@pytest.fixture
def isolated_home(tmp_path, monkeypatch, memory_keyring):
    """A HALAMAN_HOME of its own, with small, fast settings saved in it."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    save_settings(SMALL)


@pytest.fixture
def window(qtbot, smol, isolated_home):
    """A shown window on the session's embedded model, its model loaded and its worker idle."""
    window = MainWindow(model_factory=lambda _settings: smol)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.client.model is not None and not window.client.busy, timeout=60_000)
    yield window
    window.close()


def heard(window: MainWindow) -> list[Changes]:
    """Every value the window emits from now on (connected after the panels: they have redrawn
    by the time one is recorded)."""
    values: list[Changes] = []
    window.changed.connect(values.append)
    return values


def test_an_open_and_an_answer_each_say_once_what_changed_and_the_panels_follow(window, qtbot, tmp_path):
    values = heard(window)
    window.open_path(str(text_doc(tmp_path)))
    # The open's start, then the worker becoming busy with it: one value each.
    assert values == [Changes(shown=True, reading=True), Changes(busy=True)]
    assert (window.header.title.text(), window.header.info.text()) == ("notes.txt", "Reading…")
    assert window.conversation.question.placeholderText().startswith("Reading the document")
    assert not window.conversation.ask_button.isEnabled() and window.action_cancel.isEnabled()
    assert window.library_panel.list.currentItem().text().startswith("notes.txt\nreading")

    wait_open(qtbot, window)
    qtbot.waitUntil(lambda: not window.client.busy)
    # Two operations: the open (index first, the notes are answerable) and their whole read's end.
    assert [value for value in values if value.library and value.shown] == [Changes(shown=True, reading=True, library=True),
                                                                            Changes(shown=True, library=True)]
    row = window.library_panel.list.currentItem()
    assert row.text().startswith("notes.txt\n") and "reading" not in row.text() and row.font().bold()
    assert window.header.title.text() == "notes.txt" and window.header.open_button.isHidden()
    assert window.conversation.question.placeholderText() == "Ask about notes.txt…"
    assert window.conversation.ask_button.isEnabled() and not window.action_cancel.isEnabled()

    values.clear()
    ask(qtbot, window, "When is the meeting?", wait=False)
    assert values[0] == Changes(history=True)
    assert window.conversation.question.placeholderText() == "Answering… (Esc to stop)"
    assert not window.conversation.ask_button.isEnabled()
    qtbot.waitUntil(lambda: window.state.live is None, timeout=ANSWER_TIMEOUT_MS)
    assert values.count(Changes(history=True)) == 2  # the answer's start and its end
    assert window.conversation.ask_button.isEnabled()
    assert window.conversation.question.placeholderText() == "Ask about notes.txt…"


def test_each_panel_redraws_only_for_the_fields_it_shows(qtbot, isolated_home, tmp_path):
    window = window_without_model(qtbot)
    notes = text_doc(tmp_path)
    document = load_document(notes)
    doc_id = window.library.upsert_document(path=str(notes), title=document.title, kind=document.kind,
                                            pages=document.pages)
    rows = window.library_panel.list.count
    assert rows() == 0
    window.changed.emit(Changes(settings=True))
    assert rows() == 0, "the library list redrew for a change it does not show"
    window.changed.emit(Changes(library=True))
    assert rows() == 1

    budget = window.memory_panel.budget.text
    shown = budget()
    window.client.settings = window.settings.replace(cache=dataclasses.replace(SMALL.cache, budget_tokens=256))
    window.changed.emit(Changes(library=True))
    assert budget() == shown, "the budget line redrew for a change it does not show"
    window.changed.emit(Changes(settings=True))
    assert budget() != shown and "256 tokens" in budget()

    window.state.show(window.library.document(doc_id))
    window.changed.emit(Changes(model=True))
    assert window.header.title.text() == "No document open"
    window.changed.emit(Changes(shown=True))
    assert window.header.title.text() == "notes.txt" and not window.header.open_button.isHidden()
    assert window.conversation.question.placeholderText() == "Open this document to ask about it"
    assert window.library_panel.list.currentItem().text().startswith("notes.txt\n")
    window.close()
