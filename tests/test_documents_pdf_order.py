"""Reading order of PDF pages as a viewer shows them (issue 45): lines on pages turned on their
side, right-to-left text stored in visual order, vertical CJK columns, embedded attachments.
Every input is written here from scratch (hand-written content streams, pypdf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.documents import load_document
from pdf_fixtures import helvetica_pdf

LINES = ["First line of the landscape table", "Second line comes next", "Third line is last"]


def _lines_pdf(path: Path, text_matrix: bytes, page_box: bytes) -> Path:
    content = b"BT /F1 12 Tf " + text_matrix + b" Tm 16 TL\n" + b"".join(
        b"(" + line.encode() + b") Tj T*\n" for line in LINES) + b"ET"
    return helvetica_pdf(path, content, page_box)


def _in_reading_order(text: str) -> bool:
    positions = [text.find(line) for line in LINES]
    return -1 not in positions and positions == sorted(positions)


@pytest.mark.parametrize("name, text_matrix, page_box", [
    # A portrait page turned a quarter clockwise (/Rotate 90) with text set as usual: a viewer
    # shows the lines running down the screen, first line rightmost. PDFium gave it last first.
    ("rotate-90", b"1 0 0 1 72 720", b"/MediaBox [0 0 612 792] /Rotate 90"),
    # A landscape table set in a portrait page with a text matrix that runs the text downwards.
    ("text-downwards", b"0 -1 1 0 500 720", b"/MediaBox [0 0 612 792]"),
    # Controls that PDFium already read right: they must stay right.
    ("text-upwards", b"0 1 -1 0 100 72", b"/MediaBox [0 0 612 792]"),
    ("rotate-90-text-upwards", b"0 1 -1 0 100 72", b"/MediaBox [0 0 612 792] /Rotate 90"),
    ("rotate-270", b"1 0 0 1 72 720", b"/MediaBox [0 0 612 792] /Rotate 270"),
    ("rotate-180", b"1 0 0 1 72 720", b"/MediaBox [0 0 612 792] /Rotate 180"),
    ("rotate-90-text-downwards", b"0 -1 1 0 500 720", b"/MediaBox [0 0 612 792] /Rotate 90"),
    ("upright", b"1 0 0 1 72 720", b"/MediaBox [0 0 612 792]"),
])
def test_lines_of_a_page_on_its_side_come_in_reading_order(tmp_path, name, text_matrix, page_box):
    document = load_document(_lines_pdf(tmp_path / f"{name}.pdf", text_matrix, page_box))
    text = document.segments[0].text
    assert _in_reading_order(text), (name, text)


def test_a_rotated_table_with_split_cells_keeps_each_row_together(tmp_path):
    """Cells of one row that PDFium gives as separate lines stay in their order; rows are read
    first to last (the table runs down the screen on a page with /Rotate 90). A control: PDFium
    already reads this one right, and the reordering must not break it."""
    rows = [("Item", "Amount"), ("Rent", "1200"), ("Power", "85")]
    content = b"BT /F1 12 Tf 16 TL\n" + b"".join(
        b"1 0 0 1 72 %d Tm (%s) Tj 1 0 0 1 400 %d Tm (%s) Tj\n" % (700 - 20 * i, a.encode(), 700 - 20 * i, b.encode())
        for i, (a, b) in enumerate(rows)) + b"ET"
    document = load_document(helvetica_pdf(tmp_path / "table.pdf", content, b"/MediaBox [0 0 612 792] /Rotate 90"))
    text = document.segments[0].text
    positions = [text.find(word) for row in rows for word in row]
    assert -1 not in positions and positions == sorted(positions), text


# --- embedded files ----------------------------------------------------------------------------

def _with_attachments(tmp_path: Path, files: dict[str, bytes]) -> Path:
    import pypdf

    page = helvetica_pdf(tmp_path / "page.pdf", b"BT /F1 12 Tf 72 720 Td (Quarterly report, see the attached data) Tj ET")
    writer = pypdf.PdfWriter(clone_from=str(page))
    for name, data in files.items():
        writer.add_attachment(name, data)
    target = tmp_path / "report.pdf"
    writer.write(str(target))
    return target


def test_embedded_files_are_read_when_text_and_named_when_not(tmp_path):
    """Before: the document was its page only, and nothing said that files were embedded."""
    nested = helvetica_pdf(tmp_path / "inner.pdf", b"BT /F1 12 Tf 72 720 Td (Inner secret page) Tj ET").read_bytes()
    document = load_document(_with_attachments(tmp_path, {
        "figures.csv": b"region,revenue\nNorth,4.2 million\nSouth,3.1 million\n",
        "budget.xlsx": b"PK\x03\x04" + bytes(200),
        "annex.pdf": nested,
    }))
    assert document.segments[0].label == "page 1"
    csv = [segment for segment in document.segments if segment.label == "attachment figures.csv"]
    assert csv and "North,4.2 million" in csv[0].text
    # A PDF inside the PDF is named, never parsed: its text is nowhere.
    assert not any("Inner secret page" in segment.text for segment in document.segments)
    unread = [warning for warning in document.warnings if "not read" in warning]
    assert len(unread) == 1 and "budget.xlsx" in unread[0] and "annex.pdf" in unread[0]
    assert "report.pdf" in unread[0] and "save it from a PDF viewer" in unread[0]
    assert any("figures.csv" in warning and "read as extra parts" in warning for warning in document.warnings)


def test_a_large_text_attachment_is_named_not_read(tmp_path):
    from engine.documents.pdf_attachments import MAX_ATTACHMENT_BYTES

    document = load_document(_with_attachments(tmp_path, {"log.txt": b"line\n" * (MAX_ATTACHMENT_BYTES // 5 + 1)}))
    assert [segment.label for segment in document.segments] == ["page 1"]
    assert any("log.txt" in warning and "over 1 MiB" in warning for warning in document.warnings)


# --- right-to-left text stored in visual order -------------------------------------------------

# (logical order, as stored: the glyphs left to right as a viewer shows them)
RTL_LINES = [
    ("הגיבוי של השרת נכשל אתמול בלילה", "הלילב לומתא לשכנ תרשה לש יוביגה"),
    ("צריך לבדוק את הדיסק מחר בבוקר", "רקובב רחמ קסידה תא קודבל ךירצ"),
    ("הגיבוי נכשל ב-3 במרץ 2024 בשעה 14:30", "14:30 העשב 2024 ץרמב 3-ב לשכנ יוביגה"),
    ("فشل النسخ الاحتياطي في 2024 للخادم DB-01", "DB-01 مداخلل 2024 يف يطايتحالا خسنلا لشف"),
]


def test_right_to_left_lines_stored_in_visual_order_come_out_in_logical_order(tmp_path):
    """Hebrew and Arabic drawn as displayed, in a font without a Unicode map (so the third
    opinion, pdfminer.six, reads the font's own cmap). Before: every word came out backwards,
    "ךירצ" for "צריך" (a final kaf starting a word)."""
    from pdf_fixtures import strip_to_unicode, truetype_pdf

    source = truetype_pdf(tmp_path / "source.pdf", [visual for _, visual in RTL_LINES])
    document = load_document(strip_to_unicode(source, tmp_path / "visual.pdf"))
    text = document.segments[0].text
    for logical, _ in RTL_LINES:
        assert logical in text, (logical, text)


def test_right_to_left_text_in_logical_order_is_left_as_it_is():
    from engine.documents.visual_order import logical_order

    page = "\n".join(logical for logical, _ in RTL_LINES) + "\nمثلا هذه المدينة جميلة جدا"
    assert logical_order(page) == page
    assert logical_order("\n".join(visual for _, visual in RTL_LINES)) == "\n".join(logical for logical, _ in RTL_LINES)


# --- vertical Japanese ---------------------------------------------------------------------------

COLUMNS = ["吾輩は猫である。", "名前はまだ無い。", "どこで生れたか", "とんと見当がつかぬ。"]


def _vertical_cjk_pdf(path: Path, columns: list[str], one_glyph_each: bool = False) -> Path:
    """A page of vertical Japanese: columns read top to bottom, the first column rightmost.
    Set with an Identity-V font (glyphs follow each other downwards; box glyphs made by
    fontTools, so no CJK font need be installed), or, as some producers do, one glyph per text
    object with an Identity-H font."""
    from pdf_fixtures import _font, _stream, write_pdf

    font, gids = _font("".join(columns))

    def glyphs(text: str) -> bytes:
        return b"<" + "".join(f"{gids[ch]:04X}" for ch in text).encode() + b">"

    content = b""
    for number, column in enumerate(columns):
        x = 500 - 30 * number
        if one_glyph_each:
            content += b"".join(b"BT /F1 20 Tf 1 0 0 1 %d %d Tm %s Tj ET\n" % (x, 740 - 22 * i, glyphs(ch))
                                for i, ch in enumerate(column))
        else:
            content += b"BT /F1 20 Tf 1 0 0 1 %d 740 Tm %s Tj ET\n" % (x, glyphs(column))
    encoding = b"/Identity-H" if one_glyph_each else b"/Identity-V"
    bfchars = "\n".join(f"<{gid:04X}> <{ch.encode('utf-16-be').hex().upper()}>"
                        for ch, gid in sorted(gids.items(), key=lambda item: item[1]))
    cmap = (f"/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Box def /CMapType 2 def\n"
            f"1 begincodespacerange <0000> <FFFF> endcodespacerange\n{len(gids)} beginbfchar\n{bfchars}\n"
            "endbfchar endcmap CMapName currentdict /CMap defineresource pop end end").encode()
    return write_pdf(path, [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        _stream(content),
        b"<< /Type /Font /Subtype /Type0 /BaseFont /HalamanBox /Encoding " + encoding
        + b" /DescendantFonts [6 0 R] /ToUnicode 9 0 R >>",
        b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /HalamanBox /CIDToGIDMap /Identity "
        b"/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> /DW 1000 /DW2 [880 -1000] "
        b"/FontDescriptor 7 0 R >>",
        b"<< /Type /FontDescriptor /FontName /HalamanBox /Flags 4 /FontBBox [0 -200 1000 800] /ItalicAngle 0 "
        b"/Ascent 800 /Descent -200 /CapHeight 700 /StemV 80 /FontFile2 8 0 R >>",
        _stream(font),
        _stream(cmap),
    ])


@pytest.mark.parametrize("one_glyph_each", [False, True], ids=["identity-v", "glyph-by-glyph"])
def test_vertical_japanese_is_read_column_by_column_from_the_right(tmp_path, one_glyph_each):
    """Before: the Identity-V page came out last column first ("とんと見当がつかぬ。" before
    "吾輩は猫である。"); the glyph-by-glyph page is a control PDFium already read right."""
    document = load_document(_vertical_cjk_pdf(tmp_path / "vertical.pdf", COLUMNS, one_glyph_each))
    text = document.segments[0].text.replace("\n", "")
    positions = [text.find(column) for column in COLUMNS]
    assert -1 not in positions and positions == sorted(positions), text


def test_a_flate_bomb_among_the_attachments_costs_no_page(tmp_path):
    """A text attachment that inflates past the worker's memory cap (1.5 GB of zeros in 1.5 MB;
    before this change there was no listing, so this is the guard on the listing, not the kind):
    the worker is listing attachments only after the last page, so the pages stay and a warning
    says the embedded files could not be listed."""
    import zlib

    from pdf_fixtures import write_pdf

    # One 16 MiB block of zeros deflated after a full flush needs no history, so it can repeat:
    # 90 of them are 1.5 GB of zeros (the zlib trailer's Adler-32 of n zeros is n mod 65521, 1).
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(bytes(1 << 24)) + packer.flush(zlib.Z_FULL_FLUSH)
    blocks = 90
    adler = (((blocks << 24) % 65521) << 16) | 1
    bomb = b"\x78\xda" + block * blocks + packer.flush() + adler.to_bytes(4, "big")
    content = b"BT /F1 12 Tf 72 720 Td (The page survives) Tj ET"
    path = write_pdf(tmp_path / "bomb.pdf", [
        b"<< /Type /Catalog /Pages 2 0 R /Names << /EmbeddedFiles << /Names [(notes.txt) 6 0 R] >> >> >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Filespec /F (notes.txt) /UF (notes.txt) /EF << /F 7 0 R >> >>",
        b"<< /Type /EmbeddedFile /Filter /FlateDecode /Length %d >>\nstream\n" % len(bomb) + bomb + b"\nendstream",
    ])
    document = load_document(path)
    assert [segment.label for segment in document.segments] == ["page 1"]
    assert "The page survives" in document.segments[0].text
    assert any("embedded files could not be listed safely" in warning for warning in document.warnings), \
        document.warnings
