"""Citations in an answer's text, as the model is told to write them: "[page 12]", "[pages 3-4]",
"[p. 7]", "[src/app.py]", and the units of office documents, e-books and tables as their markers
name them ("[slide 7]", "[slides 3-4]", "[sheet Revenue, rows 2–40]", "[section 3.2 Results]",
"[chapter 3 …]", "[rows 2–40]", "[footnotes]": `engine.documents.formats`); never inside code. The window links them (`app.chat`), the history export
writes them with their document's name (`engine.history`), both by these rules.
"""

from __future__ import annotations

import re

CITATION = re.compile(r"\[([^\[\]\n]{1,160})\](?!\()")
CODE = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]*`)", re.S)
"""Code blocks and spans: `CODE.split(text)` gives them at odd indices (each starts with a backtick)."""
_PAGES = re.compile(r"(pages?|p\.)\s*\d+([\s,–-]+\d+)*", re.I)
_SLIDES = re.compile(r"slides?\s*\d+([\s,–-]+\d+)*", re.I)
# The labels of `engine.documents.parts` units: a sheet's rows, a heading's section, a chapter,
# an e-book's part, a table's rows, and the units a Word or OpenDocument file ends with.
_UNIT = re.compile(r"(sheet|section|chapter|part|rows)\s[^\[\]\n]{1,150}|footnotes|endnotes|comments|notes"
                   r"|headers and footers|start", re.I)
_PART = re.compile(r",\s*part \d+$", re.I)
MOST_PAGES = 20
"""A cited page range names at most this many pages ('pages 3-900' is a slip, not 898 sources)."""


def looks_like_citation(label: str) -> bool:
    """"page 12", "pages 3-4", "p. 7", "src/app.py", "README.md", "slide 7", "sheet Revenue, rows
    2–40", "section 3.2 Results" — not "[x]" or "[1]"."""
    label = _PART.sub("", label.strip())  # a long unit cut in parts: "memo.docx, part 2"
    return bool(_PAGES.fullmatch(label) or _SLIDES.fullmatch(label) or _UNIT.fullmatch(label)) or bool(
        re.fullmatch(r"[\w.\-/ ]*[\w\-]\.[A-Za-z0-9]{1,10}|[\w.\-]+(/[\w.\-]+)+", label)
    )


def citations(text: str) -> list[str]:
    """Citation labels in `text`, in order of first appearance, outside code."""
    found: list[str] = []
    for part in CODE.split(text):
        if part.startswith("`"):
            continue
        for match in CITATION.finditer(part):
            label = match.group(1).strip()
            if looks_like_citation(label) and label not in found:
                found.append(label)
    return found


def normalise_label(label: str) -> str:
    """'p. 7' / 'pages 7' -> 'page 7', 'Slide 7' -> 'slide 7'; other labels stripped."""
    m = re.fullmatch(r"(?:pages?|p\.)\s*(\d+)", label.strip(), re.I)
    if m:
        return f"page {m.group(1)}"
    m = re.fullmatch(r"slides?\s*(\d+)", label.strip(), re.I)
    return f"slide {m.group(1)}" if m else label.strip()


def cited_labels(label: str) -> list[str]:
    """The segment labels a citation names: 'pages 3-4, 7' -> ['page 3', 'page 4', 'page 7'] (a
    range of more than MOST_PAGES pages gives its ends only); 'p. 7' -> ['page 7']; 'slides 3-4' ->
    ['slide 3', 'slide 4']; a file or another unit -> itself."""
    label = label.strip()
    unit = "slide" if _SLIDES.fullmatch(label) else "page" if _PAGES.fullmatch(label) else None
    if unit is None:
        return [label]
    pages: list[int] = []
    for start, end in re.findall(r"(\d+)(?:\s*[–-]\s*(\d+))?", label):
        first, last = int(start), int(end or start)
        pages += range(first, last + 1) if 0 <= last - first < MOST_PAGES else [first, last]
    return [f"{unit} {page}" for page in dict.fromkeys(pages)]


def distinct_titles(titles: list[str], sources: list[str]) -> list[str]:
    """Each document's name for citations, told apart when several share one: two files called
    "minutes.txt" in folders a/ and b/ become "a/minutes.txt" and "b/minutes.txt" (the shortest
    trailing part of their paths that differs), a shared title that is not the file name gets that
    path after it ("Minutes (a/minutes.pdf)"). `titles[i]` and `sources[i]` (its file or folder
    path, "" when it has none) describe document i; the result is parallel to them. Pure."""
    names = list(titles)
    groups: dict[str, list[int]] = {}
    for i, title in enumerate(titles):
        groups.setdefault(title, []).append(i)
    for title, members in groups.items():
        parts = {i: tuple(p for p in sources[i].replace("\\", "/").split("/") if p) for i in members}
        if len(members) < 2 or len(set(parts.values())) < len(members):
            continue  # one document, or the same file twice: nothing to tell apart
        for i in members:
            mine = parts[i]
            for k in range(2, len(mine) + 1):
                if sum(1 for other in parts.values() if other[-k:] == mine[-k:]) == 1:
                    path = "/".join(mine[-k:])
                    names[i] = path if mine and title == mine[-1] else f"{title} ({path})"
                    break
    return names
