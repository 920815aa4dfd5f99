"""The text Halaman reads from Word and PowerPoint files against each library's own plain reading.

    python bench/formats.py DIR [DIR ...]

Every .docx and .pptx under the folders is read twice: by `load_document` (Halaman's units) and by
the format library's plain reading (python-docx: every paragraph's text and every table cell's, in
the body, headers and footers; python-pptx: every shape's text frame, table cells, speaker notes).
Per format it prints the files read, the files Halaman refused (and why), and word recall: the
share of the reference's words (as a multiset, case-folded) that Halaman's text holds, pooled over
the files, with the five files of lowest recall. Words Halaman reads beyond the reference
(footnotes, comments, list numbers, inserted revisions) are counted as "extra". Nothing is timed.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.documents import load_document  # noqa: E402
from engine.errors import DocumentError  # noqa: E402

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> Counter:
    return Counter(w.casefold() for w in _WORD.findall(text))


def docx_reference(path: Path) -> str:
    """python-docx's plain reading: paragraphs and table cells of the body, headers and footers."""
    import docx

    document = docx.Document(str(path))
    parts = [p.text for p in document.paragraphs]
    tables = list(document.tables)
    for section in document.sections:
        for part in (section.header, section.footer):
            if part.is_linked_to_previous:
                continue
            parts += [p.text for p in part.paragraphs]
            tables += part.tables
    for table in tables:
        seen = set()
        for row in table.rows:
            for cell in row.cells:
                if cell._tc not in seen:  # a merged cell is listed once per grid column
                    seen.add(cell._tc)
                    parts.append(cell.text)
    return "\n".join(parts)


def pptx_reference(path: Path) -> str:
    """python-pptx's plain reading: each shape's text frame (groups opened), table cells, notes."""
    from pptx import Presentation
    from pptx.shapes.group import GroupShape

    def shape_text(shape) -> list[str]:
        if isinstance(shape, GroupShape):
            return [t for inner in shape.shapes for t in shape_text(inner)]
        if getattr(shape, "has_table", False) and shape.has_table:
            return [cell.text for row in shape.table.rows for cell in row.cells]
        return [shape.text_frame.text] if getattr(shape, "has_text_frame", False) and shape.has_text_frame else []

    parts = []
    for slide in Presentation(str(path)).slides:
        for shape in slide.shapes:
            parts += shape_text(shape)
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            parts.append(slide.notes_slide.notes_text_frame.text)
    return "\n".join(parts)


REFERENCES = {".docx": docx_reference, ".pptx": pptx_reference}


def measure(files: list[Path], reference) -> dict:
    found = total = extra = 0
    refused, per_file = [], []
    for path in files:
        try:
            expected = words(reference(path))
        except Exception as exc:  # noqa: BLE001 (the reference library cannot read it either: not counted)
            refused.append((path.name, f"reference failed: {type(exc).__name__}"))
            continue
        try:
            got = words("\n".join(s.text for s in load_document(path).segments))
        except DocumentError as error:
            if expected:
                refused.append((path.name, str(error)[:90]))
            got = Counter()
        hit = sum((expected & got).values())
        found, total = found + hit, total + sum(expected.values())
        extra += sum((got - expected).values())
        if expected:
            per_file.append((hit / sum(expected.values()), path.name))
    return {"files": len(files), "refused": refused, "recall": found / total if total else 1.0,
            "words": total, "extra": extra, "lowest": sorted(per_file)[:5]}


def main(folders: list[str]) -> None:
    for suffix, reference in REFERENCES.items():
        files = sorted(p for folder in folders for p in Path(folder).rglob(f"*{suffix}"))
        if not files:
            continue
        result = measure(files, reference)
        print(f"{suffix}: {result['files']} files, reference words {result['words']:,}, "
              f"recall {result['recall']:.1%}, extra words {result['extra']:,}")
        for name, why in result["refused"]:
            print(f"  not read: {name}: {why}")
        for share, name in result["lowest"]:
            print(f"  lowest: {share:.1%} {name}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])
