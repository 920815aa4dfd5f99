"""Real files of each office format for the tests, made with the format's own library (python-docx,
python-pptx, openpyxl) or, where none is a dependency (OpenDocument, EPUB), written by the
specifications as a zip with the format's XML (mimetype first and stored, as both require)."""

from __future__ import annotations

import datetime
import zipfile
from pathlib import Path


def make_docx(path: Path) -> Path:
    """A report: a title line, two numbered heading levels, a bullet and a numbered list, a table
    between paragraphs, a footnote-free body, a header on every page."""
    import docx

    document = docx.Document()
    document.add_paragraph("Annual report of the Kestrel company")
    document.add_heading("Introduction", 1)
    document.add_paragraph("The kestrel hovers over the meadow.")
    document.add_paragraph("first bullet", style="List Bullet")
    document.add_paragraph("first step", style="List Number")
    document.add_paragraph("second step", style="List Number")
    table = document.add_table(rows=2, cols=2)
    for (r, c), text in {(0, 0): "Region", (0, 1): "Revenue", (1, 0): "North", (1, 1): "1200"}.items():
        table.cell(r, c).text = text
    document.add_paragraph("After the table comes the conclusion.")
    document.add_heading("Results", 2)
    document.add_paragraph("Results were strong in the north.")
    document.sections[0].header.paragraphs[0].text = "Kestrel confidential"
    document.add_page_break()
    document.add_paragraph("Second page text.")
    document.save(path)
    return path


def make_pptx(path: Path, slides: int = 2) -> Path:
    """A deck: slide 1 with a title, two bullet levels and speaker notes; slide 2 with a title, a
    table and a grouped text box; more plain titled slides up to `slides`."""
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    first.shapes.title.text = "Quarterly results"
    body = first.placeholders[1].text_frame
    body.text = "Revenue grew 12%"
    sub = body.add_paragraph()
    sub.text, sub.level = "Costs fell", 1
    first.notes_slide.notes_text_frame.text = "Mention the kestrel deal"
    second = deck.slides.add_slide(deck.slide_layouts[5])
    second.shapes.title.text = "Sales by region"
    table = second.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1)).table
    for (r, c), text in {(0, 0): "Region", (0, 1): "Sales", (1, 0): "North", (1, 1): "99"}.items():
        table.cell(r, c).text = text
    group = second.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(4), Inches(2), Inches(1)).text_frame.text = "grouped words"
    for n in range(3, slides + 1):
        deck.slides.add_slide(deck.slide_layouts[5]).shapes.title.text = f"Topic number {n}"
    deck.save(path)
    return path


def make_xlsx(path: Path, rows: int = 60) -> Path:
    """A workbook: sheet "Revenue" (header Region | Revenue | Date, `rows` data rows, a formula
    whose cached value openpyxl cannot write) and sheet "Notes" with a gap before row 5."""
    import openpyxl

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Revenue"
    sheet.append(["Region", "Revenue", "Date"])
    for i in range(rows):
        sheet.append([f"Region{i}", 1000 + i * 10.5, datetime.date(2024, 1, 1 + i % 28)])
    notes = workbook.create_sheet("Notes")
    notes["A1"] = "Remark"
    notes["A5"] = "The kestrel account is fine"
    workbook.save(path)
    return path


def write_zip(path: Path, mimetype: str | None, members: dict[str, str | bytes]) -> Path:
    """A zip with `mimetype` stored first (OpenDocument and EPUB require it), then `members`."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        if mimetype is not None:
            archive.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        for name, data in members.items():
            archive.writestr(name, data)
    return path


_ODF_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
           'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
           'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
           'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
           'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0" '
           'xmlns:dc="http://purl.org/dc/elements/1.1/" office:version="1.3"')


def make_odt(path: Path, body: str, master_pages: str = "") -> Path:
    """An OpenDocument text whose office:text holds `body` (ODF XML, prefixes text:, table:, office:)
    and whose styles.xml holds `master_pages` (style:master-page elements) when given."""
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_ODF_NS}>'
               f"<office:body><office:text>{body}</office:text></office:body></office:document-content>")
    members = {"content.xml": content}
    if master_pages:
        members["styles.xml"] = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-styles {_ODF_NS} '
                                 'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0">'
                                 f"<office:master-styles>{master_pages}</office:master-styles></office:document-styles>")
    return write_zip(path, "application/vnd.oasis.opendocument.text", members)


def make_odp(path: Path, pages: str) -> Path:
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_ODF_NS}>'
               f"<office:body><office:presentation>{pages}</office:presentation></office:body></office:document-content>")
    return write_zip(path, "application/vnd.oasis.opendocument.presentation", {"content.xml": content})


def make_ods(path: Path, tables: str) -> Path:
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {_ODF_NS}>'
               f"<office:body><office:spreadsheet>{tables}</office:spreadsheet></office:body></office:document-content>")
    return write_zip(path, "application/vnd.oasis.opendocument.spreadsheet", {"content.xml": content})


def make_epub(path: Path, chapters: list[tuple[str, str]], *, nav: bool = True, extra_head: str = "") -> Path:
    """An EPUB 3 book (or EPUB 2 with an NCX when `nav` is False) whose spine is `chapters`:
    (title, XHTML body) each; `extra_head` goes into each chapter's <head>."""
    items, refs, members = [], [], {}
    for n, (title, body) in enumerate(chapters, start=1):
        items.append(f'<item id="c{n}" href="text/ch{n}.xhtml" media-type="application/xhtml+xml"/>')
        refs.append(f'<itemref idref="c{n}"/>')
        members[f"OEBPS/text/ch{n}.xhtml"] = (
            '<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
            f"<head><title>{title}</title>{extra_head}</head><body><h1>{title}</h1>{body}</body></html>")
    if nav:
        links = "".join(f'<li><a href="text/ch{n}.xhtml">{t}</a></li>' for n, (t, _) in enumerate(chapters, start=1))
        members["OEBPS/nav.xhtml"] = (
            '<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml" '
            'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Contents</title></head><body>'
            f'<nav epub:type="toc"><ol>{links}</ol></nav></body></html>')
        items.append('<item id="nav" href="nav.xhtml" properties="nav" media-type="application/xhtml+xml"/>')
        spine = "<spine>"
    else:
        points = "".join(f'<navPoint id="p{n}"><navLabel><text>{t}</text></navLabel><content src="text/ch{n}.xhtml"/></navPoint>'
                         for n, (t, _) in enumerate(chapters, start=1))
        members["OEBPS/toc.ncx"] = ('<?xml version="1.0" encoding="UTF-8"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" '
                                    f'version="2005-1"><navMap>{points}</navMap></ncx>')
        items.append('<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>')
        spine = '<spine toc="ncx">'
    members["OEBPS/content.opf"] = (
        '<?xml version="1.0" encoding="UTF-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
        'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Book</dc:title>'
        f'</metadata><manifest>{"".join(items)}</manifest>{spine}{"".join(refs)}</spine></package>')
    members["META-INF/container.xml"] = (
        '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        "</rootfiles></container>")
    return write_zip(path, "application/epub+zip", members)
