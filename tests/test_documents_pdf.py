"""PDF loading: the expected behaviour of every corpus PDF (cases P01-P16 and S01-S06 in
docs/CORPUS.md), text quality, and the worker bounds."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from engine.documents import (
    DamagedPdfError, EmptyFileError, NoTextLayerError, NotPdfError, PasswordRequiredError,
    SuspiciousPdfError, UnreadableTextError, WrongPasswordError, load_document, pdf,
)
from engine.documents.hyphenation import join_hyphenated_lines
from engine.documents.text import long_letter_runs, normalize_text
from engine.errors import Cancelled, DocumentError


def corpus_pdf(corpus: Path, name: str) -> Path:
    return corpus / "pdf" / name


def assert_one_line(error: BaseException, file_name: str) -> None:
    message = str(error)
    assert "\n" not in message and file_name in message and "Traceback" not in message


# --- building small PDFs -----------------------------------------------------------------------

def build_pdf(page_contents: list[bytes], resources: bytes, extra: dict[int, bytes],
              compress: bool = False) -> bytes:
    """A valid PDF with one page per content stream; objects 3..99 are free for `extra`."""
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>", **extra}
    kids = []
    number = 100
    for content in page_contents:
        objects[number] = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                           b"/Resources %s >>" % (number + 1, resources))
        if compress:
            content = zlib.compress(content)
        objects[number + 1] = b"<< /Length %d%s >>\nstream\n%s\nendstream" % (
            len(content), b" /Filter /FlateDecode" if compress else b"", content)
        kids.append(b"%d 0 R" % number)
        number += 2
    objects[2] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    out = bytearray(b"%PDF-1.7\n")
    offsets = {}
    for n in sorted(objects):
        offsets[n] = len(out)
        out += b"%d 0 obj\n%s\nendobj\n" % (n, objects[n])
    xref = len(out)
    size = max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for n in range(1, size):
        out += b"%010d 00000 n \n" % offsets[n] if n in offsets else b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


HELVETICA = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
# A font whose codes map to made-up glyph names: no Unicode for any of them.
UNMAPPED = (b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding << /Type /Encoding "
            b"/Differences [1 " + b" ".join(b"/g%d" % i for i in range(1, 40)) + b"] >> >>")
RESOURCES = b"<< /Font << /F1 3 0 R /F2 4 0 R >> /XObject << /Im1 5 0 R >> >>"
IMAGE = b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray " \
        b"/BitsPerComponent 8 /Length 1 >>\nstream\n\xff\nendstream"
GOOD_PAGE = b"BT /F1 12 Tf 72 700 Td (The quick brown fox jumps over the lazy dog by the river.) Tj ET"
NOISE_PAGE = (b"BT /F2 12 Tf 72 700 Td <" + bytes(range(1, 40)).hex().encode() + b"> Tj ET")
IMAGE_PAGE = b"q 200 0 0 200 100 300 cm /Im1 Do Q"


def synthetic(tmp_path: Path, name: str, pages: list[bytes]) -> Path:
    path = tmp_path / name
    path.write_bytes(build_pdf(pages, RESOURCES, {3: HELVETICA, 4: UNMAPPED, 5: IMAGE}))
    return path


# --- P16: the long book ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def p16(corpus):
    calls: list[tuple[int, int]] = []
    document = load_document(corpus_pdf(corpus, "P16_thinkpython2.pdf"),
                             progress=lambda done, total: calls.append((done, total)))
    return document, calls


@pytest.fixture(scope="module")
def p16_pdfium_pages(corpus):
    """PDFium's own text of each P16 page: the reference for what the page shows."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(corpus_pdf(corpus, "P16_thinkpython2.pdf"))
    return [normalize_text(document[i].get_textpage().get_text_range()) for i in range(len(document))]


def unshown_runs(text: str, reference: str) -> list[str]:
    """20+ letter runs in `text` that the page does not show as one word (not in `reference`)."""
    shown = set(long_letter_runs(reference))
    return [run for run in long_letter_runs(text) if run not in shown]


def test_p16_page_6_keeps_word_boundaries(p16):
    document, _ = p16
    page6 = next(s for s in document.segments if s.page == 6)
    assert "with Java was striking" in " ".join(page6.text.split())


