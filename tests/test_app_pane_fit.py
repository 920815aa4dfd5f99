"""Issue 44, what a fresh trial in a real window still found in the source pane: a .docx paragraph
cut at the pane's right edge (prose did not wrap), the pane kept ~310 px wide when the window
grew, and a zoom chosen in one document carried over to the next."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from pdf_fixtures import helvetica_book  # noqa: E402
from test_app import home  # noqa: E402,F401  (fixture)
from window_driver import window_without_model  # noqa: E402

from app.source_pane import SourcePane  # noqa: E402
from engine.attended import AttendedSpan  # noqa: E402
from engine.documents import load_document  # noqa: E402

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
    segment = read.segments[0]
    at = segment.text.index("The kestrel hovers")
    passage = AttendedSpan(0, segment.label, segment.page, segment.path, at, at + len(LONG_PARAGRAPH.strip()), 0.7)
    pane.show_segment(read, 0, [passage])
    qtbot.wait(50)
    view = pane.code
    block = next(b for b in _blocks(view) if b.text().startswith("The kestrel hovers"))
    assert block.layout().lineCount() > 3, "the paragraph wraps at the pane's width"
    assert view.horizontalScrollBar().maximum() == 0, "nothing to scroll sideways: no line is cut"
    view.centerCursor()
    qtbot.wait(50)
    image = view.viewport().grab().toImage()
    geometry = view.blockBoundingGeometry(block).translated(view.contentOffset())
    last_line = block.layout().lineAt(block.layout().lineCount() - 1).rect()
    y = round(geometry.top() + last_line.center().y())
    marked = [image.pixelColor(x, y).blue() < 150 for x in range(round(geometry.left() + last_line.left()) + 2,
                                                                   round(geometry.left() + last_line.right()) - 2)]
    assert marked and sum(marked) > 0.5 * len(marked), "the paragraph's last line is marked too"

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


def test_a_cited_table_page_highlights_its_strongest_rows_not_the_whole_table(qtbot, corpus):
    """The Netflix 10-K's income statement (page 42): an answer read it, every row a little (a
    recalled page), its strongest passage elsewhere, so the page was a source with no passage of
    its own; the run of its rows the engine gave it was the whole table, highlighted evenly. Now
    its strongest rows alone (`engine.attended.COVER_RUNS_MAX`), each drawn over its own line."""
    from engine.attended import (
        COVER_RUNS_MAX,
        attended_spans,
        segment_text_starts,
        units,
    )

    pdf = corpus / "financebench-dev" / "pdfs" / "NETFLIX_2017_10K.pdf"
    document = load_document(pdf)
    table = next(i for i, s in enumerate(document.segments)
                 if "CONSOLIDATED STATEMENTS OF OPERATIONS" in s.text[:300] and "Revenues $ 11,692,713" in s.text)
    summary = next(i for i, s in enumerate(document.segments) if i != table and "Revenues $ 11,692,713" in s.text)
    starts = segment_text_starts(document)
    chars, mass = [], []
    for seg in (summary, table):  # "tokens" of mass 1 at a row's first character in the rendered text
        text = document.segments[seg].text
        for unit in units(text):
            row = text[unit:text.find("\n", unit)]
            strong = row.startswith("Revenues $") and seg == summary   # the answer's passage: 12 tokens
            tokens = 12 if strong else 2 if seg == table and row.startswith(("Revenues $", "Net income $")) else \
                1 if seg == table else 0                                # every row of the table a little
            chars += [starts[seg] + unit] * tokens
            mass += [1.0] * tokens
    passages = attended_spans(mass, chars, 0, document, cover=[table])
    on_table = [p for p in passages if p.segment_index == table]
    assert on_table and len(on_table) <= COVER_RUNS_MAX, on_table

    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(700, 900)
    pane.show()
    pane.show_segment(document, table, passages)
    centres = sorted((r.box[1] + r.box[3]) / 2 for r in pane.rectangles)
    rows = [c for i, c in enumerate(centres) if i == 0 or c - centres[i - 1] > 4]  # a row's boxes within 4 pt
    width, height = pdfium_size(pdf, document.segments[table].page)
    area = sum((r.box[2] - r.box[0]) * (r.box[3] - r.box[1]) for r in pane.rectangles) / (width * height)
    assert pane.rectangles and len(rows) <= COVER_RUNS_MAX, rows
    assert area < 0.02, f"{area:.1%} of the page highlighted"
    quoted = " ".join(p.quote for p in on_table)
    assert "Revenues $ 11,692,713" in quoted and "Cost of revenues" not in quoted


def pdfium_size(pdf, page: int) -> tuple[float, float]:
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(str(pdf))
    try:
        return document[page - 1].get_size()
    finally:
        document.close()


def test_a_stored_run_over_a_whole_table_is_not_highlighted_evenly(qtbot, corpus):
    """An answer stored before: its passage on the income statement is a run of all its rows.
    Which rows it attended is not known, so none is drawn, and the note says why."""
    pdf = corpus / "financebench-dev" / "pdfs" / "NETFLIX_2017_10K.pdf"
    document = load_document(pdf)
    table = next(i for i, s in enumerate(document.segments)
                 if "CONSOLIDATED STATEMENTS OF OPERATIONS" in s.text[:300] and "Revenues $ 11,692,713" in s.text)
    segment = document.segments[table]
    start = segment.text.index("Revenues $")
    end = segment.text.index("Net income $")
    end = segment.text.index("\n", end)
    revenue_row = segment.text.index("\n", start)
    whole = AttendedSpan(table, segment.label, segment.page, None, start, end, 0.2)
    row = AttendedSpan(table, segment.label, segment.page, None, start, revenue_row, 0.1)
    pane = SourcePane()
    qtbot.addWidget(pane)
    pane.resize(700, 900)
    pane.show()
    pane.show_segment(document, table, [whole, row])
    assert pane.rectangles and {r.passage for r in pane.rectangles} == {1}, "only the row, not the run"
    assert "Not highlighted here: 1 over 6 lines long" in pane.note.text(), pane.note.text()
