"""Real-world document inputs (B01, B03, B08 in docs/REAL_WORLD_INPUTS.md) and fixtures made like
them: scripts other than Latin, TrueType fonts without a Unicode map, filled forms, junk before the
PDF header."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdf_fixtures import strip_to_unicode, truetype_pdf

from engine.documents import UnreadableTextError, load_document

GREEK_FIRST_LINE = "Η Ελλάδα είναι χώρα της νοτιοανατολικής Ευρώπης."
LATIN = ["The quarterly report shows steady growth in all regions.",
         "Revenue rose by twelve percent compared with last year."]


def bug(corpus: Path, case: str) -> Path:
    return next((corpus / "bugs").glob(f"{case}-*"))


@pytest.mark.parametrize("name", ["greek-fpdf2.pdf", "greek-raw.pdf"])
def test_b01_greek_pdf_is_read_without_warning(corpus, name):
    document = load_document(bug(corpus, "B01") / name)
    assert len(document.segments) == 1 and document.warnings == []
    assert document.segments[0].text.startswith(GREEK_FIRST_LINE)


@pytest.mark.parametrize("lines", [LATIN, [GREEK_FIRST_LINE]], ids=["latin", "greek"])
def test_truetype_without_to_unicode_is_read_through_the_font_cmap(tmp_path, lines):
    """PDFium prints the glyph ids ("7KHTXDUWHUO\\UHSRUW..."): judged unreliable, so pdfminer.six
    reads the page through the embedded font's cmap, and its text is kept."""
    with_map = truetype_pdf(tmp_path / "with-map.pdf", lines)
    assert load_document(with_map).segments[0].text == "\n".join(lines)
    stripped = strip_to_unicode(with_map, tmp_path / "no-map.pdf")
    assert b"/ToUnicode" not in stripped.read_bytes()
    document = load_document(stripped)
    assert document.segments[0].text == "\n".join(lines) and document.warnings == []


def test_page_is_flagged_only_when_every_extractor_fails(corpus, tmp_path):
    """B01's fpdf2 file without /ToUnicode: its subset font renumbers glyphs, so PDFium and pypdf
    give control characters and pdfminer "(cid:1)": the file is refused with the OCR hint."""
    stripped = strip_to_unicode(bug(corpus, "B01") / "greek-fpdf2.pdf", tmp_path / "greek.pdf")
    with pytest.raises(UnreadableTextError, match="run OCR"):
        load_document(stripped)


def test_b03_filled_form_fields_are_in_the_page_text(corpus):
    document = load_document(bug(corpus, "B03") / "filled-form.pdf")
    page = document.segments[0]
    assert page.page == 1 and "Applicant name:" in page.text
    assert "Jane Q. Example" in page.text and "12,500 EUR" in page.text


@pytest.mark.parametrize("name", ["four-bytes", "utf8-bom"])
def test_b08_pdf_header_after_junk_makes_a_pdf_whatever_the_name(corpus, name):
    document = load_document(bug(corpus, "B08") / name)
    assert document.kind == "pdf"
    assert [s.text for s in document.segments] == ["Statement of account: balance 42.00"]


def test_text_that_mentions_the_pdf_header_stays_text(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# PDF notes\n\nEvery PDF starts with `%PDF-1.7` or an older version.\n")
    assert load_document(notes).kind == "text"
