"""Word documents (.docx, .docm, .dotx, .dotm) as a reader sees them, one unit per section.

The package is opened with python-docx's OPC reader (its parts and relationships; macro-enabled
files too, whose macros are a part that is never read, let alone run), after the zip checks of
`containers.open_archive`. Each part's XML is parsed with `containers.SAFE_XML_PARSER` and walked
in body order (ECMA-376 Part 1, 17.3): paragraphs, tables as rows ("cell | cell"), content
controls, text boxes; list items and numbered headings with the number Word shows (computed from
numbering.xml, 17.9); tracked insertions as text, tracked deletions and moved-from text left out,
as Word shows a document with changes accepted; field codes left out, their results kept; runs in Word's hidden font (w:vanish, which Word
neither shows nor prints by default: a place to plant text for a model) left out with a warning.

A heading (outline level from the paragraph, its style chain, or a "Heading N" style name) starts
a unit labelled "section 3.2 Results" and an outline entry. Footnotes, endnotes and comments are
marked where they stand ("[footnote 2]") and read in units of their own after the body; the
distinct texts of all headers and footers once, last. Left out: pictures, charts, equations'
layout, embedded objects, and every target outside the file (linked images, templates, hyperlinks:
never fetched).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from docx.opc.constants import RELATIONSHIP_TYPE as RT
from docx.opc.package import OpcPackage

from engine.documents.document import Document, ProgressCallback
from engine.documents.containers import DamagedDocumentError, open_archive, parse_xml, read_member
from engine.documents.parts import Part, build_document, check_cancel, section_parts

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
# Never read: deleted and moved-away text, field codes, properties, the picture fallback that
# repeats a text box's text (mc:Fallback), and the separators of the notes part.
_SKIPPED = {_W + n for n in ("del", "moveFrom", "delText", "delInstrText", "instrText", "pPr", "rPr",
                              "tblPr", "tcPr", "trPr", "sectPr")} | {_MC_FALLBACK}
_HEADING_STYLE = re.compile(r"^heading\s*(\d)$", re.I)


def load_docx(path: Path, name: str, *, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None) -> Document:
    """The Word document at `path` (shown as `name`) as units: the text before the first heading
    ("start"), one per heading ("section 3.2 Results"), then "footnotes", "endnotes", "comments",
    "headers and footers" where the file has them. Raises the `containers` errors, EmptyFileError
    (no text), Cancelled."""
    with open_archive(path, name) as archive:
        try:
            main = OpcPackage.open(str(path)).main_document_part
        except Exception as exc:  # python-docx raises KeyError, ValueError, lxml errors … for broken packages
            raise DamagedDocumentError(f"{name} is damaged ({type(exc).__name__}: {str(exc)[:120]}): "
                                       "open it in Word and save it again") from None
        other = _other_format(main.content_type)
        if other is not None:
            raise DamagedDocumentError(f"{name} is not a Word document (it holds {other}): "
                                       "open it in its program or give it that format's suffix")
        related = _related_parts(main, archive, name)
        member = str(main.partname).lstrip("/")
        reader = _Reader(name, parse_xml(read_member(archive, member, name), member, name), related)
    check_cancel(cancel)
    parts = reader.body_parts()
    for title, reltype, tag in (("footnotes", RT.FOOTNOTES, "footnote"), ("endnotes", RT.ENDNOTES, "endnote"),
                                ("comments", RT.COMMENTS, "comment")):
        if reltype in related:
            parts.append(Part(title, reader.notes_text(related[reltype][0], tag)))
    running = []
    for reltype in (RT.HEADER, RT.FOOTER):
        for blob in related.get(reltype, []):
            text = reader.blocks_text(parse_xml(blob, "header or footer", name))
            if text.strip() and text not in running:
                running.append(text)
    parts.append(Part("headers and footers", "\n\n".join(running)))
    check_cancel(cancel)
    warnings = [f"{name}: {reader.hidden_runs} run{'s' if reader.hidden_runs > 1 else ''} of hidden text "
                "(Word's hidden font: not shown) left out"] if reader.hidden_runs else []
    return build_document(path, name, "docx", parts, warnings=warnings, progress=progress)


def _other_format(content_type: str) -> str | None:
    """What a package holds whose main part has `content_type`, when that is a spreadsheet or a
    presentation (an .xlsx or .pptx renamed .docx: python-docx would open it and find no text);
    None for anything else, Word's own types included."""
    for markers, what in ((("spreadsheetml", "ms-excel"), "a spreadsheet: .xlsx"),
                          (("presentationml", "ms-powerpoint"), "a presentation: .pptx")):
        if any(marker in content_type for marker in markers):
            return what
    return None


