"""Issue 44, item 4: a document is named by its title only when the PDF's title names it; an
accession number, a path, a file name or a producer's placeholder gives way to the file name."""

from __future__ import annotations

import pypdf
import pytest

from engine.documents import load_document
from engine.documents.names import shown_title


def pdf_titled(path, title: str | None):
    writer = pypdf.PdfWriter()
    page = writer.add_blank_page(612, 792)
    # One line of real text, so the PDF opens (a text layer).
    font = pypdf.generic.DictionaryObject({
        pypdf.generic.NameObject("/Type"): pypdf.generic.NameObject("/Font"),
        pypdf.generic.NameObject("/Subtype"): pypdf.generic.NameObject("/Type1"),
        pypdf.generic.NameObject("/BaseFont"): pypdf.generic.NameObject("/Helvetica")})
    page[pypdf.generic.NameObject("/Resources")] = pypdf.generic.DictionaryObject({
        pypdf.generic.NameObject("/Font"): pypdf.generic.DictionaryObject({pypdf.generic.NameObject("/F1"): writer._add_object(font)})})
    stream = pypdf.generic.DecodedStreamObject()
    stream.set_data(b"BT /F1 12 Tf 72 700 Td (Revenue grew in every quarter of the year.) Tj ET")
    page[pypdf.generic.NameObject("/Contents")] = writer._add_object(stream)
    if title is not None:
        writer.add_metadata({"/Title": title})
    with open(path, "wb") as f:
        writer.write(f)
    return path


@pytest.mark.parametrize("title", ["0001065280-18-000069", "Microsoft Word - annual report final.docx",
                                   r"C:\Users\clerk\Desktop\NETFLIX_2017_10K.pdf", "report_v3.docx", "Untitled",
                                   "Document1", "  ", "12"])
def test_a_title_that_names_no_document_gives_way_to_the_file_name(tmp_path, title):
    path = pdf_titled(tmp_path / "NETFLIX_2017_10K.pdf", title)
    assert load_document(path).title == "NETFLIX_2017_10K"


@pytest.mark.parametrize("title", ["The Digital Millennium Copyright Act of 1998", "Nike 2023 Proxy",
                                   "Form 8-K for Foot Locker INC filed 05/19/2022", "10-K - 02/08/2023 - 3M Company",
                                   "Geometrie und Topologie"])
def test_a_real_title_is_kept(tmp_path, title):
    assert load_document(pdf_titled(tmp_path / "x.pdf", title)).title == title


def test_the_rule_alone_keeps_the_first_line_and_names_files_as_shown():
    assert shown_title("Think Python\nHow to Think Like a Computer Scientist", "a/b.pdf") == "Think Python"
    assert shown_title("", "/docs/caf\udce9.pdf") == "café"
    assert shown_title("0000104169-20-000011", "WALMART_2020_10K.pdf") == "WALMART_2020_10K"


def test_the_corpus_filings_titled_by_accession_number_are_named_by_file(corpus):
    path = corpus / "financebench-dev" / "pdfs" / "NETFLIX_2017_10K.pdf"
    if not path.exists():
        pytest.skip("the Netflix filing is not in this corpus")
    assert load_document(path).title == "NETFLIX_2017_10K"
