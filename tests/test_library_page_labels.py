"""Issue 44's trial: a library answer cited "[title, page 68]" for the page printed "48", while one
document's answer names it "page 48 (PDF page 68)". A library question over a PDF whose
/PageLabels (written by pypdf) number its front matter i, ii, iii and its body from 1 cites the
page as printed, and the physical page stays the key a click opens."""

from __future__ import annotations

import pytest

from engine.documents import load_document
from engine.open_library import OpenLibrary
from engine.prefix_store import PrefixStore
from test_library_ask import other_book
from test_page_labels import labelled
from test_span_recall import NEEDLE_PAGE, QUESTION, book, settings

FRONT = 3  # pages i, ii, iii: the needle's page 17 is printed "14"


@pytest.fixture
def store(tmp_path):
    return PrefixStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2)


def test_a_library_answer_cites_the_page_as_printed(smol, store, tmp_path):
    pages = [_lines(segment.text) for segment in book().segments]
    document = load_document(labelled(tmp_path / "observatory.pdf", pages, front=FRONT))
    printed = f"page {NEEDLE_PAGE - FRONT} (PDF page {NEEDLE_PAGE})"
    assert document.shown_labels()[f"page {NEEDLE_PAGE}"] == printed
    library = OpenLibrary(smol, settings(), store)
    try:
        library.add(other_book("harbour records", 1))
        library.add(document)
        answer = library.ask(QUESTION).answer
    finally:
        library.close()
    # the page the answer attended to most (the model may word the answer otherwise: what is
    # checked is how the page is named)
    cited = next((s for s in answer.sources if s.page == NEEDLE_PAGE), None)
    assert cited is not None, answer.sources
    assert cited.label == f"page {NEEDLE_PAGE}"  # the key: the physical page, which a click opens
    assert cited.cited_name == f"{document.title}, {printed}", cited.cited_name


def _lines(text: str, words: int = 12) -> list[str]:
    """`text` in lines that fit a Letter page's width in 10 pt Helvetica (a longer one is cut)."""
    split = text.split()
    return [" ".join(split[i:i + words]) for i in range(0, len(split), words)]