def test_p16_has_no_glued_words_the_page_does_not_show(p16, p16_pdfium_pages, corpus):
    document, _ = p16
    bad = {s.page: unshown_runs(s.text, p16_pdfium_pages[s.page - 1]) for s in document.segments}
    assert {page: runs for page, runs in bad.items() if runs} == {}
    assert sum(bool(long_letter_runs(s.text)) for s in document.segments) == 0
    # The check itself catches the bug: pypdf's page 6 fails it (one page, not the whole book).
    import pypdf

    pypdf_page6 = pypdf.PdfReader(corpus_pdf(corpus, "P16_thinkpython2.pdf")).pages[5].extract_text()
    assert unshown_runs(normalize_text(pypdf_page6), p16_pdfium_pages[5])


def test_p16_pages_blank_pages_and_progress(p16):
    document, calls = p16
    assert document.kind == "pdf" and document.pages == 288
    assert len(document.segments) == 276  # 12 blank pages are not segments...
    assert document.warnings == []  # ...and not failures either
    assert "Think Python" in document.segments[0].text and document.segments[0].label == "page 1"
    assert calls[0] == (0, 288) and calls[-1] == (288, 288)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert "value of π" in next(s.text for s in document.segments if s.page == 31)


def test_render_marks_every_page(p16):
    document, _ = p16
    rendered = document.render()
    assert rendered.startswith("[page 1]\nThink Python")
    assert rendered.count("\n[page ") + 1 == len(document.segments)
    assert "[page 6]\n" in rendered and "[page 2]\n" not in rendered  # page 2 is blank


# --- the rest of the corpus, one "App must" each -------------------------------------------------

def test_p01_baseline_without_warnings(corpus):
    document = load_document(corpus_pdf(corpus, "P01_minimal-document.pdf"))
    assert "Lorem ipsum" in document.segments[0].text and document.warnings == []
    assert document.pages == 1 and document.source.endswith("P01_minimal-document.pdf")


def test_p02_password_required_wrong_and_right(corpus):
    path = corpus_pdf(corpus, "P02_libreoffice-writer-password.pdf")
    with pytest.raises(PasswordRequiredError) as required:
        load_document(path)
    assert_one_line(required.value, path.name)
    assert "password" in str(required.value)
    with pytest.raises(WrongPasswordError) as wrong:
        load_document(path, password="not-it")
    assert_one_line(wrong.value, path.name)
    assert type(required.value) is not type(wrong.value)
    assert "Lorem ipsum" in load_document(path, password="openpassword").render()


def test_p03_empty_user_password_opens_silently(corpus):
    document = load_document(corpus_pdf(corpus, "P03_r6-empty-password.pdf"))
    assert "pdf encryption test" in document.render() and document.warnings == []


def test_p04_aes_user_password(corpus):
    path = corpus_pdf(corpus, "P04_r4-aes-user-password.pdf")
    with pytest.raises(PasswordRequiredError):
        load_document(path)
    with pytest.raises(WrongPasswordError):
        load_document(path, password="asdf")
    assert "pdf encryption test" in load_document(path, password="asdfzxcv").render()


def test_p05_permissions_only_lock_opens_silently(corpus):
    document = load_document(corpus_pdf(corpus, "P05_dmca.pdf"))
    assert document.pages == 18 and document.warnings == []
    assert "THE DIGITAL MILLENNIUM COPYRIGHT ACT" in document.segments[0].text
    assert load_document(corpus_pdf(corpus, "P05_dmca.pdf")).render() == document.render()


def test_p06_broken_xref_is_repaired_with_a_warning(corpus):
    document = load_document(corpus_pdf(corpus, "P06_issue-297.pdf"))
    assert document.segments[0].text == "test example"
    assert any("repaired" in w for w in document.warnings)


def test_p07_no_xref_read_by_pdfium_with_damage_warning(corpus):
    document = load_document(corpus_pdf(corpus, "P07_simple1-no-xref.pdf"))
    assert "Hello World" in document.segments[0].text
    assert any("damaged" in w for w in document.warnings)


def test_p08_partially_broken_file_gives_a_clear_error_or_text(corpus):
    path = corpus_pdf(corpus, "P08_unreadablemetadata.pdf")
    try:
        document = load_document(path)
    except DocumentError as error:
        assert_one_line(error, path.name)
    else:
        assert "Rotary Potentiometer" in document.render()