def _related_parts(main, archive, name: str) -> dict[str, list[bytes]]:
    """The bytes of the main part's related XML parts inside the package, by relationship type,
    as stored (python-docx's parse is not used: its serialisation of an unresolved entity is not
    XML). External targets (linked images, templates, hyperlinks) are skipped: never fetched."""
    wanted = {RT.STYLES, RT.NUMBERING, RT.FOOTNOTES, RT.ENDNOTES, RT.COMMENTS, RT.HEADER, RT.FOOTER}
    found: dict[str, list[bytes]] = {}
    for rel in main.rels.values():
        if rel.is_external or rel.reltype not in wanted:
            continue
        member = str(rel.target_part.partname).lstrip("/")
        found.setdefault(rel.reltype, []).append(read_member(archive, member, name))
    return found


class _Reader:
    """Walks one document's XML with its styles and numbering."""

    def __init__(self, name: str, body_root, related: dict[str, list[bytes]]):
        self.name, self.root = name, body_root
        styles = parse_xml(related[RT.STYLES][0], "word/styles.xml", name) if RT.STYLES in related else None
        numbering = (parse_xml(related[RT.NUMBERING][0], "word/numbering.xml", name)
                     if RT.NUMBERING in related else None)
        self.styles = _Styles(styles)
        self.hidden_runs = 0
        self._paragraph_hidden = False  # the paragraph's style sets the hidden font
        self.numbers = _Numbering(numbering)

    def body_parts(self) -> list[Part]:
        """The body as units, one per heading (`parts.section_parts`)."""
        body = self.root.find(_W + "body")
        return section_parts(self._blocks(body if body is not None else self.root), self.name)

    def blocks_text(self, root) -> str:
        """All blocks under `root` (a header, a note, a table cell) as text, paragraphs on their own lines."""
        return "\n".join(text for _, text, _ in self._blocks(root) if text.strip())

    def notes_text(self, blob: bytes, tag: str) -> str:
        """The footnotes, endnotes or comments part as "[footnote 2] text" lines (separators left out)."""
        root = parse_xml(blob, f"word/{tag}s.xml", self.name)
        lines = []
        for note in root.iter(_W + tag):
            if note.get(_W + "type") in ("separator", "continuationSeparator", "continuationNotice"):
                continue
            text = " ".join(self.blocks_text(note).split("\n"))
            author = note.get(_W + "author")
            if text.strip():
                lines.append(f"[{tag} {note.get(_W + 'id')}] " + (f"{author}: " if author else "") + text)
        return "\n".join(lines)

    def _blocks(self, parent):
        """(kind, text, level) for each block under `parent` in order: "heading" (level 0 = top),
        "paragraph" or "table" (level -1)."""
        for child in parent:
            tag = child.tag
            if tag == _W + "p":
                yield self._paragraph(child)
            elif tag == _W + "tbl":
                yield "table", self._table(child), -1
            elif isinstance(tag, str) and tag not in _SKIPPED and tag not in (_W + "sectPr",):
                inner = child.find(_W + "sdtContent") if tag == _W + "sdt" else child
                if inner is not None:
                    yield from self._blocks(inner)

    def _paragraph(self, p) -> tuple[str, str, int]:
        style = _attr(p, "pPr/w:pStyle")
        self._paragraph_hidden = self.styles.hidden(style)
        text = "".join(self._inline(p)).strip()
        self._paragraph_hidden = False
        level = _int(_attr(p, "pPr/w:outlineLvl"))
        if level is None:
            level = self.styles.outline_level(style)
        num_id, ilvl = _attr(p, "pPr/w:numPr/w:numId"), _int(_attr(p, "pPr/w:numPr/w:ilvl"))
        if num_id is None:
            num_id, style_ilvl = self.styles.numbering(style)
            ilvl = ilvl if ilvl is not None else style_ilvl
        label = self.numbers.next_label(num_id, ilvl or 0) if num_id and text else ""
        if level is not None and level < 9 and text:
            return "heading", f"{label} {text}".strip(), level
        if label:
            text = "  " * (ilvl or 0) + f"{label} {text}"
        return "paragraph", text, -1

    def _hidden(self, run) -> bool:
        """Whether a w:r is in Word's hidden font: by its own properties, else its character style,
        else its paragraph's style (ECMA-376 17.7.2: direct formatting over styles)."""
        own = _vanish(run.find(_W + "rPr"))
        if own is not None:
            return own
        style = self.styles.hidden(_attr(run, "rPr/w:rStyle"))
        return style if style else self._paragraph_hidden

    def _table(self, tbl) -> str:
        rows = []
        # Rows and cells may sit inside content controls (w:sdt); a nested table's rows are read in their cell.
        for tr in tbl.iter(_W + "tr"):
            if next(tr.iterancestors(_W + "tbl")) is not tbl:
                continue
            cells = [" ".join(self.blocks_text(tc).split("\n")) for tc in tr.iter(_W + "tc")
                     if next(tc.iterancestors(_W + "tr")) is tr]
            if any(c.strip() for c in cells):
                rows.append(" | ".join(cells))
        return "\n".join(rows)

    def _inline(self, element):
        for child in element:
            tag = child.tag
            if not isinstance(tag, str) or tag in _SKIPPED:
                continue  # an unresolved entity, a comment; deleted text, field codes, properties
            if tag == _W + "r" and self._hidden(child):
                self.hidden_runs += 1  # Word's hidden font (w:vanish): not shown, not printed
                continue
            if tag == _W + "t":  # its text, and the text after an unresolved entity (kept out)
                yield (child.text or "") + "".join(node.tail or "" for node in child if not isinstance(node.tag, str))
            elif tag in (_W + "tab", _W + "ptab"):
                yield "\t"
            elif tag in (_W + "br", _W + "cr"):
                yield "\n"
            elif tag == _W + "noBreakHyphen":
                yield "-"
            elif tag in (_W + "footnoteReference", _W + "endnoteReference", _W + "commentReference"):
                kind = tag[len(_W):].removesuffix("Reference")
                yield f"[{kind} {child.get(_W + 'id')}]"
            elif tag == _W + "txbxContent":
                yield "\n" + self.blocks_text(child) + "\n"
            elif tag == _W + "tbl":
                yield "\n" + self._table(child) + "\n"
            else:
                yield from self._inline(child)


