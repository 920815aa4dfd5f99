"""Units of an office document, an e-book or a table, made into a `Document`.

Each format's reader hands over `Part`s in reading order: a label a reader understands
("slide 7", "sheet Revenue, rows 2-40", "section 3.2 Results"), the unit's text, and the outline
entries (headings, chapters) that start in it. `build_document` normalises the text
(`text.normalize_and_count`), drops units without text (moving their outline entries to the next
unit), cuts a unit longer than `MAX_PART_CHARS` at paragraph breaks ("…, part 2"), and numbers the
units: `Segment.page` is the unit's 1-based number, as a PDF page's, so that the outline's entries
point at units and the evidence selection finds chapters and sections as it does in a PDF.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from engine.documents.document import Document, EmptyFileError, OutlineEntry, ProgressCallback, Segment
from engine.documents.text import normalize_and_count
from engine.errors import Cancelled

MAX_PART_CHARS = 8_000
"""A unit longer than this (about two PDF pages) is cut at paragraph breaks into parts, so that a
citation points at a passage a reader can find, not at a 40-page chapter."""


@dataclass
class Part:
    """One unit of a document before numbering: `label` (shown in citations), `text` (raw),
    `headings`: (title, level) of the outline entries that start in this unit, level 0 = top."""

    label: str
    text: str
    headings: list[tuple[str, int]] = field(default_factory=list)


def check_cancel(cancel: threading.Event | None) -> None:
    """Raise Cancelled when `cancel` is set."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("Reading the file was cancelled.")


def build_document(path: Path, name: str, kind: str, parts: list[Part], *, warnings: list[str] | None = None,
                   progress: ProgressCallback | None = None) -> Document:
    """The Document of `parts` (in reading order) read from `path` (display name `name`, `kind` the
    format: "docx", "pptx", "xlsx", …). Raises EmptyFileError when no part holds text."""
    warnings = list(warnings or [])
    segments: list[Segment] = []
    outline: list[OutlineEntry] = []
    pending: list[tuple[str, int]] = []
    hidden_total = 0
    for part in parts:
        text, hidden = normalize_and_count(part.text)
        hidden_total += hidden
        pending += part.headings
        if not text:
            continue
        pieces = split_text(text, MAX_PART_CHARS)
        for k, piece in enumerate(pieces):
            number = len(segments) + 1
            label = part.label if len(pieces) == 1 else f"{part.label}, part {k + 1}"
            segments.append(Segment(text=piece, label=label, page=number, path=None))
            for title, level in pending:
                title = " ".join(normalize_and_count(title)[0].split())
                if title:
                    outline.append(OutlineEntry(title=title, level=level, page=number))
            pending = []
    if not segments:
        raise EmptyFileError(f"{name} is empty (no text in it): choose another file")
    if hidden_total:
        warnings.append(f"{hidden_total} invisible character{'s' if hidden_total > 1 else ''} removed "
                        f"(they can hide text from a reader): {name}")
    if progress:
        progress(1, 1)
    return Document(title=name, source=str(path), kind=kind, segments=segments, warnings=warnings,
                    outline=outline)


def section_parts(blocks, name: str) -> list[Part]:
    """Units of a text document from its blocks in order, (kind, text, level): a "heading" (level 0
    = top) starts a unit labelled "section <heading>" with an outline entry; other blocks join the
    current unit. The text before the first heading is the unit "start"; a document without
    headings is one unit labelled with its file's `name` (cut into "name, part 2" … when long)."""
    parts = [Part("start", "")]
    chunks: list[str] = []
    for kind, text, level in blocks:
        if kind == "heading":
            parts[-1].text = "\n\n".join(chunks)
            chunks = [text]
            parts.append(Part(f"section {short_title(text)}", "", [(text, level)]))
        elif text.strip():
            chunks.append(text)
    parts[-1].text = "\n\n".join(chunks)
    if len(parts) == 1:
        parts[0].label = name
    return parts


def split_text(text: str, limit: int) -> list[str]:
    """`text` cut into pieces of at most about `limit` characters at paragraph breaks (blank
    lines), else at line breaks, else hard; each piece stripped and non-empty."""
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = rest.rfind("\n\n", limit // 2, limit)
        if cut < 0:
            cut = rest.rfind("\n", limit // 2, limit)
        if cut < 0:
            cut = rest.rfind(" ", limit // 2, limit)
        if cut < 0:
            cut = limit
        piece = rest[:cut].strip()
        if piece:
            pieces.append(piece)
        rest = rest[cut:].lstrip()
    if rest.strip():
        pieces.append(rest.strip())
    return pieces


def short_title(title: str, limit: int = 60) -> str:
    """`title` on one line, cut at a word to about `limit` characters ("…" when cut)."""
    title = " ".join(title.split())
    if len(title) <= limit:
        return title
    cut = title.rfind(" ", 0, limit)
    return title[:cut if cut > limit // 2 else limit] + "…"