def test_p09_scan_says_no_text_layer(corpus):
    path = corpus_pdf(corpus, "P09_imagemagick-CCITTFaxDecode.pdf")
    with pytest.raises(NoTextLayerError) as error:
        load_document(path)
    assert "no text layer (scanned?)" in str(error.value)
    assert_one_line(error.value, path.name)


def test_p10_rotated_pages_keep_the_arabic(corpus):
    document = load_document(corpus_pdf(corpus, "P10_habibi-rotated.pdf"))
    texts = [s.text for s in document.segments]
    assert len(texts) == 4 and len(set(texts)) == 1  # /Rotate 90, 180, 270 and 360 alike
    assert "habibi" in texts[0] and normalize_text("حَبيبي") in texts[0]
    assert "ϲΒϴΒ" not in texts[0]  # PDFium's garbage for the harakat


def test_p11_columns_stay_in_reading_order(corpus):
    import pypdf

    path = corpus_pdf(corpus, "P11_multicolumn.pdf")
    document = load_document(path)
    page1 = document.segments[0].text
    assert page1.index("Abstract") < page1.index("Lorem ipsum dolor sit amet") < page1.index("Nam dui ligula")
    assert not any("Abstract" in line and "pellentesque" in line for line in page1.split("\n"))
    # pypdf's plain mode is the reading-order reference (corpus README): same lines, same order,
    # once the words it leaves hyphenated at line ends are joined the same way ("adip-" / "iscing").
    reader = pypdf.PdfReader(path)
    reference = join_hyphenated_lines([normalize_text(page.extract_text()) for page in reader.pages])
    assert "adipiscing" in page1 and "adip-" not in page1
    for index in (0, 1):
        assert document.segments[index].text.split("\n") == reference[index].split("\n")
    assert "filled" in page1 and "\ufb01" not in document.render()  # ligatures spelled out


def test_p14_type3_digits_keep_their_spaces(corpus):
    document = load_document(corpus_pdf(corpus, "P14_matplotlib-type3.pdf"))
    assert "0 2 4 6 8" in document.segments[0].text


def test_p15_no_nul_or_control_characters(corpus):
    document = load_document(corpus_pdf(corpus, "P15_GeoTopo-komprimiert.pdf"))
    rendered = document.render()
    assert "\x00" not in rendered
    assert not any(ch < " " and ch not in "\n\t" for ch in rendered)
    assert document.pages == 117
    assert "(∀, ∃)" in next(s.text for s in document.segments if s.page == 2)


# --- synthetic bad files ---------------------------------------------------------------------

