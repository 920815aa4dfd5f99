"""A document's structure: its sections (chapters, parts, appendices, items, headed pages), its
tables of contents and its opening, and which of them a question names.

Words alone cannot find "chapter 8": the page that starts it says "Chapter8 / Strings", the
question says "chapter 8", and "chapter" is on every page's running head. So sections come from
where a reader finds them: the PDF's outline (its bookmarks, `Document.outline`), else the lines
that open a page ("Chapter 3", "Appendix B", "Item 7."). A contents page is one whose lines mostly
end in a page number (dot leaders or not). A question's references ("chapter 11", "section 3.2",
"the preface", "appendix B", "which chapter …", "how many chapters") resolve to the segments that
answer them: a section's first pages, or the contents pages (`references`).

Everything here is pure text work over `Document.segments` (no model, no tokens), computed once when
a document opens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.documents import Document

# Section kinds a question can name with a number or letter, and the words for them.
_KIND_WORDS = {
    "chapter": "chapter", "chapters": "chapter", "chap": "chapter", "ch": "chapter",
    "section": "section", "sections": "section", "sec": "section", "§": "section",
    "part": "part", "parts": "part", "appendix": "appendix", "appendices": "appendix",
    "item": "item", "lesson": "chapter", "unit": "chapter", "lecture": "chapter",
}
_ORDINALS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12,
}
_ROMAN = re.compile(r"^(?=[ivxlcdm]+$)m{0,3}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})$")
_NUMBER = r"(\d+(?:\.\d+)*[a-z]?|[ivxlcdm]+|[a-z])"
# "chapter 8", "Chapter8", "Section 3.2", "Appendix B", "Item 7A.", "Part II" at the start of a line.
_HEADING = re.compile(rf"^\s*(chapter|part|appendix|section|item|lesson|unit|lecture)\s*{_NUMBER}\b[.:]?\s*(.*)$", re.I)
# An outline title that starts with its number: "8 Strings", "8. Strings", "3.2 Loops".
_NUMBERED_TITLE = re.compile(r"^\s*(\d+(?:\.\d+)*)\.?\s+(\S.*)$")
# In a question: "chapter 8", "ch. 8", "section 3.2", "§ 4", "appendix b", "part two", "the third chapter".
_REFERENCE = re.compile(rf"\b(chapters?|chap\.?|ch\.|sections?|sec\.|§|parts?|appendix|appendices|items?|lessons?|units?|lectures?)\s*"
                        rf"(\d+(?:\.\d+)*[a-z]?|[ivxlcdm]+\b|[a-z]\b|{'|'.join(_ORDINALS)})", re.I)
_ORDINAL_BEFORE = re.compile(rf"\b(?:the\s+)?({'|'.join(k for k in _ORDINALS if k.endswith(('st', 'nd', 'rd', 'th')))}|last)\s+"
                             r"(chapter|section|part|appendix|lesson|unit)\b", re.I)
# Front and back matter a question names without a number.
NAMED_PARTS = ("preface", "foreword", "introduction", "acknowledgments", "acknowledgements", "glossary", "index",
               "bibliography", "references", "afterword", "epilogue", "prologue", "abstract", "conclusion",
               "conclusions", "summary", "appendix", "about the author", "colophon")
# A question about the table of contents itself: which chapter is about X, the chapters' titles, how many.
_ASKS_CONTENTS = re.compile(
    r"\b(table of contents|contents page|which (chapter|part|section|appendix|lesson)|how many (chapters|parts|sections|appendices|lessons)"
    r"|(list|name) (all )?(of )?the (chapters|parts|sections)|what (are )?the (chapters|parts|sections)\b"
    r"|titles? of (the |all )?(chapters?|parts?|sections?|appendix)|(chapter|part|section)'?s? (title|name|heading))", re.I)
# "the chapter on strings", "the section about loops": a section named by its subject.
_ABOUT = re.compile(r"\b(chapter|part|section|appendix|lesson)s?\s+(?:on|about|covering|that covers|dealing with|called|titled|named)\s+(.+?)(?:[?.!,;]|\s+in\s+\w+\s+sentences|$)", re.I)
_PAGE_NUMBER_END = re.compile(r"(\.\s*){2,}\s*\d+\s*$|\s\d{1,4}\s*$|\s[ivxlcdm]{1,7}\s*$", re.I)

OPENING_SEGMENTS = 2
# Besides the first segment, a book's opening reads up to this many short segments before its front
# matter (title page, copyright page), each at most TITLE_PAGE_CHARS long.
TITLE_PAGES = 3
TITLE_PAGE_CHARS = 1200
"""Segments read for a question about the whole document besides its contents: the title page and
what follows it (a preface, an abstract, a README's start)."""


@dataclass(frozen=True)
class Section:
    """One section: `kind` ("chapter", "part", "appendix", "section", "item", or "heading" for an
    outline entry without a kind), `number` as written ("8", "3.2", "b", "ii"; None without one),
    `title`, outline `level` (0 = top), and the segments it covers, `first` to `last` inclusive."""

    kind: str
    number: str | None
    title: str
    level: int
    first: int
    last: int


@dataclass(frozen=True)
class StructureHit:
    """A segment a question's reference resolves to: `segment` index, `why` ("chapter 8",
    "contents", "preface") and `rank` (0 = the first page of what was named)."""

    segment: int
    why: str
    rank: int = 0


@dataclass
class DocumentStructure:
    """Sections, contents pages and opening segments of one document (`of`)."""

    sections: list[Section]
    contents: list[int]
    opening: list[int]
    listed: dict[int, set[str]]  # contents page -> the numbers of the entries it lists ("7" for "7. Iteration 75")
    words: dict[int, set[str]]   # contents page -> its content words
    chapter_level: int = 0       # the outline level of the chapters (`_chapter_level`)

    @classmethod
    def of(cls, document: Document) -> DocumentStructure:
        """The structure of `document`: sections from its outline when it has one, else from the
        lines that open its segments; contents pages; the first OPENING_SEGMENTS segments."""
        sections = _outline_sections(document) or _heading_sections(document)
        contents = _contents_pages(document)
        opening = _opening(document, contents)
        listed = {i: _listed_numbers(document.segments[i].text) for i in contents}
        words = {i: _title_words(document.segments[i].text) for i in contents}
        return cls(sections, contents, opening, listed, words, _chapter_level(sections))

    def references(self, question: str) -> list[StructureHit]:
        """Segments the question names through the structure, best first: a numbered section's
        first pages ("chapter 8", "section 3.2", "the third chapter"), a named one's ("the
        preface", "the glossary"), and the contents pages for questions about the contents
        ("Which chapter is about files?", "What is the title of chapter 7?", "How many chapters?")."""
        hits: list[StructureHit] = []
        asks_contents = bool(self.contents and _ASKS_CONTENTS.search(question))
        pages = 1 if asks_contents else 2  # "the title of chapter 7" is on its first page and in the contents
        for kind, number in _question_numbers(question, self.sections, self.chapter_level):
            for section in self._numbered(kind, number):
                why = f"{kind} {number}"
                hits += [StructureHit(section.first + k, why, k) for k in range(min(pages, section.last - section.first + 1))]
        lowered = question.lower()
        for name in NAMED_PARTS:
            if re.search(rf"\b{re.escape(name)}\b", lowered):
                for section in self.sections:
                    if section.number is None and re.fullmatch(rf"{re.escape(name)}s?\b.*", section.title.lower()):
                        hits.append(StructureHit(section.first, name))
                        break
        for match in _ABOUT.finditer(question):
            section = self._titled(match.group(1).lower(), match.group(2))
            if section is not None:
                why = f"{match.group(1).lower()} on {section.title}"
                hits += [StructureHit(section.first + k, why, k) for k in range(min(2, section.last - section.first + 1))]
        if asks_contents:
            hits += self._contents_for(question)
        seen: set[int] = set()
        return [h for h in hits if not (h.segment in seen or seen.add(h.segment))]

    def _titled(self, kind: str, subject: str) -> Section | None:
        """The section of `kind` whose title's words best cover `subject`'s ("strings" → "Strings"),
        top-level ones first; None when no title shares a word."""
        wanted = _title_words(subject)
        best, best_score = None, 0.0
        for section in self.sections:
            if kind == "chapter" and section.level != self.chapter_level or kind != "chapter" and section.kind not in (kind, "heading"):
                continue
            words = _title_words(section.title)
            shared = len(wanted & words)
            score = shared / len(words) if words else 0.0
            if shared and score > best_score:
                best, best_score = section, score
        return best

    def _numbered(self, kind: str, number: str) -> list[Section]:
        found = [s for s in self.sections if s.number is not None and s.number.lower() == number.lower()
                 and (s.kind == kind or (kind == "chapter" and s.kind == "heading" and s.level == self.chapter_level)
                      or (kind == "section" and s.kind in ("heading", "section")))]
        return found[:1]

    def _contents_for(self, question: str) -> list[StructureHit]:
        """The contents pages: rank 0 for those that list a numbered reference of the question
        ("chapter 7" → the page listing "7. Iteration"), 1 for the others."""
        numbers = [n for _, n in _question_numbers(question, self.sections, self.chapter_level)]
        return [StructureHit(i, "contents", 0 if any(self._lists(i, n) for n in numbers) else 1) for i in self.contents]

    def shared_words(self, segment: int, question: str) -> int:
        """How many of the question's content words (plural -s folded) a contents page holds."""
        return len(_title_words(question) & self.words.get(segment, set()))

    def _lists(self, segment: int, number: str) -> bool:
        return number.lower() in self.listed.get(segment, ())


def _listed_numbers(text: str) -> set[str]:
    """The numbers of the entries a contents page lists: "7. Iteration 75" and "Chapter 7 …" → 7."""
    found = set()
    for line in text.splitlines():
        numbered = _NUMBERED_TITLE.match(line)
        headed = _HEADING.match(line)
        if numbered:
            found.add(numbered.group(1).lower())
        elif headed:
            found.add(headed.group(2).lower())
    return found


_INTRO_FILE = re.compile(r"(^|/)(readme|about|overview|index|intro|introduction)(\.[\w]+)?$|(^|/)__init__\.py$"
                         r"|(^|/)(pyproject\.toml|setup\.py|setup\.cfg|package\.json|cargo\.toml|go\.mod)$", re.I)


def _opening(document: Document, contents: list[int]) -> list[int]:
    """What a question about the whole document reads first: a PDF's or text's first segments (its
    title page, what follows), a folder's README and the top of its main package (the shallowest
    such files: `README.md`, `pkg/__init__.py`, `pyproject.toml`)."""
    if document.kind == "repo":
        intro = [i for i, s in enumerate(document.segments) if s.path and _INTRO_FILE.search(s.path)]
        intro.sort(key=lambda i: (document.segments[i].path.count("/"), not re.search(r"readme", document.segments[i].path, re.I)))
        if intro:
            return intro[:OPENING_SEGMENTS]
    opening = [i for i in range(min(OPENING_SEGMENTS, len(document.segments))) if i not in contents]
    front = _front_matter(document, contents)
    if not front:
        return opening
    # The short pages between the cover and the preface are the title and copyright pages: who
    # wrote and published it, the edition, the licence ("Who published this book?").
    title_pages = [i for i in range(1, min(front[0], TITLE_PAGES + 1))
                   if i not in contents and len(document.segments[i].text) <= TITLE_PAGE_CHARS]
    return [*opening[:1], *title_pages, *front]


_FRONT = re.compile(r"^\s*(preface|foreword|introduction|abstract|executive summary|summary|about this (book|document|report))\b", re.I)


def _front_matter(document: Document, contents: list[int]) -> list[int]:
    """The first two pages of the preface, foreword, introduction or abstract, where one of the
    first pages (before a tenth of the document) starts with that heading."""
    limit = max(OPENING_SEGMENTS + 1, len(document.segments) // 10)
    for i, segment in enumerate(document.segments[:limit]):
        head = [line for line in segment.text.splitlines()[:3] if line.strip()]
        if i not in contents and any(_FRONT.match(line) for line in head):
            return [k for k in (i, i + 1) if k < len(document.segments) and k not in contents]
    return []


def _contents_pages(document: Document) -> list[int]:
    """Segments of a PDF that are its table of contents: pages headed "contents" whose lines are
    mostly entries, and the entry pages that directly follow one (an untitled continuation). An
    index (entries too, headed "Index") is not contents."""
    if document.kind != "pdf":
        return []
    found: list[int] = []
    for i, segment in enumerate(document.segments):
        lines = [line for line in segment.text.splitlines() if line.strip()]
        share = _entry_share(lines)
        titled = any(re.search(r"\bcontents\b", line, re.I) and len(line) < 60 for line in lines[:3])
        if share >= 0.5 and len(lines) >= 6 and (titled or found and found[-1] == i - 1):
            found.append(i)
    return found


def _entry_share(lines: list[str]) -> float:
    """The share of `lines` that end in a page number (arabic or roman, after dot leaders or a space)."""
    if not lines:
        return 0.0
    return sum(1 for line in lines if _PAGE_NUMBER_END.search(line) and re.search(r"[^\W\d_]{3}", line)) / len(lines)


def _segment_of_page(document: Document) -> dict[int, int]:
    pages: dict[int, int] = {}
    for i, segment in enumerate(document.segments):
        if segment.page is not None:
            pages.setdefault(segment.page, i)
    return pages


def _outline_sections(document: Document) -> list[Section]:
    """Sections from the PDF outline: each entry runs to the page before the next entry at its
    level or above. Its kind and number come from its title ("Chapter 3 …", "8 Strings"), else from
    the first lines of its first page ("Chapter8 / Strings")."""
    if not document.outline:
        return []
    first_of = _segment_of_page(document)
    pages = sorted(first_of)
    starts = []
    for entry in document.outline:
        later = [p for p in pages if p >= entry.page]
        if later:
            starts.append((entry, first_of[later[0]]))
    sections = []
    for k, (entry, first) in enumerate(starts):
        following = [start for other, start in starts[k + 1:] if other.level <= entry.level]
        last = max(first, (following[0] - 1) if following else len(document.segments) - 1)
        kind, number, title = _kind_and_number(entry.title)
        if number is None and entry.level > 0:
            number = _implicit_number(sections, entry.level)
        # A top entry, or a deeper one with no number from its parent (a chapter under "Part II"),
        # that opens its page takes the page's heading ("Chapter 8 / Classes"); a later entry on
        # the same page, or a heading an earlier entry already took (a running head), does not.
        if number is None and (entry.level == 0 or all(start != first for _, start in starts[:k])):
            kind_from_page, number_from_page, _ = _page_heading(document.segments[first].text)
            taken = any(s.kind == kind_from_page and s.number == number_from_page for s in sections)
            if number_from_page is not None and not (entry.level > 0 and taken):
                kind, number = kind_from_page, number_from_page
        sections.append(Section(kind, number, title, entry.level, first, last))
    return sections


def _chapter_level(sections: list[Section]) -> int:
    """The outline level that holds the chapters: the shallowest one with an entry numbered by a
    whole number ("8 Classes", "Chapter 8"); 0 without one. A LaTeX book with `\\part`s, or a
    binder with one bookmark per volume, has its chapters at level 1 under the parts."""
    return min((s.level for s in sections if s.kind in ("chapter", "heading") and s.number and s.number.isdigit()), default=0)


def _implicit_number(before: list[Section], level: int) -> str | None:
    """An unnumbered outline entry's number from its parent's and its place among its siblings
    ("3" → its second child is "3.2"), as books number them; None under an unnumbered parent."""
    siblings = 1
    for section in reversed(before):
        if section.level == level:
            siblings += 1
        elif section.level < level:
            return f"{section.number}.{siblings}" if section.number and section.number[0].isdigit() else None
    return None


def _heading_sections(document: Document) -> list[Section]:
    """Sections from the lines that open segments ("Chapter 3", "Appendix B", "Item 7."), for a PDF
    without an outline; each runs to the next one of its kind."""
    found = []
    for i, segment in enumerate(document.segments):
        kind, number, title = _page_heading(segment.text)
        if number is not None:
            found.append((kind, number, title, i))
    sections = []
    for k, (kind, number, title, first) in enumerate(found):
        following = [start for other_kind, _, _, start in found[k + 1:] if other_kind == kind]
        last = (following[0] - 1) if following else len(document.segments) - 1
        sections.append(Section(kind, number, title, 0, first, max(first, last)))
    return sections


def _kind_and_number(title: str) -> tuple[str, str | None, str]:
    match = _HEADING.match(title)
    if match:
        return match.group(1).lower(), match.group(2).lower(), match.group(3).strip() or title
    match = _NUMBERED_TITLE.match(title)
    if match:
        return "heading", match.group(1), match.group(2)
    return "heading", None, title


def _page_heading(text: str) -> tuple[str, str | None, str]:
    """A section heading among the first three lines of a page, skipping a running head."""
    lines = [line for line in text.splitlines()[:4] if line.strip()]
    for k, line in enumerate(lines[:3]):
        match = _HEADING.match(line)
        if match and len(line) <= 120:
            title = match.group(3).strip() or (lines[k + 1].strip() if k + 1 < len(lines) else "")
            number = match.group(2).lower()
            if match.group(1).lower() == "item" or not _ROMAN.match(number) or len(number) > 1 or number in "iv":
                return match.group(1).lower(), number, title
    return "heading", None, ""


def _question_numbers(question: str, sections: list[Section], chapter_level: int = 0) -> list[tuple[str, str]]:
    """(kind, number) pairs a question names: "chapter 8" → ("chapter", "8"), "part two" →
    ("part", "2"), "the third chapter" → ("chapter", "3"), "the last chapter" → the last one's."""
    found = []
    for match in _REFERENCE.finditer(question):
        word = match.group(1).lower().rstrip(".")
        kind = _KIND_WORDS.get(word, _KIND_WORDS.get(word.rstrip("s"), "section"))
        number = match.group(2).lower()
        number = str(_ORDINALS[number]) if number in _ORDINALS else number
        if kind in ("chapter", "part") and _ROMAN.match(number) and number not in ("i",) or number == "i" and kind == "part":
            number = str(_roman_value(number))
        if len(number) == 1 and number.isalpha() and kind not in ("appendix", "part", "section"):
            continue  # "chapter a" is English ("a chapter"), not appendix A
        found.append((kind, number))
    for match in _ORDINAL_BEFORE.finditer(question):
        kind = match.group(2).lower()
        if match.group(1).lower() == "last":
            numbered = [s.number for s in sections if s.number and s.number.isdigit()
                        and (s.kind == kind or (kind == "chapter" and s.level == chapter_level))]
            if numbered:
                found.append((kind, max(numbered, key=int)))
        else:
            found.append((kind, str(_ORDINALS[match.group(1).lower()])))
    return list(dict.fromkeys(found))


def _title_words(text: str) -> set[str]:
    """Content words of a title or subject, plural -s folded ("Strings" → "string")."""
    from engine.evidence.text_index import STOPWORDS

    words = {w.lower() for w in re.findall(r"[^\W\d_]{3,}", text)} - STOPWORDS - {"chapter", "section", "part", "book"}
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words}


def _roman_value(text: str) -> int:
    values = {"i": 1, "v": 5, "x": 10, "l": 50, "c": 100, "d": 500, "m": 1000}
    total = 0
    for k, char in enumerate(text):
        value = values[char]
        total += -value if k + 1 < len(text) and values[text[k + 1]] > value else value
    return total
