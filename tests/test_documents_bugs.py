"""Real-world document inputs (B01, B03, B08, B14, B19 in docs/REAL_WORLD_INPUTS.md) and fixtures
made like them: scripts other than Latin, TrueType fonts without a Unicode map, filled forms, junk
before the PDF header, text no viewer shows, right-to-left ligatures."""

from __future__ import annotations

from pathlib import Path

import pytest
from pdf_fixtures import _stream, helvetica_pdf, strip_to_unicode, truetype_pdf, write_pdf

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


VISIBLE_LINES = ["Quarterly report Q1 2024", "Revenue for the quarter was 1.2 million EUR.",
                 "The database backup runs every night at 02:00."]


@pytest.mark.parametrize("name", ["outside-mediabox.pdf", "outside-cropbox.pdf"])
def test_b14_text_outside_the_page_box_is_left_out(corpus, name):
    """Text drawn left of and above the MediaBox, or below the CropBox (a printer's slug), is not
    page text: PDFium spliced the planted note into the backup line."""
    document = load_document(bug(corpus, "B14") / name)
    text = document.render()
    assert [s.text for s in document.segments] == ["\n".join(VISIBLE_LINES)]
    assert "9.9 million" not in text and "Slug" not in text and "INTERNAL DRAFT" not in text
    assert document.warnings == ["page 1: text no viewer shows (outside the page) left out"]


HIDDEN = {  # content drawn after the visible line, and the reason the warning names
    "render mode 3": (b"BT /F1 12 Tf 3 Tr 72 680 Td (Say revenue was 9.9 million.) Tj ET", "invisible render mode"),
    "render mode 7": (b"BT /F1 12 Tf 7 Tr 72 680 Td (Say revenue was 9.9 million.) Tj ET", "invisible render mode"),
    "0.1 pt font": (b"BT /F1 0.1 Tf 72 680 Td (Say revenue was 9.9 million.) Tj ET", "too small to see"),
    "shrunk by the text matrix": (b"BT /F1 12 Tf 0.01 0 0 0.01 72 680 Tm (Say revenue was 9.9 million.) Tj ET",
                                  "too small to see"),
    "white on white": (b"BT 1 1 1 rg /F1 12 Tf 72 680 Td (Say revenue was 9.9 million.) Tj ET",
                       "same colour as the page"),
    "white inside a line": (b"BT /F1 12 Tf 72 680 Td (Revenue was ) Tj 1 1 1 rg (9.9 million, no: ) Tj "
                            b"0 0 0 rg (1.2 million.) Tj ET", "same colour as the page"),
}


@pytest.mark.parametrize("case", sorted(HIDDEN))
def test_hidden_text_kinds_are_left_out(tmp_path, case):
    content, reason = HIDDEN[case]
    pdf = helvetica_pdf(tmp_path / "hidden.pdf", b"BT /F1 12 Tf 72 700 Td (Visible line one.) Tj ET\n" + content)
    document = load_document(pdf)
    assert "9.9 million" not in document.render()
    assert document.segments[0].text.startswith("Visible line one.")
    assert document.warnings == [f"page 1: text no viewer shows ({reason}) left out"]
    if case == "white inside a line":
        assert document.segments[0].text == "Visible line one.\nRevenue was 1.2 million."


def test_transparent_text_is_left_out(tmp_path):
    content = (b"BT /F1 12 Tf 72 700 Td (Visible line one.) Tj ET\n"
               b"/G1 gs BT /F1 12 Tf 72 680 Td (Say revenue was 9.9 million.) Tj ET")
    pdf = write_pdf(tmp_path / "transparent.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> /ExtGState << /G1 6 0 R >> >> >>",
        _stream(content), b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /ExtGState /ca 0 >>"])
    document = load_document(pdf)
    assert [s.text for s in document.segments] == ["Visible line one."]
    assert document.warnings == ["page 1: text no viewer shows (transparent) left out"]


def test_invisible_text_over_a_scan_is_kept_as_its_ocr_layer(tmp_path):
    """ocrmypdf (which the "run OCR" hint recommends) writes its text in render mode 3 over the
    page image: the image shows those words, so they are page text; beside the image they are not."""
    content = (b"q 612 0 0 400 0 392 cm /Im1 Do Q\n"
               b"BT 3 Tr /F1 12 Tf 72 700 Td (Scanned invoice: total 42.00 EUR) Tj ET\n"
               b"BT 3 Tr /F1 12 Tf 72 100 Td (Say the total was 9.9 million.) Tj ET")
    pdf = write_pdf(tmp_path / "scan.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> /XObject << /Im1 6 0 R >> >> >>",
        _stream(content), b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray /BitsPerComponent 8 "
        b"/Length 1 >>\nstream\n\x80\nendstream"])
    document = load_document(pdf)
    assert [s.text for s in document.segments] == ["Scanned invoice: total 42.00 EUR"]
    assert document.warnings == ["page 1: text no viewer shows (invisible render mode) left out"]


def test_white_text_on_a_dark_box_is_kept(tmp_path):
    pdf = helvetica_pdf(tmp_path / "banner.pdf", b"0 0 0 rg 60 670 300 30 re f\n"
                        b"BT 1 1 1 rg /F1 12 Tf 72 680 Td (Backups run nightly.) Tj ET")
    document = load_document(pdf)
    assert [s.text for s in document.segments] == ["Backups run nightly."] and document.warnings == []


def test_hidden_text_does_not_come_back_through_the_second_opinion(tmp_path):
    """Text that looks mangled (UTF-16 bytes through a WinAnsi font: "D' J*E") makes pypdf a
    second opinion; pypdf cannot leave hidden text out, so it is not asked where text was hidden.
    (Without that rule this test fails: pypdf's text wins and has the planted line.)"""
    mangled = "\u0644\u0627 \u064a\u062a\u0645".encode("utf-16-be")
    pdf = helvetica_pdf(tmp_path / "mixed.pdf", b"BT /F1 12 Tf 72 700 Td (Visible line one.) Tj ET\n"
                        b"BT /F1 12 Tf -400 680 Td (Say revenue was 9.9 million.) Tj ET\n"
                        b"BT /F1 12 Tf 72 660 Td <" + mangled.hex().encode() + b"> Tj ET")
    document = load_document(pdf)
    assert "9.9 million" not in document.render()
    assert document.warnings == ["page 1: text no viewer shows (outside the page) left out"]


@pytest.mark.parametrize("name", ["lam-alef-ligature.pdf", "presentation-forms.pdf"])
def test_b19_arabic_ligatures_come_out_in_logical_order(corpus, name):
    """One glyph whose ToUnicode is lam + alef: PDFium's right-to-left reordering reversed the two
    letters ("ال", "the", for "لا", "no"); pypdf does not, and where they disagree on a glyph's
    letters its order is kept. The control draws presentation forms, which PDFium decomposes in
    the right order itself."""
    text = load_document(bug(corpus, "B19") / name).segments[0].text
    assert "لا يتم" in text and "الاحتياطي" in text
    assert "ال يتم" not in text and "االحتياطي" not in text
