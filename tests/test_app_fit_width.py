"""The source pane opens at fit-width (issue 44): a cited page fills the pane's width, whatever
the window's size, and stays so as the pane is resized; the zoom buttons go from there."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from engine.documents import load_document  # noqa: E402
from pdf_fixtures import helvetica_book  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import window_without_model  # noqa: E402

SLACK_PX = 4


def page_and_viewport(window) -> tuple[int, int]:
    pane = window.source_pane
    return pane.page_label.pixmap().width(), pane.scroll.viewport().width()


@pytest.mark.parametrize("size", [(800, 600), (1280, 800), (1920, 1080)])
def test_a_cited_page_opens_as_wide_as_the_pane(qtbot, home, tmp_path, size):
    pdf = helvetica_book(tmp_path / "atlas.pdf", [["The atlas opens here."], ["Its second page."]])
    document = load_document(pdf)
    window = window_without_model(qtbot)
    window.resize(*size)
    qtbot.waitUntil(lambda: window.width() == size[0])
    window.sources.open_pane()
    window.source_pane.show_segment(document, 1, [])
    qtbot.wait(300)
    page, viewport = page_and_viewport(window)
    assert abs(page - viewport) <= SLACK_PX, (page, viewport)

    sizes = window.splitter.sizes()  # the user widens the pane: the page follows
    window.splitter.setSizes([sizes[0], sizes[1] - 80, sizes[2] + 80])
    qtbot.wait(300)
    page, viewport = page_and_viewport(window)
    assert abs(page - viewport) <= SLACK_PX, (page, viewport)

    window.source_pane.zoom_in_button.click()
    assert window.source_pane.page_label.pixmap().width() > viewport + SLACK_PX
    window.close()


@pytest.mark.parametrize("size", [(800, 600), (1920, 1080)])
def test_a_citation_clicked_in_a_stored_answer_opens_its_page_at_fit_width(qtbot, home, tmp_path, size):
    from engine.attended import AttendedSpan
    from window_driver import add_document, pick, stream_answer

    river = "The river in the atlas is green."
    pdf = helvetica_book(tmp_path / "atlas.pdf", [["The atlas opens here."], ["Its second page.", river]])
    document = load_document(pdf)
    window = window_without_model(qtbot)
    window.resize(*size)
    qtbot.waitUntil(lambda: window.width() == size[0])
    document_id = add_document(window, pdf.resolve(), document)
    pick(window, document_id)
    start = document.segments[1].text.index(river)
    stream_answer(qtbot, window, document_id, "What colour is the river?", "It is green [page 2].",
                  passages=[AttendedSpan(1, "page 2", 2, None, start, start + len(river), 0.8)])
    message = window.library.messages(document_id)[-1]
    window.sources.show_citation("page 2", message.id)
    qtbot.waitUntil(lambda: window.source_pane.isVisible() and window.source_pane.page == 2, timeout=30_000)
    qtbot.wait(300)
    page, viewport = page_and_viewport(window)
    assert abs(page - viewport) <= SLACK_PX, (page, viewport)
    window.close()