class _Styles:
    """Outline levels and numbering of paragraph styles, through their basedOn chains."""

    def __init__(self, root):
        self.by_id = {s.get(_W + "styleId"): s for s in root.iter(_W + "style")} if root is not None else {}

    def _chain(self, style_id: str | None):
        seen = set()
        while style_id and style_id in self.by_id and style_id not in seen:
            seen.add(style_id)
            style = self.by_id[style_id]
            yield style
            style_id = _attr(style, "basedOn")

    def outline_level(self, style_id: str | None) -> int | None:
        for style in self._chain(style_id):
            level = _int(_attr(style, "pPr/w:outlineLvl"))
            if level is not None:
                return level
            match = _HEADING_STYLE.match(_attr(style, "name") or "")
            if match:
                return int(match.group(1)) - 1
        return None

    def hidden(self, style_id: str | None) -> bool:
        """Whether the style (or one it is based on) sets the hidden font in its run properties."""
        for style in self._chain(style_id):
            flag = _vanish(style.find(_W + "rPr"))
            if flag is not None:
                return flag
        return False

    def numbering(self, style_id: str | None) -> tuple[str | None, int | None]:
        for style in self._chain(style_id):
            num_id = _attr(style, "pPr/w:numPr/w:numId")
            if num_id is not None:
                return num_id, _int(_attr(style, "pPr/w:numPr/w:ilvl"))
        return None, None


