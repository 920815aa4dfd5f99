"""Sections a question names by their subject: "working capital" is on the balance sheet, "capex"
on the cash flow statement, "legal battles" under legal proceedings.

An analyst asks for "total current liabilities based on the balance sheet" or "is 3M
capital-intensive?"; the page that answers is a table headed "Consolidated Balance Sheets" whose
words are line items. Full-text ranking put Netflix's balance sheet ninth for the first question and
none of 3M's three statements in its first 50 spans for the second. So the kinds of section in
`named_sections.toml` are found by their headings at the top of a page (`NamedSections.of`), and a
question that uses one of a kind's phrases (`asked_as`) names that kind's pages (`asked`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.documents import Document

HEAD_CHARS = 400
"""How much of a page's start a heading is looked for in: past a running head ("Table of
Contents") and the company's name, before the table's first lines."""
INDEX_CHARS = 1200
"""A page whose start names the headings of several kinds this far in is an index of them (Item 8's
list of statements), not one of them."""

_TABLE = Path(__file__).with_name("named_sections.toml")


@dataclass(frozen=True)
class SectionKind:
    """One kind of named section: its `name` (the TOML table), `title` (how `halaman find` says it),
    the `headings` its pages start with and the phrases a question names it by (`asked_as`)."""

    name: str
    title: str
    headings: tuple[str, ...]
    asked_as: tuple[str, ...]
    group: str | None = None
    secondary: tuple[str, ...] = ()


def section_kinds() -> list[SectionKind]:
    """The kinds in `named_sections.toml`, in file order."""
    table = tomllib.loads(_TABLE.read_text(encoding="utf-8"))
    return [SectionKind(name, spec["title"], tuple(spec["headings"]), tuple(spec["asked_as"]), spec.get("group"),
                        tuple(spec.get("secondary", ()))) for name, spec in table.items()]


def _number_share(text: str) -> float:
    """The share of a page's words that are numbers (1,234 / (56) / 12.5 %): near 0 for prose,
    0.3-0.6 for a financial statement."""
    words = text.split()
    return sum(1 for w in words if re.fullmatch(r"[($]*-?[\d,.]+%?\)?", w) and any(c.isdigit() for c in w)) / len(words) if words else 0.0


def _phrase(text: str) -> re.Pattern:
    """A phrase as a pattern: whole words, any spacing, a hyphen or a space alike."""
    words = [re.escape(w) for w in re.split(r"[\s-]+", text.strip().lower()) if w]
    return re.compile(r"(?<![\w&])" + r"[\s-]+".join(words) + r"(?![\w&])")


@dataclass
class NamedSections:
    """Which segments of a document start each named kind of section (`of`)."""

    pages: dict[str, list[int]]  # kind name -> segment indices, best first (see `of`)
    kinds: list[SectionKind]

    @classmethod
    def of(cls, document: Document, kinds: list[SectionKind] | None = None,
           exclude: frozenset[int] = frozenset()) -> NamedSections:
        """The segments whose first HEAD_CHARS characters hold one of a kind's headings (segments
        in `exclude`, the contents pages, are not sections), best first: a heading on a line of its
        own before one in running text, then the share of numbers on the page (a statement is a
        table; a page that mentions "the consolidated balance sheets" in prose is not one)."""
        kinds = section_kinds() if kinds is None else kinds
        patterns = {kind.name: [_phrase(h) for h in kind.headings] for kind in kinds}
        scored: dict[str, list[tuple[float, int]]] = {kind.name: [] for kind in kinds}
        by_name = {kind.name: kind for kind in kinds}
        for i, segment in enumerate(document.segments):
            if i in exclude:
                continue
            head = " ".join(segment.text[:HEAD_CHARS].split()).lower()
            lines = [" ".join(line.split()).lower() for line in segment.text[:HEAD_CHARS].splitlines()]
            matched = {name: [p for p in found if p.search(head)] for name, found in patterns.items()}
            matched = {name: found for name, found in matched.items() if found}
            if not matched:
                continue
            wider = " ".join(segment.text[:INDEX_CHARS].split()).lower()
            groups = [by_name[name].group for name, found in patterns.items()
                      if by_name[name].group and any(p.search(wider) for p in found)]
            numbers = _number_share(segment.text)
            for name, found in matched.items():
                kind = by_name[name]
                own_line = any(m.search(line) and len(line) <= len(m.pattern) + 40 for m in found for line in lines)
                variant = any(_phrase(word).search(head) for word in kind.secondary)
                index_page = kind.group is not None and groups.count(kind.group) > 1
                scored[name].append((own_line + numbers - 0.5 * variant - index_page, i))
        pages = {name: [i for _, i in sorted(found, key=lambda x: (-x[0], x[1]))] for name, found in scored.items()}
        return cls(pages, kinds)

    def asked(self, question: str) -> list[SectionKind]:
        """The kinds the question names by one of their phrases, in file order."""
        lowered = " ".join(question.lower().split())
        return [kind for kind in self.kinds if self.pages.get(kind.name)
                and any(_phrase(p).search(lowered) for p in kind.asked_as)]
