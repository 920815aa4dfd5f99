"""Which characters of a PDF page a viewer shows, measured with PDFium's per-character data.

Runs in the PDF worker (`engine.documents.pdf_worker`). A PDF can carry text that no viewer
draws: outside the page's visible box (B14 in docs/REAL_WORLD_INPUTS.md: printer slugs beyond
the CropBox, a planted "note to the assistant" at x = -400), in an invisible render mode
(`3 Tr`, or `7 Tr`, clip only; except over an image, where it is a scan's OCR layer), fully
transparent, too small to see (a 0.1 pt font or a text
matrix that shrinks a 12 pt font to 0.12 pt), white on a white page, or in a layer the document's
default view switches off (B24; `engine.documents.pdf_layers` marks those). Extractors return all
of it as page text, spliced into the visible lines, which is how planted instructions reach a
model. `visible_text` drops it and says how many characters it dropped.

It also finds the glyphs whose letters PDFium may have reversed: a ligature whose ToUnicode gives
several letters (Arabic lam-alef "لا", B19) comes out of PDFium's right-to-left reordering
backwards ("ال", "the", for "no"), because PDFium reverses the run character by character. The
letters of one glyph are the consecutive characters that PDFium gives the same box.

PDFium itself already leaves out text drawn with a 0 pt font. What it does not tell: text clipped
away by a clipping path or covered by an image or a filled shape is still counted as visible.
"""

from __future__ import annotations

import ctypes
import unicodedata
from dataclasses import dataclass
from typing import Any

from engine.documents.pdf_layers import HIDDEN_REASON, UNCHECKED_REASON, hidden_text_objects
from engine.documents.pdf_order import in_order, line_order

MIN_EM_PT = 1.0
"""A character whose em box (PDFium's loose box: the font's ascent to descent at its drawn size)
is smaller than this many points on both axes is invisible: 1 pt is 1.3 pixels at 100 % zoom.
The smallest em box of a shown character in the corpus is 4.8 pt (P15's indices; P16: 8.2 pt)."""

LIGHT_FILL = 240
"""Fill colours with every channel at least this high (0-255) are checked against the rendered
page: white text is visible only on a darker background."""

SAME_COLOUR = 16
"""How much darker than LIGHT_FILL the rendered box of a light character may be and still count
as the same colour (anti-aliased edges of white glyphs on white)."""

_INVISIBLE_MODES = frozenset({3, 7})  # ISO 32000-1 table 106: neither fill nor stroke


@dataclass(frozen=True)
class PageText:
    """A page's visible text (PDFium's order and spacing) and the characters left out, by reason.

    hidden: reason → number of characters, reasons "outside the page", "invisible render mode",
    "transparent", "too small to see", "same colour as the page", "in a hidden layer", "in a layer
    that could not be checked"; empty when nothing was hidden.
    glyphs_reversed: the same text with the letters of each multi-letter right-to-left glyph in
    the opposite order, or None when the page has no such glyph. Which of the two is right PDFium
    does not say (it reverses a ToUnicode string of several letters, but not the letters it
    itself decomposes a presentation-form ligature into); the worker asks pypdf.
    """

    text: str
    hidden: dict[str, int]
    glyphs_reversed: str | None = None


def visible_box(page: Any) -> tuple[float, float, float, float]:
    """(left, bottom, right, top) in PDF points of what a viewer shows: CropBox ∩ MediaBox.

    ISO 32000-1 14.11.2: the CropBox is clipped to the MediaBox. PDFium's page bounding box is
    that intersection, with boxes inherited from the page tree (pypdfium2's `get_mediabox` falls
    back to US Letter for an inherited one: B01's A4 pages). Both are in the page's own
    coordinates (before /Rotate), the same space as PDFium's character boxes.
    """
    return page.get_bbox()


