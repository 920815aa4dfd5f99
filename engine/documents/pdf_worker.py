"""Child process that reads one PDF and streams its text page by page as JSON lines.

Run as `python -m engine.documents.pdf_worker`; `engine.documents.pdf` starts it, sends one JSON
request on stdin and reads one JSON object per line from stdout. PDF parsers run here, never in
the app's process, because a hostile file can take unbounded time and memory: PDFium took 46 s and
7.6 GB RSS on the test corpus' 80 MB flate bomb (S01; case ids: docs/CORPUS.md; pypdf #2790, #3167). Under the address-space
cap set below PDFium aborts within 2 s instead, and the parent reports the page as suspicious.

Request:  {"path": str, "password": str | null, "start_page": int (0-based), "memory_bytes": int}
Events:   {"event": "open", "pages": int, "title": str, "repaired": bool,
           "layers_unchecked": why the layers could not be checked (str) | null,
           "outline": [[level, title, 0-based page]]}
          {"event": "page", "page": int (1-based), "text": str,
           "extractor": "pdfium" | "pypdf" | "pdfminer", "images": int,
           "label": the page's printed label (/PageLabels: "iii", "48", "A-3"; at most
           MAX_LABEL_CHARS characters) or "" where the PDF gives none,
           "hidden": {reason: characters left out because no viewer shows them},
           "image_share": share of the page's area under images (0..1; computed only when the
           page has at most STAMP_MAX_CHARS characters of text, else 0)}
          {"event": "attachments", "files": embedded files (`pdf_attachments.attachments`)},
           after the last page: decoding one can exhaust the memory cap, which then costs no page
          {"event": "error", "code": str, "page": int | null, "detail": str}
          {"event": "done"}
Error codes: "password_required", "wrong_password", "unsupported_security", "unreadable" (PDFium
cannot parse the file), "page_unreadable" (page tree broken at `page`), "page_too_large".

Text extractor, chosen by measurement (bench/pdf_text_quality.py, docs/PDF_TEXT.md): PDFium for
every page, because pypdf loses word boundaries in justified text (148 of 288 pages of P16 have
runs of 20+ letters, 0 with PDFium) and is ~17x slower (6.5 s vs 0.4 s). pypdf gives a second opinion on pages where
PDFium's text is suspect (see `_needs_second_opinion`), and wins when it scores better. Where the
text is still unreliable (`is_unreliable`: typically a TrueType font without /ToUnicode, whose glyph
ids PDFium and pypdf print as shifted characters), pdfminer.six gives a third opinion: it maps
glyphs through the embedded font's own cmap. The best of the three is kept; the page is flagged
only when all of them fail.

Only what a viewer shows is page text (`engine.documents.pdf_visible`): text outside the visible
page box, invisible, transparent, too small, white on white or in a layer that is switched off
(`engine.documents.pdf_layers`: then PDFium reads a marked copy of the file) is left out, and a
page where any was left out gets no second or third opinion, since those extractors cannot
leave it out. Annotations are drawn into the page as a viewer shows them (`_with_annotations`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import sys
import unicodedata
import warnings
from collections import Counter
from typing import Any, Callable

from engine.documents.document import MAX_LABEL_CHARS
from engine.documents.pdf_attachments import attachments
from engine.documents.pdf_layers import HIDDEN_REASON, LayersUnchecked, MarkedLayers, mark_hidden_layers
from engine.documents.pdf_xfa import xfa_values
from engine.documents.pdf_visible import visible_text
from engine.documents.text import TextQuality, is_unreliable, measure, same_content
from engine.documents.visual_order import logical_order
from engine.documents.child_io import emit, limit_memory

MAX_PAGE_CHARS = 2_000_000
"""A page with more text than this is treated as hostile (P16's densest page has ~3,000)."""

GLYPH_CODE_SUSPECT = 0.1
"""Share of a page's characters in glyph-code tokens above which pypdf is asked too."""

SECOND_OPINION_MARGIN = 0.02
"""pypdf replaces PDFium's text for a page only when its score is higher by more than this
(on P15, pypdf's wins on suspect pages were 0.006-0.04; P10's were 0.25-0.62)."""


STAMP_MAX_CHARS = 300
"""A page with at most this much text over an image is checked for being a scan with a stamp
(an e-signature envelope ID, a Bates number, a fax header: 40-120 characters); a text page has
thousands (P16's pages: 1,500-3,000)."""


def _image_share(page: Any, pdfium: Any) -> float:
    """Share of the page's visible box covered by images (their bounds clipped to the box; overlaps
    counted once per image, so capped at 1); 0 when all the page's text is drawn invisible (render
    mode 3 or 7): that is an OCR layer over the scan (ocrmypdf's), the scan's own text, not a stamp."""
    from engine.documents.pdf_visible import visible_box

    modes = [pdfium.raw.FPDFTextObj_GetTextRenderMode(obj.raw)
             for obj in page.get_objects(filter=[pdfium.raw.FPDF_PAGEOBJ_TEXT], max_depth=3)]
    if modes and all(mode in (3, 7) for mode in modes):
        return 0.0

    left, bottom, right, top = visible_box(page)
    area = max((right - left) * (top - bottom), 1e-6)
    covered = 0.0
    for obj in page.get_objects(filter=[pdfium.raw.FPDF_PAGEOBJ_IMAGE], max_depth=3):
        l, b, r, t = obj.get_bounds()
        covered += max(0.0, min(r, right) - max(l, left)) * max(0.0, min(t, top) - max(b, bottom))
    return min(1.0, covered / area)




def _needs_second_opinion(quality: TextQuality, uses_type3: Callable[[], bool]) -> bool:
    """Whether PDFium's text for a page is suspect enough to also run pypdf on it.

    Suspect: empty; any NUL, control, U+FFFD, private-use or mixed-script character, or 10 % of
    glyph-code tokens (`TextQuality.glyph_code_letters`); a 20+ letter
    run; right-to-left letters (PDFium reversed P10's Arabic); under 80% word-like words; or a
    Type3 font (PDFium glued P14's Type3 tick labels "0 2 4 6 8" into "02468").
    Measured: 4 of P16's 288 pages are suspect (0.1 s of pypdf), 78 of P15's 117 (2.3 s).
    """
    # Glyph-code tokens count only in bulk: code in a programming book ("a[i]", "x=y") reaches 6 %
    # of a page's characters (P16), shifted glyph ids 90 %.
    other_garbage = quality.garbage - quality.glyph_code_letters
    return (quality.chars == 0 or other_garbage > 0 or quality.glyph_code_letters > GLYPH_CODE_SUSPECT * quality.chars
            or quality.long_runs > 0 or quality.rtl_letters > 0 or quality.wordlike_share < 0.8 or uses_type3())


def _prefer_second(first: str, second: str) -> bool:
    """True when `second` (pypdf) is the better text for a page than `first` (PDFium)."""
    q1, q2 = measure(first), measure(second)
    if q2.score > q1.score + SECOND_OPINION_MARGIN:
        return True
    # Same characters, different spacing: more word breaks win (P14), unless they split words.
    return (abs(q2.score - q1.score) <= SECOND_OPINION_MARGIN and same_content(first, second)
            and len(second.split()) > len(first.split()) and q2.wordlike_share >= q1.wordlike_share)


class _PypdfPages:
    """pypdf's view of the same file, opened lazily; a failure only disables the second opinion."""

    def __init__(self, path: str, password: str | None) -> None:
        self._path, self._password = path, password
        self._reader: Any = None
        self._failed = False
        self._last: tuple[int, str | None] | None = None

    def _open(self) -> Any:
        if self._reader is None and not self._failed:
            try:
                import pypdf

                reader = pypdf.PdfReader(self._path, strict=False)
                if reader.is_encrypted and not reader.decrypt(self._password or ""):
                    raise ValueError("pypdf could not decrypt")
                len(reader.pages)  # walks the page tree now, so a cyclic tree fails here
                self._reader = reader
            except Exception:  # noqa: BLE001 - pypdf is optional here; PDFium's text stands
                self._failed = True
        return self._reader

    def text(self, index: int) -> str | None:
        """pypdf's text of page `index` (0-based), or None; the last page's is kept, since a
        right-to-left page asks twice (glyph order, then the second opinion)."""
        if self._last is not None and self._last[0] == index:
            return self._last[1]
        reader = self._open()
        if reader is None:
            return None
        try:
            text = reader.pages[index].extract_text()
        except Exception:  # noqa: BLE001 - includes pypdf's LimitReachedError on bombs
            text = None
        self._last = (index, text)
        return text


class _PdfminerPages:
    """pdfminer.six's text of one page at a time; any failure only means no third opinion."""

    def __init__(self, path: str, password: str | None) -> None:
        self._path, self._password = path, password

    def text(self, index: int) -> str | None:
        try:
            from pdfminer.high_level import extract_text

            # "\f" ends each page in pdfminer's output; it is not part of the page's text.
            return extract_text(self._path, password=self._password or "", page_numbers=[index]).replace("\f", "")
        except Exception:  # noqa: BLE001 - a parser failure (or a bomb's MemoryError) costs only this opinion
            return None


def _uses_type3(page: Any, pdfium: Any) -> bool:
    """Whether the page draws text with a Type3 font (also inside form XObjects).

    PDFium has no font-type query; a Type3 font is the one font that counts as embedded
    (CPDF_Font::IsEmbedded is true for Type3) yet has no font program to return. Costs ~0.8 ms
    per page on P16.
    """
    raw = pdfium.raw
    seen: set[int] = set()
    for obj in page.get_objects(filter=[raw.FPDF_PAGEOBJ_TEXT], max_depth=3):
        font = raw.FPDFTextObj_GetFont(obj.raw)
        address = ctypes.cast(font, ctypes.c_void_p).value or 0
        if not font or address in seen:
            continue
        seen.add(address)
        if raw.FPDFFont_GetIsEmbedded(font):
            size = ctypes.c_size_t(0)
            if not raw.FPDFFont_GetFontData(font, None, 0, ctypes.byref(size)) or size.value == 0:
                return True
    return False


def _with_annotations(document: Any, index: int, page: Any, pdfium: Any) -> Any:
    """The page with its annotations drawn into its content, as a viewer shows them: typed form
    values (B03) and FreeText notes live only in annotations, which PDFium's text of the page
    leaves out. One without an appearance stream (B27) first gets the one a viewer makes: PDFium
    makes it for widgets when the page loads in the form environment (`extract` opens it), and
    for FreeText and other markup when it draws the page's annotations (the 1x1 render here).
    Annotations a viewer does not draw on screen (Hidden, NoView) stay out. Changes the
    document in memory only (it is never saved)."""
    raw = pdfium.raw
    count = raw.FPDFPage_GetAnnotCount(page.raw)
    if not count:
        return page
    for number in range(count):
        annotation = raw.FPDFPage_GetAnnot(page.raw, number)
        if not annotation:
            continue
        flags = raw.FPDFAnnot_GetFlags(annotation)
        if flags & raw.FPDF_ANNOT_FLAG_NOVIEW:  # printed, never shown: flattening skips Hidden only
            raw.FPDFAnnot_SetFlags(annotation, flags | raw.FPDF_ANNOT_FLAG_HIDDEN)
        raw.FPDFPage_CloseAnnot(annotation)
    bitmap = raw.FPDFBitmap_Create(1, 1, 0)
    if bitmap:
        try:
            raw.FPDF_RenderPageBitmap(bitmap, page.raw, 0, 0, 1, 1, 0, raw.FPDF_ANNOT)
        finally:
            raw.FPDFBitmap_Destroy(bitmap)
    if raw.FPDFPage_Flatten(page.raw, raw.FLAT_NORMALDISPLAY) != raw.FLATTEN_SUCCESS:
        return page
    page.close()
    return document[index]  # loaded again: now with the flattened content


def _count_objects(page: Any, kind: int) -> int:
    """Page objects of one kind (FPDF_PAGEOBJ_*), including those inside form XObjects."""
    return sum(1 for _ in page.get_objects(filter=[kind], max_depth=3))


class _PageTooLarge(Exception):
    def __init__(self, chars: int) -> None:
        super().__init__(f"{chars} characters")
        self.chars = chars


def _pdfium_page_text(page: Any, pdfium: Any, index: int, second: _PypdfPages,
                      layers: str | None = None) -> tuple[str, dict[str, int]]:
    """PDFium's text of what a viewer shows on the page (`pdf_visible`), and the characters left
    out by reason. Where PDFium may have reversed the letters of right-to-left ligature glyphs,
    the order whose words pypdf also finds is kept: pypdf does not reorder inside a glyph (B19).
    Raises _PageTooLarge over MAX_PAGE_CHARS characters, hidden ones included."""
    textpage = page.get_textpage()
    try:
        # Counted before anything is left out: text drawn off the page is still the page's bulk.
        if textpage.count_chars() > MAX_PAGE_CHARS:
            raise _PageTooLarge(textpage.count_chars())
        shown = visible_text(page, textpage, pdfium, layers)
    finally:
        textpage.close()
    if shown.glyphs_reversed is not None:
        reference = second.text(index)
        if reference and _shared_words(shown.glyphs_reversed, reference) > _shared_words(shown.text, reference):
            return shown.glyphs_reversed, shown.hidden
    return shown.text, shown.hidden


def _shared_words(text: str, reference: str) -> int:
    """How many of the words of `text` also occur in `reference`, compared in NFKC: pypdf keeps
    Arabic presentation forms ("ﻻ") where PDFium gives the letters ("لا")."""
    words = Counter(unicodedata.normalize("NFKC", text).split())
    return sum((words & Counter(unicodedata.normalize("NFKC", reference).split())).values())


def _open_document(pdfium: Any, path: str, password: str | None) -> tuple[Any, dict | None]:
    """Open with PDFium: (document, None), or (None, the matching error event)."""
    try:
        return pdfium.PdfDocument(path, password=password), None
    except pdfium.PdfiumError as exc:
        code = {
            pdfium.raw.FPDF_ERR_PASSWORD: "wrong_password" if password else "password_required",
            pdfium.raw.FPDF_ERR_SECURITY: "unsupported_security",
        }.get(getattr(exc, "err_code", None), "unreadable")
        return None, {"event": "error", "code": code, "page": None, "detail": str(exc)}


def _hidden_layers(path: str, password: str | None, document: Any) -> tuple[MarkedLayers | None, str | None]:
    """(The copy with the layers that are off marked, or None; why they could not be checked,
    or None)."""
    try:
        return mark_hidden_layers(path, password, document), None
    except LayersUnchecked as unchecked:
        return None, str(unchecked)


MAX_OUTLINE_ENTRIES = 5000
MAX_OUTLINE_DEPTH = 8
MAX_OUTLINE_TITLE_CHARS = 300


def _outline(document: Any) -> list[list]:
    """The bookmarks as [level, title, 0-based page]: PDFium's outline walk (it stops at cycles),
    capped in entries, depth and title length, since a hostile file can make it huge; entries that
    point at no page of this document are left out."""
    entries: list[list] = []
    try:
        for bookmark in document.get_toc(max_depth=MAX_OUTLINE_DEPTH):
            if len(entries) >= MAX_OUTLINE_ENTRIES:
                break
            dest = bookmark.get_dest()
            index = dest.get_index() if dest is not None else None
            if index is None or not 0 <= index < len(document):
                continue
            entries.append([int(bookmark.level), str(bookmark.get_title() or "")[:MAX_OUTLINE_TITLE_CHARS], int(index)])
    except Exception:  # noqa: BLE001 - a broken outline must not cost the text
        pass
    return entries


XFA_FORM_TYPES = (2, 3)  # FORMTYPE_XFA_FULL, FORMTYPE_XFA_FOREGROUND (fpdf_formfill.h)


def _is_xfa(pdfium: Any, document: Any) -> bool:
    """Whether PDFium calls the document an XFA form (it tells without an XFA-enabled build)."""
    try:
        return pdfium.raw.FPDF_GetFormType(document.raw) in XFA_FORM_TYPES
    except Exception:  # noqa: BLE001 - an older PDFium without the call: no form is read
        return False


def _page_label(document: Any, index: int) -> str:
    """Page `index`'s (0-based) printed label from the PDF's /PageLabels number tree (PDFium's
    FPDF_GetPageLabel), on one line and capped; "" where there is none or PDFium cannot tell.
    Display text only: nothing is done with it."""
    try:
        label = str(document.get_page_label(index) or "")
    except Exception:  # noqa: BLE001 - a broken number tree must not cost the page's text
        return ""
    return " ".join(label.split())[:MAX_LABEL_CHARS]


def _title(document: Any) -> str:
    try:
        return str(document.get_metadata_value("Title") or "")
    except Exception:  # noqa: BLE001 - broken metadata must not cost the text (P08)
        return ""


def extract(path: str, password: str | None, start_page: int,
            emit: Callable[[dict[str, Any]], None] = emit) -> None:
    """Stream the events for one PDF, from page `start_page` (0-based) to the end."""
    import pypdfium2 as pdfium

    document, error = _open_document(pdfium, path, password)
    if error is not None:
        emit(error)
        return
    total, opened = len(document), document
    layers, unchecked = _hidden_layers(path, password, document)
    if layers is not None:
        try:
            document = pdfium.PdfDocument(layers.data, password=password)
        except pdfium.PdfiumError:
            layers, unchecked = None, "PDFium could not read them"
    layer_check = "marked" if layers is not None else "unchecked" if unchecked else None
    # Before any page is loaded: widgets get their missing appearances as each page loads (B27).
    document.init_forms()
    emit({"event": "open", "pages": total, "title": _title(opened),
          "repaired": not pdfium.raw.FPDF_DocumentHasValidCrossReferenceTable(opened.raw),
          "layers_unchecked": unchecked, "outline": _outline(opened),
          "xfa": xfa_values(path, password) if start_page == 0 and _is_xfa(pdfium, opened) else None})
    second, third = _PypdfPages(path, password), _PdfminerPages(path, password)
    for index in range(start_page, total):
        try:
            page = document[index]
        except pdfium.PdfiumError as exc:
            emit({"event": "error", "code": "page_unreadable", "page": index + 1,
                  "detail": str(exc)})
            return
        page = _with_annotations(document, index, page, pdfium)
        try:
            (text, hidden), extractor = _pdfium_page_text(page, pdfium, index, second, layer_check), "pdfium"
        except _PageTooLarge as large:
            emit({"event": "error", "code": "page_too_large", "page": index + 1,
                  "detail": f"{large.chars} characters"})
            return
        if layers is not None and layers.hidden_annotations.get(index):
            hidden = dict(hidden)
            hidden[HIDDEN_REASON] = hidden.get(HIDDEN_REASON, 0) + layers.hidden_annotations[index]
        # A page without text objects (P16's 12 blank pages) has nothing pypdf could find either.
        # Nor is it asked where text was hidden: it would give the hidden text back (B14).
        has_text = bool(text.strip()) or _count_objects(page, pdfium.raw.FPDF_PAGEOBJ_TEXT) > 0
        if has_text and not hidden and _needs_second_opinion(measure(text), lambda: _uses_type3(page, pdfium)):
            alternative = second.text(index)
            if (alternative and len(alternative) <= MAX_PAGE_CHARS
                    and _prefer_second(text, alternative)):
                text, extractor = alternative, "pypdf"
            if is_unreliable(measure(text)):
                alternative = third.text(index)
                if (alternative and len(alternative) <= MAX_PAGE_CHARS
                        and measure(alternative).score > measure(text).score + SECOND_OPINION_MARGIN):
                    text, extractor = alternative, "pdfminer"
        # pdfminer gives right-to-left words in the order they are drawn, backwards (visual_order).
        text = logical_order(text)
        images = 0 if text.strip() else _count_objects(page, pdfium.raw.FPDF_PAGEOBJ_IMAGE)
        share = _image_share(page, pdfium) if 0 < len(text.strip()) <= STAMP_MAX_CHARS else 0.0
        page.close()
        emit({"event": "page", "page": index + 1, "text": text, "extractor": extractor,
              "images": images, "label": _page_label(opened, index), "hidden": hidden, "image_share": round(share, 3)})
    emit({"event": "attachments", "files": attachments(opened, pdfium)})
    emit({"event": "done"})


def main() -> int:
    """Read one request from stdin and stream events to stdout; exit status 0 unless crashed."""
    logging.disable(logging.WARNING)  # pypdf logs thousands of font warnings on P15
    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.readline())
    limit_memory(int(request.get("memory_bytes", 0)))
    extract(request["path"], request.get("password"), int(request.get("start_page", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
