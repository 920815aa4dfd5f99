"""OpenDocument files (.odt text, .odp presentations, .ods spreadsheets) from their content.xml.

Read from the zip (after `containers.open_archive`'s checks) with `containers.SAFE_XML_PARSER`
(no entity resolved, nothing fetched), following OpenDocument 1.3 part 3: a text document's
headings (text:h with its outline level) start units "section …" and outline entries;
paragraphs, lists ("• item"), tables as rows ("cell | cell"), sections and frames in order;
footnotes and endnotes marked where they stand ("[footnote 1]") and read in a unit "notes";
comments (office:annotation) likewise in "comments"; the distinct headers and footers of the
master pages (styles.xml) once, in "headers and footers"; tracked changes as shown with changes
accepted (the deleted text kept in text:tracked-changes is left out). A presentation's pages
are units "slide N" with their speaker notes; a spreadsheet's sheets go through `sheets`.
Left out: pictures, charts,
embedded objects, macros (never run), and every target outside the file (never fetched).
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine.documents.document import Document, ProgressCallback
from engine.documents.containers import MAX_PART_BYTES, check_archive, open_archive, parse_xml, read_member
from engine.documents.parts import Part, build_document, check_cancel, section_parts

_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
_TABLE = "{urn:oasis:names:tc:opendocument:xmlns:table:1.0}"
_OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
_DRAW = "{urn:oasis:names:tc:opendocument:xmlns:drawing:1.0}"
_PRESENTATION = "{urn:oasis:names:tc:opendocument:xmlns:presentation:1.0}"
_DC = "{http://purl.org/dc/elements/1.1/}"
_STYLE = "{urn:oasis:names:tc:opendocument:xmlns:style:1.0}"
_SKIPPED = {_TEXT + "tracked-changes", _TEXT + "note-citation", _OFFICE + "annotation-end",
            _TEXT + "sequence-decls", _TEXT + "variable-decls", _TEXT + "user-field-decls", _OFFICE + "forms"}
_KINDS = {"application/vnd.oasis.opendocument.text": "odt", "application/vnd.oasis.opendocument.presentation": "odp",
          "application/vnd.oasis.opendocument.spreadsheet": "ods"}


def load_odf(path: Path, name: str, *, progress: ProgressCallback | None = None,
             cancel: threading.Event | None = None) -> Document:
    """The OpenDocument file at `path` (shown as `name`), by its mimetype member (else its suffix):
    sections of a text, slides of a presentation, sheets of a spreadsheet. Raises the `containers`
    errors, EmptyFileError (no text), Cancelled."""
    streamed = path.suffix.lower() == ".ods"  # a spreadsheet's content.xml is streamed (`sheets.ods_parts`)
    with open_archive(path, name, streamed=streamed) as archive:
        try:
            mimetype = archive.read("mimetype").decode("ascii", "replace").strip()
        except (KeyError, OSError, ValueError):
            mimetype = ""
        kind = _KINDS.get(mimetype) or path.suffix.lower().lstrip(".")
        if streamed and kind != "ods":  # named .ods, but its content.xml is parsed whole
            check_archive(archive, name, MAX_PART_BYTES)
        check_cancel(cancel)
        if kind == "ods":
            from engine.documents.sheets import ods_parts

            parts, warnings = ods_parts(archive, name, cancel)
            return build_document(path, name, "ods", parts, warnings=warnings, progress=progress)
        root = parse_xml(read_member(archive, "content.xml", name), "content.xml", name)
        styles = (parse_xml(read_member(archive, "styles.xml", name), "styles.xml", name)
                  if "styles.xml" in archive.namelist() else None)
    reader = _Reader()
    if kind == "odp":
        parts = [reader.slide(page, number) for number, page in enumerate(root.iter(_DRAW + "page"), start=1)]
    else:
        body = root.find(f"{_OFFICE}body/{_OFFICE}text")
        parts = section_parts(reader.blocks(body if body is not None else root), name)
    for label, lines in (("notes", reader.notes), ("comments", reader.comments)):
        parts.append(Part(label, "\n".join(lines)))
    if kind != "odp" and styles is not None:
        parts.append(Part("headers and footers", _running_text(reader, styles)))
    return build_document(path, name, "odp" if kind == "odp" else "odt", parts, progress=progress)


def _running_text(reader: "_Reader", styles) -> str:
    """The distinct texts of the master pages' headers and footers (styles.xml), each once."""
    found: list[str] = []
    for master in styles.iter(_STYLE + "master-page"):
        for child in master:
            if isinstance(child.tag, str) and child.tag.startswith(_STYLE) and ("header" in child.tag or "footer" in child.tag):
                text = reader.text_of(child)
                if text.strip() and text not in found:
                    found.append(text)
    return "\n\n".join(found)