def visible_text(page: Any, textpage: Any, pdfium: Any, layers: str | None = None) -> PageText:
    """The text of `page` (a pypdfium2 `PdfPage`, `textpage` its `PdfTextPage`) as a viewer
    shows it: hidden characters left out; with `glyphs_reversed` when glyphs of several
    right-to-left letters may be in the wrong order. `layers`: "marked" when the page is of a
    copy that `pdf_layers.mark_hidden_layers` marked (its marked text objects are hidden too),
    "unchecked" when the layers could not be checked (the text of every layer is left out).

    Whitespace and the characters PDFium generated (spaces, line breaks) share the verdict of
    the character before them. Where hidden characters are cut out, the visible pieces on either
    side are joined by nothing when the cut held no whitespace, else by a space (a line break if
    the cut held one), so words are neither glued nor split. A page is looked at character by
    character (9 µs each on P15 and P16) only when a cheap screen of its text rectangles and text
    objects finds something that could be hidden (26 of P16's 288 pages, 90 of P15's 117: short
    rectangles around punctuation), or when it has right-to-left letters. Lines of text that
    runs down the screen come in reading order (`engine.documents.pdf_order`).
    """
    raw = pdfium.raw
    order = line_order(page, textpage, raw)  # lines of text that runs down the screen (pdf_order)
    text = in_order(_pdfium_text(textpage, 0, textpage.count_chars()), order)
    layer_hidden = hidden_text_objects(page, raw, every_layer=layers == "unchecked") if layers else set()
    if not (layer_hidden or _may_hide(page, textpage, raw) or any(_is_rtl(ch) for ch in text)):
        return PageText(text, {})
    reasons, clusters = _characters(page, textpage, raw, layer_hidden,
                                    UNCHECKED_REASON if layers == "unchecked" else HIDDEN_REASON)
    counts: dict[str, int] = {}
    for reason in reasons:
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    if not counts and not clusters:
        return PageText(text, {})
    return PageText(in_order(_assemble(textpage, reasons, {}), order), counts,
                    in_order(_assemble(textpage, reasons, clusters), order) if clusters else None)


def _assemble(textpage: Any, reasons: list[str], reversed_glyphs: dict[int, int]) -> str:
    """The text of the shown characters, each glyph of `reversed_glyphs` ({first index: length})
    with its characters in the opposite order."""
    pieces: list[str] = []
    index = 0
    while index < len(reasons):
        end = index + reversed_glyphs.get(index, 1)
        if index not in reversed_glyphs:
            while (end < len(reasons) and end not in reversed_glyphs
                   and bool(reasons[end]) == bool(reasons[index])):
                end += 1
        piece = _pdfium_text(textpage, index, end - index)
        if not reasons[index]:
            pieces.append(piece[::-1] if index in reversed_glyphs else piece)
        elif pieces and not pieces[-1][-1:].isspace():
            pieces.append("\n" if "\n" in piece else " " if any(ch.isspace() for ch in piece) else "")
        index = end
    return "".join(pieces)


def _pdfium_text(textpage: Any, index: int, count: int) -> str:
    # PDFium writes U+FFFE where it joined a word hyphenated across a line end
    # ("adip\ufffeiscing", P11); print it as the page shows it, like pypdf does.
    return textpage.get_text_range(index, count).replace("\ufffe", "-\n") if count else ""


def _is_rtl(char: str) -> bool:
    return unicodedata.bidirectional(char) in ("R", "AL")


def _may_hide(page: Any, textpage: Any, raw: Any) -> bool:
    """Whether anything on the page could be hidden: a text rectangle (PDFium's boxes around
    runs of characters) not inside the visible box or under MIN_EM_PT high or wide, or a text
    object drawn invisibly, transparent or in a light colour. Costs 1-1.5 ms per page (P15, P16)."""
    left, bottom, right, top = visible_box(page)
    for index in range(textpage.count_rects()):
        rect_left, rect_bottom, rect_right, rect_top = textpage.get_rect(index)
        if (rect_left < left or rect_right > right or rect_bottom < bottom or rect_top > top
                or min(rect_right - rect_left, rect_top - rect_bottom) < MIN_EM_PT):
            return True
    red, green, blue, alpha = (ctypes.c_uint() for _ in range(4))
    for obj in page.get_objects(filter=[raw.FPDF_PAGEOBJ_TEXT], max_depth=3):
        if raw.FPDFTextObj_GetTextRenderMode(obj.raw) in _INVISIBLE_MODES:
            return True
        if raw.FPDFPageObj_GetFillColor(obj.raw, red, green, blue, alpha) and (
                alpha.value == 0 or min(red.value, green.value, blue.value) >= LIGHT_FILL):
            return True
    return False


