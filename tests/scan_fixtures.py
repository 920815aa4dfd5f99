"""Scans made in a test: text drawn into an image with Pillow's own scalable font (FreeType, the
same on every machine), written as PNG/JPEG/TIFF or as image pages of a hand-written PDF, with an
optional line of real text over the image (an e-signature envelope ID, a Bates stamp)."""

from __future__ import annotations

import zlib
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from pdf_fixtures import write_pdf

PAGE_PX = (1275, 1650)  # US Letter at 150 dpi
TOP_PX, LINE_PX, LEFT_PX = 150, 60, 110


def scan_image(lines: list[str], size: tuple[int, int] = PAGE_PX, font_px: int = 34) -> Image.Image:
    """A white greyscale page with `lines` in black, one every LINE_PX pixels from TOP_PX."""
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=font_px)
    for number, line in enumerate(lines):
        draw.text((LEFT_PX, TOP_PX + number * LINE_PX), line, fill=0, font=font)
    return image


def line_box_px(number: int, size: tuple[int, int] = PAGE_PX) -> tuple[float, float]:
    """(top, bottom) in pixels from the top of line `number` (0-based) of `scan_image`."""
    return TOP_PX + number * LINE_PX, TOP_PX + number * LINE_PX + 40


def _escape(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def scan_pdf(path: Path, pages: list[Image.Image | list[str]], stamp: str | None = None) -> Path:
    """Write a Letter-size PDF: an Image is a scanned page (the image over the whole page, Flate
    greyscale, plus `stamp` as real Helvetica text at the top when given); a list of strings is a
    text page (those lines in Helvetica 12 pt)."""
    count = len(pages)
    kids = b" ".join(b"%d 0 R" % (3 + 3 * i) for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % count]
    font = 3 + 3 * count
    for i, page in enumerate(pages):
        own = 3 + 3 * i
        if isinstance(page, Image.Image):
            grey = page.convert("L")
            content = b"q 612 0 0 792 0 0 cm /Im1 Do Q"
            if stamp:
                content += b" BT /F1 8 Tf 40 775 Td (" + _escape(stamp) + b") Tj ET"
            image = (b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
                     b"/BitsPerComponent 8 /Filter /FlateDecode /Length %d >>\nstream\n"
                     % (grey.width, grey.height, len(data := zlib.compress(grey.tobytes())))) + data + b"\nendstream"
        else:
            content = b"BT /F1 12 Tf 72 720 Td 16 TL\n" + b"".join(b"(" + _escape(line) + b") Tj T*\n" for line in page) + b"ET"
            image = b"<< >>"  # unused placeholder object keeps the numbering regular
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R /Resources "
                       b"<< /Font << /F1 %d 0 R >> /XObject << /Im1 %d 0 R >> >> >>" % (own + 1, font, own + 2))
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        objects.append(image)
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    return write_pdf(path, objects)
