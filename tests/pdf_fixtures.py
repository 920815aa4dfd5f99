"""PDFs made in a test's temporary folder: text drawn with an embedded TrueType font.

`truetype_pdf` writes a one-page PDF whose text uses a Type0 font (Identity-H, CIDs = glyph ids)
with an embedded TrueType program built by fontTools (box outlines; extractors only need the
cmap) and a /ToUnicode map, as office suites write them. `strip_to_unicode` removes every
/ToUnicode entry with pypdf: the text is then only glyph ids, which PDFium prints as "shifted"
characters ("7KH" for "The" when glyph ids are code points minus 29), while the font's own cmap
still knows the letters (what pdfminer.six reads).
"""

from __future__ import annotations

import io
from pathlib import Path

import pypdf
from fontTools.fontBuilder import FontBuilder
from fontTools.pens.ttGlyphPen import TTGlyphPen
from pypdf.generic import NameObject

GLYPH_SHIFT = 29  # gid = code point - 29 for ASCII: the order of Apple's standard glyph set


def _font(chars: str) -> tuple[bytes, dict[str, int]]:
    """A TrueType font covering `chars`; ASCII at code point - 29, other letters after 0x100."""
    gids: dict[str, int] = {}
    extra = 0x100
    for ch in sorted(set(chars)):
        if ord(ch) < 0x80:
            gids[ch] = ord(ch) - GLYPH_SHIFT
        else:
            gids[ch], extra = extra, extra + 1
    order = [".notdef"] + [f"g{i}" for i in range(1, max(gids.values()) + 1)]
    pen = TTGlyphPen(None)
    pen.moveTo((50, 0))
    for point in ((50, 700), (450, 700), (450, 0)):
        pen.lineTo(point)
    pen.closePath()
    box = pen.glyph()
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder(order)
    builder.setupCharacterMap({ord(ch): order[gid] for ch, gid in gids.items()})
    builder.setupGlyf({name: box for name in order})
    builder.setupHorizontalMetrics({name: (500, 50) for name in order})
    builder.setupHorizontalHeader(ascent=800, descent=-200)
    builder.setupNameTable({"familyName": "HalamanBox", "styleName": "Regular"})
    builder.setupOS2()
    builder.setupPost()
    data = io.BytesIO()
    builder.save(data)
    return data.getvalue(), gids


def truetype_pdf(path: Path, lines: list[str]) -> Path:
    """Write a one-page PDF showing `lines` in an embedded TrueType font with a /ToUnicode map."""
    font, gids = _font("".join(lines))
    content = b"BT /F1 14 Tf 72 760 Td 18 TL\n" + b"".join(
        b"<" + "".join(f"{gids[ch]:04X}" for ch in line).encode() + b"> Tj T*\n" for line in lines) + b"ET"
    bfchars = "\n".join(f"<{gid:04X}> <{ch.encode('utf-16-be').hex().upper()}>"
                        for ch, gid in sorted(gids.items(), key=lambda item: item[1]))
    cmap = (f"/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Box def /CMapType 2 def\n"
            f"1 begincodespacerange <0000> <FFFF> endcodespacerange\n{len(gids)} beginbfchar\n{bfchars}\n"
            "endbfchar endcmap CMapName currentdict /CMap defineresource pop end end").encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        _stream(content),
        b"<< /Type /Font /Subtype /Type0 /BaseFont /HalamanBox /Encoding /Identity-H "
        b"/DescendantFonts [6 0 R] /ToUnicode 9 0 R >>",
        b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /HalamanBox /CIDToGIDMap /Identity "
        b"/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> /DW 500 /FontDescriptor 7 0 R >>",
        b"<< /Type /FontDescriptor /FontName /HalamanBox /Flags 32 /FontBBox [0 -200 500 800] /ItalicAngle 0 "
        b"/Ascent 800 /Descent -200 /CapHeight 700 /StemV 80 /FontFile2 8 0 R >>",
        _stream(font),
        _stream(cmap),
    ]
    return write_pdf(path, objects)


def write_pdf(path: Path, objects: list[bytes]) -> Path:
    """Write `objects` (object 1 the catalog) as a PDF with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def helvetica_pdf(path: Path, content: bytes, page_box: bytes = b"/MediaBox [0 0 612 792]") -> Path:
    """Write a one-page PDF whose content stream is `content`, with Helvetica as /F1.

    `page_box` is written into the page dictionary as is (a /MediaBox, optionally a /CropBox).
    """
    return write_pdf(path, [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R " + page_box + b" /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        _stream(content),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ])


def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def strip_to_unicode(source: Path, target: Path) -> Path:
    """Copy `source` to `target` without any font's /ToUnicode entry (pypdf)."""
    writer = pypdf.PdfWriter(clone_from=str(source))
    for page in writer.pages:
        for font in page["/Resources"]["/Font"].values():
            font = font.get_object()
            if "/ToUnicode" in font:
                del font[NameObject("/ToUnicode")]
    writer.write(str(target))
    return target


def helvetica_book(path: Path, pages: list[list[str]], size: int = 10) -> Path:
    """Write a PDF of `len(pages)` Letter pages, each showing its lines in Helvetica (`size` pt,
    one line of text per string, from the top left margin)."""
    def escape(line: str) -> bytes:
        return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")

    count = len(pages)
    font = 3 + 2 * count  # objects: catalog, pages, then a page and its content per page, the font
    kids = b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % count]
    for i, lines in enumerate(pages):
        content = b"BT /F1 %d Tf 72 740 Td %d TL\n" % (size, int(size * 1.6)) + b"".join(
            b"(" + escape(line) + b") Tj T*\n" for line in lines) + b"ET"
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                       b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (4 + 2 * i, font))
        objects.append(_stream(content))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    return write_pdf(path, objects)
