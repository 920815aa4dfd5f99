"""The trial's rough edges in the real window (issue 32, minor items), each as a user met it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from engine.documents import load_document  # noqa: E402
from test_app import home, pick, text_doc  # noqa: E402,F401  (fixture)
from window_driver import add_document, window_without_model  # noqa: E402


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
