"""Reading order of the lines of a PDF page whose text a viewer shows turned on its side.

Runs in the PDF worker (`engine.documents.pdf_visible`). PDFium orders a page's lines in the
page as a viewer shows it (after /Rotate), and where lines run top to bottom on screen it gives
them from left to right: right for text that runs upwards (a landscape table set in a portrait
page, read by turning the page clockwise), but backwards for text that runs downwards, whose next
line is to the left of the one before (a portrait page with /Rotate 90, a table set with a text
matrix of 0 -1 1 0). Measured with pypdfium2 5.15: three lines came out last first in both cases,
first first for upward, upside-down and normal text.

Vertical Japanese and Chinese (Identity-V fonts: upright glyphs in columns read top to bottom,
columns from right to left) are lines that run down the screen too, and PDFium gave the columns
from the left, last column first.

The fix looks at the lines themselves, not at PDFium's reason: every line's direction (from its
first to its last character, in the page's own space) gives the direction in which the next line
follows, and a block of consecutive lines that all run down the screen and that PDFium
gives in exactly the opposite of that order is put the other way round. Nothing else is moved:
ordinary pages, columns and tables keep PDFium's order.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

LINE_BREAK = "\r\n"
"""How PDFium separates the lines of a text page (characters it generates)."""

_SAME_DIRECTION = 0.98  # cosine of ~11°: lines of one rotated block share a direction


@dataclass(frozen=True)
class _Line:
    direction: tuple[float, float]  # unit direction of the line in page space; (0, 0) when unknown
    advance: float                  # position along the direction in which the next line follows
    height: float                   # font size in points, for "same line" tolerance


def line_order(page: Any, textpage: Any, raw: Any) -> list[int] | None:
    """The order in which to read the lines of PDFium's text of `page` (indices into its
    `LINE_BREAK`-separated lines), or None when PDFium's order stands (almost every page).
    `textpage`: the page's `PdfTextPage`; `raw`: pypdfium2's raw module. Costs a few µs per line.
    """
    lines = _lines(textpage, raw)
    if len(lines) < 2:
        return None
    rotation = page.get_rotation() % 360
    order = list(range(len(lines)))
    changed = False
    start = 0
    while start < len(lines):
        end = start + 1
        if _runs_down_screen(lines[start].direction, rotation):
            while end < len(lines) and _same_direction(lines[end].direction, lines[start].direction):
                end += 1
            block = _reversed_block(lines[start:end])
            if block is not None:
                order[start:end] = [start + index for index in block]
                changed = True
        start = end
    return order if changed else None


def in_order(text: str, order: list[int] | None) -> str:
    """`text` (PDFium's lines, `LINE_BREAK`-separated) with its lines in `order`; unchanged when
    `order` is None or does not match its lines (text was cut out of the page in between)."""
    if order is None:
        return text
    lines = text.split(LINE_BREAK)
    if len(lines) != len(order):
        return text
    return LINE_BREAK.join(lines[index] for index in order)


def _lines(textpage: Any, raw: Any) -> list[_Line]:
    """One entry per PDFium line: its direction and the position of its first drawn character.
    The line breaks and drawn characters are found in the page's text, one string from PDFium
    (0.1 ms a page); only where that string does not have one character per index (characters
    outside the Basic Multilingual Plane) is PDFium asked character by character."""
    handle = textpage.raw
    count = textpage.count_chars()
    text = textpage.get_text_range(0, count) if count else ""
    if len(text) != count:
        text = "".join(chr(raw.FPDFText_GetUnicode(handle, index)) for index in range(count))
    lines: list[_Line] = []
    start = 0
    while start <= count:
        end = text.find(LINE_BREAK, start)
        end = count if end < 0 else end
        drawn = [index for index in range(start, end) if not text[index].isspace()]
        lines.append(_line(raw, handle, drawn[0] if drawn else None, drawn[-1] if drawn else None))
        start = end + len(LINE_BREAK)
    return lines


def _line(raw: Any, handle: Any, first: int | None, last: int | None) -> _Line:
    """The line from its first to its last drawn character: the direction in which its
    characters follow each other (vertical CJK, Identity-V, has upright glyphs in a column), else,
    for a single character, its baseline (the character matrix's first column)."""
    unknown = _Line((0.0, 0.0), 0.0, 0.0)
    if first is None or last is None:
        return unknown
    start, end = _origin(raw, handle, first), _origin(raw, handle, last)
    size = max(raw.FPDFText_GetFontSize(handle, first), 1.0)
    if start is None or end is None:
        return unknown
    dx, dy = end[0] - start[0], end[1] - start[1]
    if math.hypot(dx, dy) < size / 2:
        matrix = raw.FS_MATRIX()
        if not raw.FPDFText_GetMatrix(handle, first, matrix):
            return unknown
        dx, dy = matrix.a, matrix.b
    length = math.hypot(dx, dy)
    if length == 0:
        return unknown
    dx, dy = dx / length, dy / length
    # The next line follows a quarter turn clockwise from the line's direction: below, for
    # normal text; to the left, for text and CJK columns that run downwards.
    return _Line((dx, dy), start[0] * dy - start[1] * dx, size)


def _origin(raw: Any, handle: Any, index: int) -> tuple[float, float] | None:
    x, y = ctypes.c_double(), ctypes.c_double()
    if not raw.FPDFText_GetCharOrigin(handle, index, x, y):
        return None
    return x.value, y.value


def _runs_down_screen(direction: tuple[float, float], rotation: int) -> bool:
    """Whether a baseline in `direction` (page space) points down on screen once the page is
    turned `rotation` degrees clockwise (/Rotate)."""
    dx, dy = direction
    if dx == dy == 0:
        return False
    turn = math.radians(rotation)
    screen_dy = dy * math.cos(turn) - dx * math.sin(turn)  # y up, clockwise turn
    return screen_dy < -_SAME_DIRECTION


def _same_direction(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] * b[0] + a[1] * b[1] > _SAME_DIRECTION


def _reversed_block(lines: list[_Line]) -> list[int] | None:
    """The order (indices into `lines`) that reads a block given backwards, or None when the
    block is not in exactly the opposite of reading order. Lines closer than half a font size
    along the advance are one row (cells of a table row that PDFium split) and keep their order."""
    rows: list[list[int]] = [[0]]
    for index in range(1, len(lines)):
        previous = lines[rows[-1][0]]
        if abs(lines[index].advance - previous.advance) < previous.height / 2:
            rows[-1].append(index)
        elif lines[index].advance < previous.advance:
            rows.append([index])
        else:
            return None
    if len(rows) < 2:
        return None
    return [index for row in reversed(rows) for index in row]
