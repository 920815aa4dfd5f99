"""Issue 44, what a fresh trial in a real window still found in the source pane: a .docx paragraph
cut at the pane's right edge (prose did not wrap), the pane kept ~310 px wide when the window
grew, and a zoom chosen in one document carried over to the next."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from app.source_pane import SourcePane  # noqa: E402
from engine.documents import load_document  # noqa: E402
from pdf_fixtures import helvetica_book  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import window_without_model  # noqa: E402

LONG_PARAGRAPH = ("The kestrel hovers over the meadow while the wind turns, and the farmers in the valley "
                  "watch it from the road that runs along the river to the old mill and the bridge beyond. ") * 3


def test_a_docx_paragraph_wraps_at_the_pane_and_code_scrolls_sideways(qtbot, tmp_path):
    import docx

    path = tmp_path / "report.docx"
    document = docx.Document()
    document.add_paragraph("Kestrel report")
    document.add_paragraph(LONG_PARAGRAPH)
    document.save(path)
    read = load_document(path)
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(420, 600)
    pane.show()
    pane.show_segment(read, 0, [])
    qtbot.wait(50)
    view = pane.code
    block = next(b for b in _blocks(view) if b.text().startswith("The kestrel hovers"))
    assert block.layout().lineCount() > 3, "the paragraph wraps at the pane's width"
    assert view.horizontalScrollBar().maximum() == 0, "nothing to scroll sideways: no line is cut"

    code = tmp_path / "wide.py"
    code.write_text("def wide():\n    return '" + "x" * 300 + "'\n", encoding="utf-8")
    pane.show_segment(load_document(code), 0, [])
    qtbot.wait(50)
    assert all(b.layout().lineCount() == 1 for b in _blocks(view)), "code keeps its lines"
    assert view.horizontalScrollBar().maximum() > 0, "a code line wider than the pane scrolls sideways"


def _blocks(view):
    block = view.document().firstBlock()
    while block.isValid():
        yield block
        block = block.next()


def test_the_pane_takes_a_fair_share_of_a_wide_window(qtbot, home, tmp_path):
    pdf = helvetica_book(tmp_path / "atlas.pdf", [["The atlas opens here."], ["Its second page."]])
    document = load_document(pdf)
    window = window_without_model(qtbot)
    window.resize(1100, 720)
    qtbot.waitUntil(lambda: window.width() == 1100)
    window.store.pane_width = 310  # as the last, smaller window left it
    window.sources.open_pane()
    window.source_pane.show_segment(document, 0, [])
    qtbot.wait(100)
    window.resize(1920, 1080)
    qtbot.waitUntil(lambda: window.width() == 1920)
    qtbot.wait(100)
    assert window.source_pane.width() >= 0.45 * 1920, window.splitter.sizes()
    assert window.conversation.question.width() >= 300

    window.source_pane.close_button.click()  # opened again in the wide window: still a fair share
    window.sources.open_pane()
    qtbot.wait(100)
    assert window.source_pane.width() >= 0.45 * 1920, window.splitter.sizes()
    window.close()


def test_each_document_opens_at_fit_width_and_a_zoom_stays_with_its_document(qtbot, tmp_path):
    first = load_document(helvetica_book(tmp_path / "atlas.pdf", [["The atlas opens here."], ["Its second page."]]))
    second = load_document(helvetica_book(tmp_path / "ledger.pdf", [["The ledger opens here."], ["Its last page."]]))
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(500, 700)
    pane.show()
    pane.show_segment(first, 0, [])
    fit = pane.page_label.pixmap().width()
    pane.zoom_in_button.click()
    pane.zoom_in_button.click()
    zoomed = pane.page_label.pixmap().width()
    assert zoomed > fit
    pane.show_segment(first, 1, [])
    assert pane.page_label.pixmap().width() == zoomed, "within a document the chosen zoom stays"

    pane.show_segment(second, 0, [])
    assert pane.zoom == 1.0 and pane.page_label.pixmap().width() == fit, "another document opens at fit-width"
    pane.clear()
    pane.show_segment(first, 0, [])
    assert pane.zoom == 1.0, "back in the first document: fit-width again, as any newly shown document"
