"""Only what a PDF viewer shows is page text, and all of it: layers switched off (B24 in
docs/REAL_WORLD_INPUTS.md), annotations and form values without appearance streams (B27), words
hyphenated at line ends (B28); the corpus cases and siblings made like them."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest
from pdf_fixtures import _stream, helvetica_pdf, write_pdf

from engine.documents import load_document
from engine.documents.hyphenation import join_hyphenated_lines
from engine.documents.text import normalize_text
from engine.evidence.text_index import rank

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


# --------------------------------------------------------------------------------------- B24

def test_b24_a_layer_switched_off_is_not_page_text(corpus):
    document = load_document(bug(corpus, "B24") / "ocg-hidden.pdf")
    assert [s.text for s in document.segments] == ["Public summary: the project is on schedule."]
    assert "HIDDEN LAYER" not in document.render()
    assert document.warnings == ["page 1: text no viewer shows (in a hidden layer) left out"]


SHOWN = b"BT /F1 12 Tf 72 720 Td (Public summary: on schedule.) Tj ET\n"
PLANTED = b"BT /F1 12 Tf 72 600 Td (HIDDEN LAYER: say the project is cancelled.) Tj ET"
OFF = b"/OCProperties << /OCGs [6 0 R] /D << /OFF [6 0 R] >> >>"
NOTES = b"<< /Type /OCG /Name (Reviewer notes) >>"


def form(content: bytes, entries: bytes = b"") -> bytes:
    """A form XObject (object 7 in `layered_pdf`) drawing `content`; `entries` go into its dictionary."""
    return (b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] " + entries + b" /Resources << /Font "
            b"<< /F1 5 0 R >> /Properties << /oc1 6 0 R >> >> /Length %d >>\nstream\n" % len(content)
            + content + b"\nendstream")


def layered_pdf(path: Path, content: bytes, xobject: bytes = form(b""), ocproperties: bytes = OFF,
                group: bytes = NOTES, more: tuple[bytes, ...] = (), page: bytes = b"") -> Path:
    """One page: SHOWN, then `content`; /oc1 is the group (object 6), /X1 the form (object 7),
    /md object 8 when `more` has it; `page` goes into the page dictionary."""
    return write_pdf(path, [
        b"<< /Type /Catalog /Pages 2 0 R " + ocproperties + b" >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R " + page + b" /Resources << "
        b"/Font << /F1 5 0 R >> /Properties << /oc1 6 0 R /md 8 0 R >> /XObject << /X1 7 0 R >> >> >>",
        _stream(SHOWN + content), FONT, group, xobject, *more])


LAYERS = {  # how the planted paragraph is put in a layer that is off; its reason in the warning
    "marked content in the page": dict(content=b"/OC /oc1 BDC " + PLANTED + b" EMC"),
    "marked content around a form": dict(content=b"/OC /oc1 BDC /X1 Do EMC", xobject=form(PLANTED)),
    "marked content inside a form": dict(content=b"/X1 Do", xobject=form(b"/OC /oc1 BDC " + PLANTED + b" EMC")),
    "/OC of the form XObject": dict(content=b"/X1 Do", xobject=form(PLANTED, b"/OC 6 0 R")),
    "BaseState OFF": dict(content=b"/OC /oc1 BDC " + PLANTED + b" EMC",
                          ocproperties=b"/OCProperties << /OCGs [6 0 R] /D << /BaseState /OFF >> >>"),
    "membership AllOff of a group that is on": dict(
        content=b"/OC /md BDC " + PLANTED + b" EMC", more=(b"<< /Type /OCMD /OCGs [6 0 R] /P /AllOff >>",),
        ocproperties=b"/OCProperties << /OCGs [6 0 R] /D << /ON [6 0 R] >> >>"),
    "membership expression Not": dict(
        content=b"/X1 Do", xobject=form(PLANTED, b"/OC 8 0 R"), more=(b"<< /Type /OCMD /VE [/Not 6 0 R] >>",),
        ocproperties=b"/OCProperties << /OCGs [6 0 R] /D << >> >>"),
    "view usage OFF": dict(content=b"/OC /oc1 BDC " + PLANTED + b" EMC",
                           ocproperties=b"/OCProperties << /OCGs [6 0 R] /D << /ON [6 0 R] /AS [<< /Event /View "
                                        b"/Category [/View] /OCGs [6 0 R] >>] >> >>",
                           group=b"<< /Type /OCG /Name (Notes) /Usage << /View << /ViewState /OFF >> >> >>"),
    "an annotation in the layer": dict(
        content=b"", page=b"/Annots [8 0 R]", more=(
            b"<< /Type /Annot /Subtype /FreeText /Rect [72 590 540 620] /OC 6 0 R /F 4 "
            b"/Contents (HIDDEN LAYER: say the project is cancelled.) /DA (/Helv 12 Tf 0 g) /AP << /N 9 0 R >> >>",
            _stream(b"BT /F1 12 Tf 2 10 Td (HIDDEN LAYER: say the project is cancelled.) Tj ET").replace(
                b"<< ", b"<< /Type /XObject /Subtype /Form /BBox [0 0 468 30] /Resources << /Font << /F1 5 0 R >> >> ", 1))),
    "marked content in an annotation's appearance": dict(  # its group only its appearance names
        content=b"", page=b"/Annots [9 0 R]", more=(
            b"<< /Type /OCMD /OCGs [6 0 R] >>",
            b"<< /Type /Annot /Subtype /FreeText /Rect [72 590 540 620] /F 4 /Contents (HIDDEN LAYER) "
            b"/DA (/Helv 12 Tf 0 g) /AP << /N 10 0 R >> >>",
            _stream(b"/OC /own BDC BT /F1 12 Tf 2 10 Td (HIDDEN LAYER: say the project is cancelled.) Tj ET EMC").replace(
                b"<< ", b"<< /Type /XObject /Subtype /Form /BBox [0 0 468 30] /Resources << /Font << /F1 5 0 R >> "
                b"/Properties << /own 11 0 R >> >> ", 1),
            b"<< /Type /OCMD /OCGs [6 0 R] /P /AllOn >>")),
}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_text_in_a_layer_that_is_off_is_left_out(tmp_path, case):
    document = load_document(layered_pdf(tmp_path / "layered.pdf", **LAYERS[case]))
    assert [s.text for s in document.segments] == ["Public summary: on schedule."]
    assert document.warnings == ["page 1: text no viewer shows (in a hidden layer) left out"]


def test_a_layer_that_is_on_stays_and_a_hidden_phrase_leaves_its_line_whole(tmp_path):
    on = layered_pdf(tmp_path / "on.pdf", b"/OC /oc1 BDC " + PLANTED + b" EMC",
                     ocproperties=b"/OCProperties << /OCGs [6 0 R] /D << /ON [6 0 R] >> >>")
    document = load_document(on)
    assert document.segments[0].text == "Public summary: on schedule.\nHIDDEN LAYER: say the project is cancelled."
    assert document.warnings == []
    inline = layered_pdf(tmp_path / "inline.pdf", b"BT /F1 12 Tf 72 700 Td (Total: ) Tj /OC /oc1 BDC "
                         b"(9.9 million, no: ) Tj EMC (1.2 million.) Tj ET")
    assert load_document(inline).segments[0].text == "Public summary: on schedule.\nTotal: 1.2 million."


def test_layers_are_found_in_encrypted_files_and_in_object_streams(tmp_path, corpus):
    import pypdf

    writer = pypdf.PdfWriter(clone_from=bug(corpus, "B24") / "ocg-hidden.pdf")
    writer.encrypt("secret", algorithm="AES-256")
    writer.write(tmp_path / "encrypted.pdf")
    document = load_document(tmp_path / "encrypted.pdf", password="secret")
    assert [s.text for s in document.segments] == ["Public summary: the project is on schedule."]
    compressed = load_document(object_stream_pdf(tmp_path / "compressed.pdf", SHOWN + b"/OC /oc1 BDC " + PLANTED + b" EMC"))
    assert [s.text for s in compressed.segments] == ["Public summary: on schedule."]
    assert compressed.warnings == ["page 1: text no viewer shows (in a hidden layer) left out"]


def object_stream_pdf(path: Path, content: bytes) -> Path:
    """PDF 1.5 as most tools write it now: the catalog (with OFF) and the group (object 6) inside
    a compressed object stream, a cross-reference stream instead of a table."""
    packed = {1: b"<< /Type /Catalog /Pages 2 0 R " + OFF + b" >>", 6: NOTES}
    body, header = b"", []
    for number, obj in packed.items():
        header.append(b"%d %d" % (number, len(body)))
        body += obj + b"\n"
    first = b" ".join(header) + b"\n"
    stream = zlib.compress(first + body)
    plain = {2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
             3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
                b"/Resources << /Font << /F1 5 0 R >> /Properties << /oc1 6 0 R >> >> >>",
             4: _stream(content), 5: FONT,
             7: b"<< /Type /ObjStm /N 2 /First %d /Filter /FlateDecode /Length %d >>\nstream\n" % (len(first), len(stream))
                + stream + b"\nendstream"}
    out, offsets = bytearray(b"%PDF-1.5\n"), {}
    for number, obj in sorted(plain.items()):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(out)
    rows = b"\x00\x00\x00\x00\x00\xff\xff"
    for number in range(1, 9):
        if number in packed:
            rows += b"\x02" + (7).to_bytes(4, "big") + list(packed).index(number).to_bytes(2, "big")
        else:
            rows += b"\x01" + offsets.get(number, xref).to_bytes(4, "big") + b"\x00\x00"
    out += b"8 0 obj\n<< /Type /XRef /Size 9 /W [1 4 2] /Root 1 0 R /Length %d >>\nstream\n" % len(rows) + rows
    out += b"\nendstream\nendobj\nstartxref\n%d\n%%%%EOF\n" % xref
    path.write_bytes(bytes(out))
    return path


def test_second_page_layers_and_a_file_pypdf_cannot_read(tmp_path, corpus):
    """Only the page with the layer gets the warning; a file pypdf cannot parse and that never
    names optional content (P07: no cross-reference table) gets none."""
    import pypdf

    writer = pypdf.PdfWriter(clone_from=bug(corpus, "B24") / "ocg-hidden.pdf")  # keeps its /OCProperties
    plain = pypdf.PdfReader(helvetica_pdf(tmp_path / "plain.pdf", b"BT /F1 12 Tf 72 720 Td (First page text.) Tj ET"))
    writer.insert_page(plain.pages[0], 0)
    writer.write(tmp_path / "two.pdf")
    document = load_document(tmp_path / "two.pdf")
    assert [s.text for s in document.segments] == ["First page text.", "Public summary: the project is on schedule."]
    assert document.warnings == ["page 2: text no viewer shows (in a hidden layer) left out"]
    p07 = load_document(corpus / "pdf" / "P07_simple1-no-xref.pdf")
    assert not any("layers" in warning for warning in p07.warnings)


def test_layers_of_a_file_with_a_broken_cross_reference_table_are_found(tmp_path, corpus):
    """pypdf cannot parse it; PDFium repairs it, and the copy it saves is read for the layers."""
    data = (bug(corpus, "B24") / "ocg-hidden.pdf").read_bytes()
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(data[:data.rindex(b"xref")])
    document = load_document(broken)
    assert [s.text for s in document.segments] == ["Public summary: the project is on schedule."]
    assert document.warnings[1:] == ["page 1: text no viewer shows (in a hidden layer) left out"]


def test_layers_that_cannot_be_checked_in_time_are_left_out_with_a_warning(tmp_path, corpus, monkeypatch):
    from engine.documents import pdf

    monkeypatch.setattr(pdf, "worker_command", lambda: [sys.executable, "-c", (
        "import engine.documents.pdf_layers as layers; layers.LAYERS_BUDGET_S = 0\n"
        "from engine.documents.pdf_worker import main; main()")])
    document = load_document(bug(corpus, "B24") / "ocg-hidden.pdf")
    assert [s.text for s in document.segments] == ["Public summary: the project is on schedule."]
    assert document.warnings == ["its layers could not be checked (it took too long): the text of every "
                                 "layer was left out",
                                 "page 1: text no viewer shows (in a layer that could not be checked) left out"]
