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


# --------------------------------------------------------------------------------------- B27

@pytest.mark.parametrize("name, shown", [
    ("freetext-no-ap.pdf", ["Page body", "Approved budget: 4200 EUR"]),
    ("form-no-ap.pdf", ["Applicant name:", "Jane Q. Example"]),
    ("freetext-with-ap.pdf", ["Page body", "Approved budget: 4200 EUR"]),
])
def test_b27_annotation_and_form_text_without_appearance_is_page_text(corpus, name, shown):
    document = load_document(bug(corpus, "B27") / name)
    assert len(document.segments) == 1 and document.warnings == []
    assert all(line in document.segments[0].text for line in shown)


def annotated_pdf(path: Path, annotation: bytes, catalog: bytes = b"", extra: tuple[bytes, ...] = ()) -> Path:
    """One page that shows "Page body" and has one annotation (object 6); `catalog` goes into the
    catalog (an /AcroForm), `extra` are objects 7, 8, ..."""
    return write_pdf(path, [
        b"<< /Type /Catalog /Pages 2 0 R " + catalog + b">>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> /Annots [6 0 R] >>",
        _stream(b"BT /F1 12 Tf 72 720 Td (Page body) Tj ET"), FONT, annotation, *extra])


FORM = b"/AcroForm << /Fields [6 0 R] /DR << /Font << /Helv 5 0 R >> >> /DA (/Helv 0 Tf 0 g) >>"
APPEARANCE = _stream(b"BT /Helv 14 Tf 2 12 Td (Drawn from its appearance) Tj ET").replace(
    b"<< ", b"<< /Type /XObject /Subtype /Form /BBox [0 0 468 40] /Resources << /Font << /Helv 5 0 R >> >> ", 1)
ANNOTATIONS = {  # annotation (object 6), catalog entries, more objects: text a viewer shows (None: none)
    "text field, no NeedAppearances": (
        b"<< /Type /Annot /Subtype /Widget /FT /Tx /T (n) /V (Jane Widget) /Rect [180 700 500 730] "
        b"/DA (/Helv 12 Tf 0 g) /F 4 /P 3 0 R >>", FORM, (), "Jane Widget"),
    "combo box": (
        b"<< /Type /Annot /Subtype /Widget /FT /Ch /Ff 131072 /Opt [(Alpha Choice) (Beta)] /T (c) "
        b"/V (Alpha Choice) /Rect [180 700 500 730] /DA (/Helv 12 Tf 0 g) /F 4 /P 3 0 R >>",
        FORM.replace(b"/Fields", b"/NeedAppearances true /Fields"), (), "Alpha Choice"),
    "typewriter": (
        b"<< /Type /Annot /Subtype /FreeText /IT /FreeTextTypeWriter /Rect [72 600 540 640] "
        b"/Contents (Typed on the page) /DA (/Helv 14 Tf 0 0 0 rg) /F 4 >>", b"", (), "Typed on the page"),
    "FreeText without flags": (
        b"<< /Type /Annot /Subtype /FreeText /Rect [72 600 540 640] /Contents (Callout text) "
        b"/DA (/Helv 14 Tf 0 0 0 rg) >>", b"", (), "Callout text"),
    "hidden FreeText": (
        b"<< /Type /Annot /Subtype /FreeText /Rect [72 600 540 640] /Contents (Hidden note) "
        b"/DA (/Helv 14 Tf 0 0 0 rg) /F 2 >>", b"", (), None),
    "NoView FreeText with appearance": (
        b"<< /Type /Annot /Subtype /FreeText /Rect [72 600 540 640] /Contents (Drawn from its appearance) "
        b"/DA (/Helv 14 Tf 0 0 0 rg) /F 32 /AP << /N 7 0 R >> >>", b"", (APPEARANCE,), None),
    "sticky note": (  # a viewer draws its icon; its text only opens in a pop-up
        b"<< /Type /Annot /Subtype /Text /Rect [72 600 92 620] /Contents (Sticky note text) /F 4 >>", b"", (), None),
}


@pytest.mark.parametrize("case", sorted(ANNOTATIONS))
def test_annotation_text_is_page_text_where_a_viewer_draws_it(tmp_path, case):
    annotation, catalog, extra, shown = ANNOTATIONS[case]
    document = load_document(annotated_pdf(tmp_path / "annotated.pdf", annotation, catalog, extra))
    assert document.segments[0].text == "Page body" + (f"\n{shown}" if shown else "")
