"""Issue 44, item 3: banners belong to their document, and opening another document says that
the first one's background read stopped (it stopped silently)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("PySide6")

from app import operations as ops  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import notes_and_other, pick  # noqa: E402


def test_a_documents_banner_goes_when_the_chat_shows_another_and_an_apps_banner_stays(qtbot, home, tmp_path):
    window, notes_id, other_id = notes_and_other(qtbot, tmp_path)
    window.banner.show_message("error", "Could not answer: the model ran out of memory", document_id=notes_id)
    assert window.banner.isVisible()
    pick(window, other_id)
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=2000)

    window.banner.show_message("error", "Could not load the model: no model in this test")  # about the app
    pick(window, notes_id)
    qtbot.wait(50)
    assert window.banner.isVisible() and "Could not load the model" in window.banner.text

    window.banner.show_message("warning", "Note: page 3 has no text layer", document_id=notes_id)
    pick(window, other_id)
    pick(window, notes_id)
    assert not window.banner.isVisible(), "a document's old banner does not come back over its chat either"


def test_opening_another_document_says_that_the_background_read_stopped(qtbot, home, tmp_path):
    window, notes_id, other_id = notes_and_other(qtbot, tmp_path)
    read = window.background_read
    read.path = str(tmp_path / "notes.txt")
    read.job = ops.read_document(pause=threading.Event())  # a read under way, 37 % done
    read.share = 0.37
    window.open_path(str(tmp_path / "other.txt"))
    assert window.banner.isVisible()
    assert "Reading notes.txt whole stopped at 37%" in window.banner.text
    assert "goes on from there" in window.banner.text
    assert read.job is None