def _characters(page: Any, textpage: Any, raw: Any, layer_hidden: set[int],
                layer_reason: str) -> tuple[list[str], dict[int, int]]:
    """(why each character is hidden, "" when shown; {first index: length} of every glyph that
    gave several characters among which a right-to-left letter). `layer_hidden`: addresses of
    the text objects in layers that are off, left out for `layer_reason`."""
    left, bottom, right, top = visible_box(page)
    handle = textpage.raw
    modes: dict[int, int] = {}
    box = raw.FS_RECTF()
    red, green, blue, alpha = (ctypes.c_uint() for _ in range(4))
    reasons: list[str] = []
    light: list[int] = []
    clusters: dict[int, int] = {}
    previous, previous_box, cluster_start = "", None, 0
    images: list[tuple[float, float, float, float]] | None = None
    for index in range(textpage.count_chars()):
        char = chr(raw.FPDFText_GetUnicode(handle, index))
        if raw.FPDFText_IsGenerated(handle, index) == 1 or char.isspace():
            reasons.append(previous)
            previous_box = None
            continue
        raw.FPDFText_GetLooseCharBox(handle, index, box)
        this_box = (box.left, box.bottom, box.right, box.top)
        if this_box != previous_box:
            cluster_start = index
        elif any(_is_rtl(chr(raw.FPDFText_GetUnicode(handle, i))) for i in range(cluster_start, index + 1)):
            clusters[cluster_start] = index + 1 - cluster_start
        previous_box = this_box
        reason = ""
        if layer_hidden and _text_object(raw, handle, index) in layer_hidden:
            reason = layer_reason
        elif box.right <= left or box.left >= right or box.top <= bottom or box.bottom >= top:
            reason = "outside the page"
        elif box.right - box.left < MIN_EM_PT and box.top - box.bottom < MIN_EM_PT:
            reason = "too small to see"
        elif _render_mode(raw, handle, index, modes) in _INVISIBLE_MODES:
            if images is None:
                images = _image_boxes(page, raw)
            centre_x, centre_y = (box.left + box.right) / 2, (box.bottom + box.top) / 2
            if not any(x0 <= centre_x <= x1 and y0 <= centre_y <= y1 for x0, y0, x1, y1 in images):
                reason = "invisible render mode"
        elif raw.FPDFText_GetFillColor(handle, index, red, green, blue, alpha):
            if alpha.value == 0:
                reason = "transparent"
            elif min(red.value, green.value, blue.value) >= LIGHT_FILL:
                light.append(index)
        reasons.append(reason)
        previous = reason
    if light:
        for index in _same_colour_as_page(page, textpage, raw, light):
            following = index + 1  # the whitespace after it went with it
            while following < len(reasons) and reasons[following] == "" and following not in light and (
                    raw.FPDFText_IsGenerated(handle, following) == 1
                    or chr(raw.FPDFText_GetUnicode(handle, following)).isspace()):
                reasons[following] = "same colour as the page"
                following += 1
            reasons[index] = "same colour as the page"
    return reasons, clusters


def _image_boxes(page: Any, raw: Any) -> list[tuple[float, float, float, float]]:
    """(left, bottom, right, top) of the page's images. Invisible text over an image is what OCR
    (ocrmypdf, Tesseract, scanners) writes over a scan, and the image shows those words: kept.
    Images inside form XObjects count with their bounds in the form's space, which is the page's
    for the usual unscaled form."""
    return [obj.get_bounds() for obj in page.get_objects(filter=[raw.FPDF_PAGEOBJ_IMAGE], max_depth=3)]


def _text_object(raw: Any, handle: Any, index: int) -> int:
    """Address of the text object that drew character `index` (0: none)."""
    return ctypes.cast(raw.FPDFText_GetTextObject(handle, index), ctypes.c_void_p).value or 0


def _render_mode(raw: Any, handle: Any, index: int, cache: dict[int, int]) -> int:
    """The text render mode (`Tr`) of the text object that drew character `index`."""
    obj = raw.FPDFText_GetTextObject(handle, index)
    address = ctypes.cast(obj, ctypes.c_void_p).value or 0
    if address not in cache:
        cache[address] = raw.FPDFTextObj_GetTextRenderMode(obj) if address else 0
    return cache[address]


def _same_colour_as_page(page: Any, textpage: Any, raw: Any, candidates: list[int]) -> list[int]:
    """The light-coloured characters among `candidates` whose box, rendered, is light all over:
    white on white, nothing of them can be seen. Renders the page once at 72 dpi (3.6 ms for a
    P16 page, 7.1 ms for P15)."""
    bitmap = page.render(scale=1, may_draw_forms=False)
    try:
        # Bytes, not numpy: the worker's address-space cap leaves no room for BLAS threads.
        pixels = bytes(bitmap.buffer)
        width, height, stride, channels = bitmap.width, bitmap.height, bitmap.stride, bitmap.n_channels
    finally:
        bitmap.close()
    corner_x, corner_y = ctypes.c_int(), ctypes.c_int()

    def pixel(x: float, y: float) -> tuple[int, int]:
        # PageToDevice applies the page's /Rotate exactly as the render did.
        raw.FPDF_PageToDevice(page.raw, 0, 0, width, height, 0, x, y, corner_x, corner_y)
        return corner_x.value, corner_y.value

    found = []
    for index in candidates:
        left, bottom, right, top = textpage.get_charbox(index, loose=True)
        (x0, y0), (x1, y1) = pixel(left, bottom), pixel(right, top)
        columns = range(max(0, min(x0, x1)) * channels, min(width, max(x0, x1) + 1) * channels)
        rows = range(max(0, min(y0, y1)), min(height, max(y0, y1) + 1))
        if columns and rows and min(min(pixels[row * stride + columns.start:row * stride + columns.stop])
                                    for row in rows) >= LIGHT_FILL - SAME_COLOUR:
            found.append(index)
    return found