BOMB_PROBE = r"""
import json, resource, sys, time
from engine.documents import load_document
start = time.monotonic()
try:
    load_document(sys.argv[1])
    result = {"error": None}
except Exception as exc:
    result = {"error": type(exc).__name__, "message": str(exc)}
result["seconds"] = time.monotonic() - start
# Peak RSS of this probe's children, i.e. of the PDF worker alone (KiB on Linux).
result["child_peak_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def bomb(corpus):
    """Load S01 in a separate process, so that its child's peak memory can be read in isolation."""
    path = corpus_pdf(corpus, "synthetic/synthetic-flate-bomb-80MB.pdf")
    done = subprocess.run([sys.executable, "-c", BOMB_PROBE, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_s01_flate_bomb_is_refused_within_time_and_memory(bomb):
    assert bomb["error"] == "SuspiciousPdfError"
    assert "too large" in bomb["message"] and "suspicious" in bomb["message"]
    assert "\n" not in bomb["message"] and "synthetic-flate-bomb-80MB.pdf" in bomb["message"]
    assert bomb["seconds"] < 30  # PDFium alone: 46 s
    if sys.platform.startswith("linux"):  # PDFium alone: 7.6 GB
        assert bomb["child_peak_bytes"] < pdf.WORKER_MEMORY_BYTES * 1.1


def test_synthetic_failures_have_distinct_friendly_messages(corpus, bomb):
    cases = {
        "synthetic-empty-0-bytes.pdf": (EmptyFileError, "empty"),
        "synthetic-html-saved-as.pdf": (NotPdfError, "not a PDF"),
        "synthetic-truncated.pdf": (DamagedPdfError, "incomplete"),
        "synthetic-cyclic-pages.pdf": (DamagedPdfError, "page tree"),
    }
    messages = {bomb["message"].replace("synthetic-flate-bomb-80MB.pdf", "")}
    for name, (error_type, phrase) in cases.items():
        with pytest.raises(error_type) as error:
            load_document(corpus_pdf(corpus, f"synthetic/{name}"))
        assert phrase in str(error.value)
        assert_one_line(error.value, name)
        messages.add(str(error.value).replace(name, ""))
    assert len(messages) == len(cases) + 1


def test_html_message_names_html(corpus):
    with pytest.raises(NotPdfError, match="HTML"):
        load_document(corpus_pdf(corpus, "synthetic/synthetic-html-saved-as.pdf"))


def test_unreadable_page_is_left_out_with_its_page_number(tmp_path):
    document = load_document(synthetic(tmp_path, "mixed.pdf", [GOOD_PAGE, NOISE_PAGE, GOOD_PAGE]))
    assert [s.page for s in document.segments] == [1, 3]
    assert document.warnings == ["page 2: text unreadable (font without a Unicode map?), left out"]
    assert "/g1" not in document.render() and "\x01" not in document.render()


def test_only_unreadable_pages_is_an_error(tmp_path):
    with pytest.raises(UnreadableTextError) as error:
        load_document(synthetic(tmp_path, "noise.pdf", [NOISE_PAGE]))
    assert_one_line(error.value, "noise.pdf")


def test_image_page_inside_a_text_pdf_is_a_warning_and_blank_page_is_silent(tmp_path):
    document = load_document(synthetic(tmp_path, "scan.pdf", [GOOD_PAGE, IMAGE_PAGE, b"", IMAGE_PAGE,
                                                              IMAGE_PAGE, GOOD_PAGE]))
    assert document.pages == 6 and [s.page for s in document.segments] == [1, 6]
    # OCR ran on them (the image is a grey square): nothing was recognised
    assert document.warnings == ["pages 2, 4-5: no text layer (scanned?), no text found"]


def test_pdf_header_wins_over_the_file_name(tmp_path):
    path = synthetic(tmp_path, "report.txt", [GOOD_PAGE])
    document = load_document(path)
    assert document.kind == "pdf" and "quick brown fox" in document.render()


def test_page_with_too_much_text_is_refused(tmp_path, monkeypatch):
    # A page that inflates to more text than MAX_PAGE_CHARS: the worker refuses it, not the app.
    content = b"BT /F1 12 Tf 72 720 Td 14 TL\n" + b"(zip bomb line ) ' \n" * 20_000 + b"ET"
    path = tmp_path / "wordy.pdf"
    path.write_bytes(build_pdf([content], RESOURCES, {3: HELVETICA, 4: UNMAPPED, 5: IMAGE},
                               compress=True))
    monkeypatch.setattr(pdf, "worker_command", lambda: [
        sys.executable, "-c", "import sys; from engine.documents import pdf_worker as w; "
        "w.MAX_PAGE_CHARS = 10_000; sys.exit(w.main())"])
    with pytest.raises(SuspiciousPdfError, match="too much text"):
        load_document(path)


# --- the worker's bounds: crash, stall, cancel ------------------------------------------------

FAKE_WORKER = r"""
import json, os, sys, time
request = json.loads(sys.stdin.readline())
mode, start = os.environ["FAKE_MODE"], request["start_page"]
def emit(event): print(json.dumps(event), flush=True)
if mode == "stall":
    time.sleep(60)
emit({"event": "open", "pages": 10, "title": "Fake", "repaired": False})
if mode == "always-crash" or (mode == "crash-on-2" and start == 0):
    if start == 0:
        emit({"event": "page", "page": 1, "text": "first page text", "extractor": "pdfium", "images": 0})
    os.abort()
for number in range(start + 1, 11):
    emit({"event": "page", "page": number, "text": f"page {number} text", "extractor": "pdfium", "images": 0})
emit({"event": "done"})
"""


@pytest.fixture
def fake_worker(monkeypatch, tmp_path):
    monkeypatch.setattr(pdf, "worker_command", lambda: [sys.executable, "-c", FAKE_WORKER])
    return synthetic(tmp_path, "fake.pdf", [GOOD_PAGE])


def test_crashed_page_is_skipped_and_the_rest_is_read(fake_worker, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash-on-2")
    document = load_document(fake_worker)
    assert [s.page for s in document.segments] == [1, *range(3, 11)]
    assert len(document.warnings) == 1 and document.warnings[0].startswith("page 2: too large or malformed")


def test_too_many_crashed_pages_refuse_the_file(fake_worker, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "always-crash")
    with pytest.raises(SuspiciousPdfError) as error:
        load_document(fake_worker)
    assert_one_line(error.value, "fake.pdf")


def test_stalled_worker_is_killed(fake_worker, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "stall")
    monkeypatch.setattr(pdf, "PAGE_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(SuspiciousPdfError, match="no result within 1 s"):
        load_document(fake_worker)
    assert time.monotonic() - start < 10


def test_cancel_stops_the_worker(corpus):
    cancel = threading.Event()

    def progress(done: int, total: int) -> None:
        if done >= 3:
            cancel.set()

    start = time.monotonic()
    with pytest.raises(Cancelled):
        load_document(corpus_pdf(corpus, "P16_thinkpython2.pdf"), progress=progress, cancel=cancel)
    assert time.monotonic() - start < 10


# --- XFA forms (issue 45.7) ----------------------------------------------------------------------

XFA_PLACEHOLDER = [b"Please wait...",
                   b"If this message is not eventually replaced by the proper contents of the document, your PDF",
                   b"viewer may not be able to display this type of document."]
XFA_DATASETS = b"""<xfa:datasets xmlns:xfa="http://www.xfa.org/schema/xfa-data/1.0/"><xfa:data><form1>
<Applicant><Name>Ada Lovelace</Name><Phone>020 7946 0018</Phone></Applicant>
<Claim><Amount>1250.00</Amount><Reason>Water damage to the harbour office roof</Reason></Claim>
</form1></xfa:data></xfa:datasets>"""


def xfa_pdf(path: Path, datasets: bytes = XFA_DATASETS) -> Path:
    """A dynamic XFA form as LiveCycle writes one: its page shows only the placeholder a viewer
    without XFA prints, and the filled-in values are in the /AcroForm /XFA packets (pypdf)."""
    from pypdf import PdfWriter
    from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, NameObject, TextStringObject

    from pdf_fixtures import helvetica_pdf

    helvetica_pdf(path, b"BT /F1 12 Tf 72 740 Td 16 TL " + b"".join(b"(" + line + b") Tj T* " for line in XFA_PLACEHOLDER) + b"ET")
    writer = PdfWriter(clone_from=str(path))
    packets = ArrayObject()
    for name, data in (("preamble", b'<xdp:xdp xmlns:xdp="http://ns.adobe.com/xdp/">'), ("datasets", datasets),
                       ("postamble", b"</xdp:xdp>")):
        stream = DecodedStreamObject()
        stream.set_data(data)
        packets += [TextStringObject(name), writer._add_object(stream)]
    form = DictionaryObject({NameObject("/Fields"): ArrayObject(), NameObject("/XFA"): packets})
    writer.root_object[NameObject("/AcroForm")] = writer._add_object(form)
    writer.write(str(path))
    return path


def test_an_xfa_forms_filled_in_values_are_read_not_only_its_placeholder(tmp_path):
    """Before: the document was its "Please wait..." placeholder, with no warning."""
    document = load_document(xfa_pdf(tmp_path / "claim.pdf"))
    text = document.render()
    for line in ("Applicant.Name: Ada Lovelace", "Applicant.Phone: 020 7946 0018", "Claim.Amount: 1250.00",
                 "Claim.Reason: Water damage to the harbour office roof"):
        assert line in text
    assert any(w.startswith("an XFA form (LiveCycle): its filled-in values were read") for w in document.warnings)


def test_an_xfa_form_whose_data_declares_entities_is_not_expanded_and_says_so(tmp_path):
    laughs = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "hahahahahahahahahaha">'
              b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
              b'<xfa:datasets xmlns:xfa="http://www.xfa.org/schema/xfa-data/1.0/"><xfa:data><f><Name>&c;</Name></f>'
              b"</xfa:data></xfa:datasets>")
    document = load_document(xfa_pdf(tmp_path / "laughs.pdf", laughs))
    assert "haha" not in document.render() and "Please wait" in document.render()
    [note] = [w for w in document.warnings if "XFA" in w]
    assert "values could not be read: its data declares entities" in note and "print it to a PDF" in note
