"""The window opens office documents as it opens PDFs (issue 41): a deck dropped on it is read,
listed in the library, offered by File › Open, and a citation of "slide 2" shows that slide's
text in the source pane, titled with the unit."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported

import pytest  # noqa: E402

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from format_files import make_pptx  # noqa: E402
from test_app import ask, drop, home, make_window, wait_open  # noqa: E402,F401  (fixtures)


def test_the_file_dialog_offers_office_documents_e_books_and_tables():
    from app.window import OPEN_FILTER

    documents = OPEN_FILTER.split(";;")[0]
    for suffix in ("*.docx", "*.docm", "*.pptx", "*.xlsx", "*.ods", "*.tsv", "*.epub", "*.odt", "*.odp", "*.rtf"):
        assert f" {suffix}" in documents, suffix


def test_a_dropped_deck_opens_and_a_slide_citation_shows_the_slide(make_window, qtbot, tmp_path):
    deck = make_pptx(tmp_path / "quarterly.pptx", slides=3)
    window = make_window()
    assert drop(window, deck).isAccepted()
    wait_open(qtbot, window)
    record = window.library.find(str(deck.resolve()))
    assert record is not None and record.kind == "pptx" and record.size_text == "PPTX file"
    assert {"slide 1", "slide 2", "slide 3"} <= set(window.state.segments)
    window.show_citation("slide 2")
    pane = window.source_pane
    assert pane.isVisible() and pane.page is None
    assert "quarterly.pptx" in pane.title.text() and "slide 2" in pane.title.text()
    assert "Sales by region" in pane.code.toPlainText() and "North | 99" in pane.code.toPlainText()


def test_an_answer_from_a_scanned_page_says_its_evidence_is_recognised_text(make_window, qtbot, tmp_path):
    """A scanned PDF (a page image, no text layer) is read by OCR; the answer's footer says that
    its cited page is recognised text, as `halaman ask` prints it. A PDF with a text layer gets no
    such note."""
    from scan_fixtures import scan_image, scan_pdf
    from test_documents_ocr import LEASE

    scan = scan_pdf(tmp_path / "lease-scan.pdf", [scan_image(LEASE)])
    window = make_window()
    window.open_path(str(scan))
    wait_open(qtbot, window)
    assert window.state.document.recognised_pages == [1]
    ask(qtbot, window, "What is the monthly rent of the harbour warehouse?")
    record = window.library.find(str(scan.resolve()))
    answer = window.library.messages(record.id)[-1]
    assert [s.page for s in answer.sources] == [1], answer.sources
    shown = window.chat.toPlainText()
    assert "page 1 is recognised text (OCR): check the wording against the page image" in shown, shown
    assert shown.strip().splitlines()[-1].startswith("answered here"), shown  # the footer stays last

    typed = scan_pdf(tmp_path / "lease-typed.pdf", [LEASE])
    window.open_path(str(typed))
    wait_open(qtbot, window)
    assert window.state.document.recognised_pages == []
    ask(qtbot, window, "What is the monthly rent of the harbour warehouse?")
    assert "recognised text (OCR)" not in window.chat.toPlainText()