class _Reader:
    """Walks OpenDocument content, collecting notes and comments as it meets them."""

    def __init__(self):
        self.notes: list[str] = []
        self.comments: list[str] = []

    def slide(self, page, number: int) -> Part:
        """A draw:page as the unit "slide N": its title frame first, then its other frames, then "Notes:"."""
        title, lines, notes = "", [], []
        for child in page:
            if child.tag == _PRESENTATION + "notes":
                notes.append(self.text_of(child))
            elif isinstance(child.tag, str):
                text = self.text_of(child)
                if child.get(_PRESENTATION + "class") == "title" and not title:
                    title = " ".join(text.split())
                    lines.insert(0, text)
                else:
                    lines.append(text)
        if any(n.strip() for n in notes):
            lines.append("Notes: " + "\n".join(n for n in notes if n.strip()))
        return Part(f"slide {number}", "\n".join(line for line in lines if line.strip()), [(title, 0)] if title else [])

    def text_of(self, element) -> str:
        """Every block under `element` as lines."""
        return "\n".join(text for _, text, _ in self.blocks(element) if text.strip())

    def blocks(self, parent, bullet: str = ""):
        """(kind, text, level) for each block under `parent`: "heading" (level 0 = top), else "paragraph"/"table"."""
        for child in parent:
            tag = child.tag
            if not isinstance(tag, str) or tag in _SKIPPED:
                continue
            if tag == _TEXT + "h":
                level = int(child.get(_TEXT + "outline-level") or 1)
                yield "heading", self.inline(child).strip(), max(level - 1, 0)
            elif tag == _TEXT + "p":
                yield "paragraph", bullet + self.inline(child).strip(), -1
                bullet = "  " * len(bullet) if bullet else ""
            elif tag == _TEXT + "list-item":
                yield from self.blocks(child, bullet="• ")
            elif tag == _TABLE + "table":
                yield "table", self.table(child), -1
            else:  # lists, sections, frames, text boxes, drawing shapes
                yield from self.blocks(child, bullet)

    def table(self, table) -> str:
        rows = []
        for row in table.iter(_TABLE + "table-row"):
            cells = [" ".join(self.text_of(cell).split("\n")) for cell in row
                     if cell.tag in (_TABLE + "table-cell", _TABLE + "covered-table-cell")]
            if any(c.strip() for c in cells):
                rows.append(" | ".join(cells))
        return "\n".join(rows)

    def inline(self, element) -> str:
        out = [element.text or ""]
        for child in element:
            tag = child.tag
            if isinstance(tag, str) and tag not in _SKIPPED:
                out.append(self._inline_element(child, tag))
            out.append(child.tail or "")
        return "".join(out)

    def _inline_element(self, child, tag: str) -> str:
        if tag == _TEXT + "s":
            return " " * int(child.get(_TEXT + "c") or 1)
        if tag == _TEXT + "tab":
            return "\t"
        if tag == _TEXT + "line-break":
            return "\n"
        if tag == _TEXT + "note":
            citation = "".join(child.findtext(_TEXT + "note-citation") or "") or str(len(self.notes) + 1)
            kind = "endnote" if child.get(_TEXT + "note-class") == "endnote" else "footnote"
            body = child.find(_TEXT + "note-body")
            self.notes.append(f"[{kind} {citation}] " + (" ".join(self.text_of(body).split("\n")) if body is not None else ""))
            return f"[{kind} {citation}]"
        if tag == _OFFICE + "annotation":
            number = len(self.comments) + 1
            author = child.findtext(_DC + "creator") or ""
            text = " ".join(self.text_of(child).split("\n"))
            self.comments.append(f"[comment {number}] " + (f"{author}: " if author else "") + text)
            return f"[comment {number}]"
        if tag in (_DRAW + "frame", _DRAW + "text-box"):
            return "\n" + self.text_of(child) + "\n"
        return self.inline(child)