class _Numbering:
    """The number Word shows before a list item or a numbered heading ("3.2", "b)", "•")."""

    def __init__(self, root):
        self.abstract_of: dict[str, str] = {}
        self.levels: dict[tuple[str, int], tuple[str, str, int]] = {}
        self.counters: dict[str, list[int]] = {}
        if root is None:
            return
        for num in root.iter(_W + "num"):
            self.abstract_of[num.get(_W + "numId")] = _attr(num, "abstractNumId")
        for abstract in root.iter(_W + "abstractNum"):
            for lvl in abstract.iter(_W + "lvl"):
                key = (abstract.get(_W + "abstractNumId"), _int(lvl.get(_W + "ilvl")) or 0)
                self.levels[key] = (_attr(lvl, "numFmt") or "decimal", _attr(lvl, "lvlText") or "",
                                    _int(_attr(lvl, "start")) or 1)

    def next_label(self, num_id: str, ilvl: int) -> str:
        abstract = self.abstract_of.get(num_id)
        if abstract is None or num_id == "0":
            return ""
        fmt, text, _ = self.levels.get((abstract, ilvl), ("decimal", f"%{ilvl + 1}.", 1))
        if fmt == "bullet":
            return "•"
        counters = self.counters.setdefault(abstract, [0] * 9)
        ilvl = min(ilvl, 8)
        counters[ilvl] += 1
        for deeper in range(ilvl + 1, 9):
            counters[deeper] = 0

        def number(match: re.Match[str]) -> str:
            k = int(match.group(1)) - 1
            k_fmt, _, start = self.levels.get((abstract, k), ("decimal", "", 1))
            return _format_number(max(counters[k], 1) + start - 1, k_fmt)

        return re.sub(r"%(\d)", number, text).strip()


def _format_number(n: int, fmt: str) -> str:
    if fmt in ("lowerLetter", "upperLetter"):
        letters = chr(ord("a") + (n - 1) % 26) * ((n - 1) // 26 + 1)
        return letters.upper() if fmt == "upperLetter" else letters
    if fmt in ("lowerRoman", "upperRoman"):
        roman = _roman(n)
        return roman if fmt == "upperRoman" else roman.lower()
    if fmt == "none":
        return ""
    return str(n)


def _roman(n: int) -> str:
    out = ""
    for value, numeral in ((1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out, n = out + numeral, n - value
    return out


def _vanish(properties) -> bool | None:
    """True or False when run properties (w:rPr) set Word's hidden font (w:vanish, w:specVanish;
    val 0/false/off switches it off), None when they do not say."""
    if properties is None:
        return None
    for tag in ("vanish", "specVanish"):
        flag = properties.find(_W + tag)
        if flag is not None:
            return flag.get(_W + "val") not in ("0", "false", "off")
    return None


def _attr(element, path: str) -> str | None:
    """The w:val of the element at `path` ("pPr/w:pStyle", first step relative, w: prefixed after) under `element`."""
    steps = path.split("/")
    found = element.find("/".join(_W + s.removeprefix("w:") for s in steps))
    return None if found is None else found.get(_W + "val")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
