"""Only what a PDF viewer shows is page text, and all of it: layers switched off (B24 in
docs/REAL_WORLD_INPUTS.md), annotations and form values without appearance streams (B27), words
hyphenated at line ends (B28); the corpus cases and siblings made like them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdf_fixtures import _stream, helvetica_pdf, write_pdf

from engine.documents import load_document
from engine.documents.hyphenation import join_hyphenated_lines
from engine.documents.text import normalize_text
from engine.text_index import rank

FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


def bug(corpus: Path, case: str) -> Path:
    return next((corpus / "bugs").glob(f"{case}-*"))


# --------------------------------------------------------------------------------------- B28

def test_b28_words_hyphenated_at_line_ends_are_joined_for_the_index(corpus):
    document = load_document(bug(corpus, "B28") / "hyphen.pdf")
    text = document.segments[0].text
    assert text == "The committee reviewed the document\nand asked for more information\nabout the budget."
    other = "The budget committee met on Tuesday and approved the plan."
    scores = rank([other, text], "Which document needs information?")
    assert scores[1] > 0 and scores[1] > scores[0]


JOINS = {  # a page's text: what it becomes
    "German": ("Das Doku-\nment ist über-\nprüft.", "Das Dokument\nist überprüft."),
    "Russian": ("Это доку-\nмент для инфор-\nмации.", "Это документ\nдля информации."),
    "Greek": ("Η Ελλη-\nνική γλώσσα", "Η Ελληνική\nγλώσσα"),
    "French, punctuation after": ("une infor-\nmation, puis", "une information,\npuis"),
    "soft hyphen": ("the docu\u00ad\nment", "the document"),
    "HYPHEN U+2010": ("the docu\u2010\nment is", "the document\nis"),
    "compound inside a line": ("a well-known fact", "a well-known fact"),
    "compound seen elsewhere": ("a well-known fact, a well-\nknown one", "a well-known fact, a well-known\none"),
    "joined form seen elsewhere": ("e-mail or e-\nmail, email", "e-mail or email,\nemail"),
    "capital after the hyphen": ("Mercedes-\nBenz drove", "Mercedes-Benz\ndrove"),
    "compound before the break": ("state-of-\nthe-art tools", "state-of-the-art\ntools"),
    "digits": ("COVID-\n19 cases", "COVID-\n19 cases"),
    "dash after a space": ("the plan -\nwhich failed", "the plan -\nwhich failed"),
    "paragraph break": ("the docu-\n\nment", "the docu-\n\nment"),
    "different scripts": ("Latin-\nкириллица", "Latin-кириллица"),
}


@pytest.mark.parametrize("case", sorted(JOINS))
def test_line_end_hyphenation_is_joined_and_compounds_keep_their_hyphen(case):
    text, expected = JOINS[case]
    joined = join_hyphenated_lines([text])[0]
    assert joined == expected
    assert normalize_text(joined) == joined and join_hyphenated_lines([joined])[0] == joined


def test_a_compound_on_another_page_keeps_the_hyphen_at_a_line_end():
    pages = join_hyphenated_lines(["a well-known fact", "another well-\nknown fact"])
    assert pages == ["a well-known fact", "another well-known\nfact"]


def test_hyphenated_words_of_a_pdf_page_are_joined_and_its_compounds_kept(tmp_path):
    """PDFium marks the break (U+FFFE); a compound the page has on one line keeps its hyphen."""
    pdf = helvetica_pdf(tmp_path / "de.pdf", b"BT /F1 12 Tf 14 TL 72 720 Td (Der well-known Bericht ist ein Doku-) Tj T* "
                        b"(ment der Verwaltung, well-) Tj T* (known und gepr\xfcft.) Tj ET")
    text = load_document(pdf).segments[0].text
    assert text == "Der well-known Bericht ist ein Dokument\nder Verwaltung, well-known\nund geprüft."
