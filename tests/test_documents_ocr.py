"""Scanned PDFs and images read by OCR (engine.documents.ocr): scans made in the test with Pillow's
scalable font, the real OCR engine (rapidocr-onnxruntime) in its own process."""

from __future__ import annotations

import struct
import threading
import time
import zlib

import pytest

from engine.documents import load_document
from engine.documents import ocr
from engine.documents.image import ImageTooLargeError
from engine.errors import Cancelled
from scan_fixtures import PAGE_PX, line_box_px, scan_image, scan_pdf

LEASE = ["Lease agreement for the harbour warehouse",
         "The tenant pays a monthly rent of 2450 euros.",
         "The lease starts on 1 March 2024 and runs five years.",
         "Either party may end it with six months notice."]
MINUTES = ["Minutes of the board meeting in Leiden",
           "The board approved the new library budget.",
           "Next meeting: Thursday 14 November at noon."]
STAMP = "DocuSign Envelope ID: 3F2A9C1E-77B4-4D2E-9A61-0C5E8B1D4F27"


def squeezed(text: str) -> str:
    """Lower case without white space: OCR may set spaces differently ("2450euros")."""
    return "".join(text.lower().split())


def has(text: str, line: str) -> bool:
    return squeezed(line) in squeezed(text)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty OCR cache, so pages are recognised in this test; counts OCR process runs."""
    monkeypatch.setenv("HALAMAN_HOME", str(tmp_path / "home"))
    runs = []
    original = ocr._run_worker

    def counted(request, cancel):
        runs.append(list(request["pages"]))
        return original(request, cancel)

    monkeypatch.setattr(ocr, "_run_worker", counted)
    return runs


def test_a_scanned_pdf_is_read_by_ocr_and_says_so(tmp_path, own_cache):
    path = scan_pdf(tmp_path / "lease-scan.pdf", [scan_image(LEASE)])
    document = load_document(path)
    text = document.render()
    assert has(text, "monthly rent of 2450 euros") and has(text, "harbour warehouse")
    assert document.recognised_pages == [1] and document.segments[0].label == "page 1"
    assert "page 1: recognised text (OCR) of a scanned page: words may be misread" in document.warnings


def test_a_partly_scanned_pdf_mixes_the_text_layer_and_recognised_pages(tmp_path, own_cache):
    path = scan_pdf(tmp_path / "mixed.pdf", [["Cover letter from the landlord."], scan_image(LEASE),
                                              ["Annex: the floor plan follows."]])
    document = load_document(path)
    assert [s.page for s in document.segments] == [1, 2, 3] and document.recognised_pages == [2]
    assert document.segments[0].text == "Cover letter from the landlord."
    assert has(document.segments[1].text, "six months notice")
    assert own_cache == [[1]]  # only the scanned page was rendered and recognised


def test_a_scan_with_a_stamp_of_real_text_is_recognised_not_read_as_its_stamp(tmp_path, own_cache):
    """Issue 45 item 1 (docling#3464, ocrmypdf#1563): each page was its 62-character stamp."""
    path = scan_pdf(tmp_path / "signed.pdf", [scan_image(LEASE), scan_image(MINUTES)], stamp=STAMP)
    document = load_document(path)
    assert document.recognised_pages == [1, 2]
    assert has(document.segments[0].text, "monthly rent of 2450") and has(document.segments[1].text, "library budget")
    assert any("pages 1-2: a scan with a short line of text over it (a stamp?)" in w for w in document.warnings)


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".tiff"])
def test_images_open_as_pages_of_recognised_text(tmp_path, own_cache, suffix):
    path = tmp_path / f"photo{suffix}"
    frames = [scan_image(LEASE).convert("RGB"), scan_image(MINUTES).convert("RGB")]
    if suffix == ".tiff":  # a multi-page TIFF: each frame a page
        frames[0].save(path, save_all=True, append_images=frames[1:], compression="tiff_deflate")
    else:
        frames[0].save(path, quality=90) if suffix == ".jpg" else frames[0].save(path)
    document = load_document(path)
    assert has(document.segments[0].text, "monthly rent of 2450 euros")
    if suffix == ".tiff":
        assert [s.label for s in document.segments] == ["page 1", "page 2"] and document.pages == 2
        assert has(document.segments[1].text, "board approved the new library budget")
    assert document.kind == "pdf" and document.recognised_pages[0] == 1
    assert document.marker(document.segments[0]) == "[page 1]"


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` × `height` (greyscale) and holds one row: only a decoder that
    trusts the header allocates the whole bitmap."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1))) + chunk(b"IEND", b"")


def test_a_huge_image_is_refused_in_one_line_before_decoding(tmp_path, own_cache):
    path = tmp_path / "poster.png"
    path.write_bytes(_png_header(20_000, 20_000))
    started = time.monotonic()
    with pytest.raises(ImageTooLargeError) as error:
        load_document(path)
    assert time.monotonic() - started < 2 and own_cache == []
    message = str(error.value)
    assert "\n" not in message and "poster.png" in message and "20,000 × 20,000 pixels" in message


def test_cancel_stops_a_long_scan_between_pages(tmp_path, own_cache):
    path = tmp_path / "binder.tiff"
    frames = [scan_image([f"Page {n} of the binder", *LEASE]).convert("RGB") for n in range(8)]
    frames[0].save(path, save_all=True, append_images=frames[1:], compression="tiff_deflate")
    cancel, seen = threading.Event(), []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done >= 1:
            cancel.set()

    started = time.monotonic()
    with pytest.raises(Cancelled):
        load_document(path, progress=progress, cancel=cancel)
    assert seen[0] == (0, 8) and (1, 8) in seen and (8, 8) not in seen
    assert time.monotonic() - started < 60
    # The page done before the cancel is kept: the next open recognises only the rest.
    assert len(list(ocr.cache_folder().rglob("*.json"))) >= 1


def test_a_page_is_recognised_once_the_second_open_reads_the_cache(tmp_path, own_cache):
    path = scan_pdf(tmp_path / "lease-scan.pdf", [scan_image(LEASE)])
    first = load_document(path)
    again = load_document(path)
    assert len(own_cache) == 1 and again.render() == first.render()
    assert all(p.suffix == ".json" for p in ocr.cache_folder().rglob("*") if p.is_file())


def test_the_attended_sentence_maps_to_a_box_over_its_line_in_the_image(tmp_path, own_cache):
    path = tmp_path / "lease.png"
    scan_image(LEASE).save(path)
    document = load_document(path)
    page = ocr.cached_page(path, 0)
    assert page is not None and normalize(page.text) == document.segments[0].text
    start = squeezed_find(page.text, "monthly rent")
    boxes = page.boxes(start, start + len("monthly rent"))
    assert boxes
    top_px, bottom_px = line_box_px(1)  # line 1 (0-based) of LEASE, pixels from the top
    height = PAGE_PX[1]
    for left, bottom, right, top in boxes:  # page units (pixels), y up
        assert height - top_px + 15 >= top and bottom >= height - bottom_px - 15
        assert left < right and 400 < (left + right) / 2 < 1000  # over the words, not the whole row


def normalize(text: str) -> str:
    from engine.documents.text import normalize_text

    return normalize_text(text)


def squeezed_find(text: str, words: str) -> int:
    at = text.lower().find(words)
    assert at >= 0, text
    return at


def test_a_question_on_a_scanned_page_is_answered_from_the_recognised_text(smol, tmp_path, own_cache):
    from engine.session import DocumentSession
    from engine.settings import CachePolicy, EngineSettings

    settings = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64,
                                                chunk_tokens=256), max_new_tokens=24)
    path = scan_pdf(tmp_path / "lease-scan.pdf", [scan_image(LEASE)])
    session = DocumentSession(smol, settings)
    report = session.open(str(path))
    assert report.pages == 1
    answer = session.ask("How much is the monthly rent in euros?")
    assert "2450" in answer.text.replace(",", "").replace(" ", "")
    assert [s.page for s in answer.sources] == [1]


def test_without_the_ocr_engine_a_stamped_scan_is_named_in_a_warning(tmp_path, own_cache, monkeypatch):
    """Where OCR cannot run, the stamp is not passed off as the page: the pages are named."""
    import sys

    missing = '{"event": "error", "code": "unavailable", "index": null, "detail": "No module named rapidocr_onnxruntime"}'
    monkeypatch.setattr(ocr, "worker_command", lambda: [sys.executable, "-c", f"print({missing!r})"])
    path = scan_pdf(tmp_path / "signed.pdf", [scan_image(LEASE), scan_image(MINUTES)], stamp=STAMP)
    document = load_document(path)
    assert document.recognised_pages == []
    assert ("pages 1-2: mostly an image with only a short line of text (a stamp over a scan?): only that line was "
            "read, the image's text could not be recognised (No module named rapidocr_onnxruntime)") in document.warnings


def test_an_answer_citing_a_recognised_page_gets_a_caution_and_one_citing_a_text_page_none():
    assert ocr.recognised_note([2, 3, 4], [1, 3, 4, None]) == (
        "pages 3-4 are recognised text (OCR): check the wording against the page image")
    assert ocr.recognised_note([2], [2]) == "page 2 is recognised text (OCR): check the wording against the page image"
    assert ocr.recognised_note([2], [1, None]) is None and ocr.recognised_note([], [1]) is None


def test_a_slide_whose_picture_holds_no_words_keeps_its_own_title(tmp_path, own_cache):
    """A full-page photo with a title over it looks like a stamped scan; the recogniser finds no
    more words than the title, so the text layer (exact, in any script) stands."""
    from PIL import Image

    photo = Image.linear_gradient("L").resize(PAGE_PX)
    path = scan_pdf(tmp_path / "deck.pdf", [photo], stamp="Quarterly results 2024: harbour division")
    document = load_document(path)
    assert [s.text for s in document.segments] == ["Quarterly results 2024: harbour division"]
    assert document.recognised_pages == [] and document.warnings == [] and own_cache == [[0]]


def test_a_truncated_image_is_one_line_naming_the_file(tmp_path, own_cache):
    """The header is whole (its size is read), the pixels stop early: decoding fails in the OCR
    process, which says so instead of crashing the read."""
    from engine.documents import FileNotReadableError

    whole = tmp_path / "whole.png"
    scan_image(LEASE).save(whole)
    path = tmp_path / "cut-off.png"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 5])
    with pytest.raises(FileNotReadableError) as error:
        load_document(path)
    message = str(error.value)
    assert "\n" not in message and message.startswith("cut-off.png: page 1 cannot be read as an image")
