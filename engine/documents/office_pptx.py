"""PowerPoint decks (.pptx, .pptm, .ppsx, .potx) as one unit per slide, "slide 7".

Read with python-pptx after the zip checks of `containers.open_archive` (its XML parser resolves
no entities). Each slide's unit holds, in order: its title, the text of its other shapes in the
order they are stacked (text frames, placeholders, tables as rows "cell | cell", the shapes of a
group, as the selection pane lists them), then its speaker notes after "Notes:". The deck's
sections (PowerPoint 2010 and later) are the outline's top level with the slide titles below
them; without sections the titles are the top level. A hidden slide is read and labelled
"slide 7 (hidden)". Left out: pictures, charts, SmartArt's drawing, media, macros (never run),
the text of layouts and masters (footers, placeholders' prompts), and every target outside the
file (linked pictures, hyperlinks: never fetched).
"""

from __future__ import annotations

import threading
from pathlib import Path

from pptx.package import Package
from pptx.shapes.group import GroupShape

from engine.documents.document import Document, ProgressCallback
from engine.documents.containers import DamagedDocumentError, open_archive
from engine.documents.parts import Part, build_document, check_cancel

_MAX_GROUP_DEPTH = 16
_P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
_P14 = "{http://schemas.microsoft.com/office/powerpoint/2010/main}"


def load_pptx(path: Path, name: str, *, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None) -> Document:
    """The deck at `path` (shown as `name`): one unit per slide, "slide N" (N counts from 1 in the
    deck's order). Raises the `containers` errors, EmptyFileError (no slide has text), Cancelled."""
    open_archive(path, name).close()
    try:
        presentation = Package.open(str(path)).main_document_part.presentation
        slides = list(presentation.slides)
    except Exception as exc:  # python-pptx raises KeyError, ValueError, lxml errors … for broken packages
        raise DamagedDocumentError(f"{name} is damaged ({type(exc).__name__}: {str(exc)[:120]}): "
                                   "open it in PowerPoint and save it again") from None
    sections = section_starts(presentation._element)
    parts = []
    for number, slide in enumerate(slides, start=1):
        check_cancel(cancel)
        if progress:
            progress(number - 1, len(slides))
        title, text = slide_text(slide)
        hidden = slide._element.get("show") in ("0", "false")
        label = f"slide {number}" + (" (hidden)" if hidden else "")
        headings = [(sections[number - 1], 0)] if number - 1 in sections else []
        if title:
            headings.append((title, 1 if sections else 0))
        parts.append(Part(label, text, headings))
    return build_document(path, name, "pptx", parts, progress=progress)


def section_starts(presentation) -> dict[int, str]:
    """The deck's sections (PowerPoint 2010's p14:sectionLst in presentation.xml): the 0-based
    index of each section's first slide -> the section's name. {} for a deck without sections."""
    order = {slide_id.get("id"): k for k, slide_id in enumerate(presentation.iter(_P + "sldId"))}
    starts: dict[int, str] = {}
    for section in presentation.iter(_P14 + "section"):
        first = min((order[s.get("id")] for s in section.iter(_P14 + "sldId") if s.get("id") in order), default=None)
        if first is not None and (section.get("name") or "").strip():
            starts.setdefault(first, section.get("name").strip())
    return starts


def slide_text(slide) -> tuple[str, str]:
    """(title, text) of a python-pptx slide: the title placeholder's text ("" without one), and the
    title, each shape's text and the speaker notes as lines."""
    title_shape = slide.shapes.title
    title = " ".join(title_shape.text_frame.text.split()) if title_shape is not None and title_shape.has_text_frame else ""
    lines = [title] if title else []
    for shape in slide.shapes:
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        lines += _shape_lines(shape, 0)
    if slide.has_notes_slide:
        notes = slide.notes_slide.notes_text_frame
        if notes is not None and notes.text.strip():
            lines.append("Notes: " + notes.text.strip())
    return title, "\n".join(line for line in lines if line.strip())


def _shape_lines(shape, depth: int) -> list[str]:
    if depth > _MAX_GROUP_DEPTH:
        return []
    if isinstance(shape, GroupShape):
        return [line for inner in shape.shapes for line in _shape_lines(inner, depth + 1)]
    if getattr(shape, "has_table", False) and shape.has_table:
        return [" | ".join(" ".join(cell.text.split()) for cell in row.cells) for row in shape.table.rows]
    if getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        return [paragraph_text(p) for p in shape.text_frame.paragraphs]
    return []


def paragraph_text(paragraph) -> str:
    """A text-frame paragraph's text, indented two spaces per list level."""
    return "  " * (paragraph.level or 0) + paragraph.text.replace("\x0b", "\n")
