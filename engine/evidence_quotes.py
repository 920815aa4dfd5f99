"""The evidence shown under an answer, so a reader checks it without clicking: the one or two
passages (sentences, or table rows: a PDF table's row is one line) it attended to most, quoted with
their page, and a caution when the answer's number is not in them.

Measured in the window trial that opened issue 44: "What were Netflix's total revenues in 2017?"
was answered "$3,285,755" (the fourth quarter's figure) while the row it attended most reads
"Revenues $ 11,692,713 …"; Foot Locker's "96,076,265 shares" while the highlighted sentence holds
96,089,997. The grounding check (`engine.grounding`) passed both: the numbers are in the document.
`number_caution` compares the answer's numbers with the passages it attended most instead.

Torch-free: passages in (`engine.attended.AttendedSpan` with their `quote`), plain text out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

QUOTED_PASSAGES = 2
"""Passages quoted under an answer: the strongest, and a second one."""
QUOTE_CHARACTERS = 240
"""A quoted passage is cut at this many characters (white space collapsed)."""

# A number a reader would check: at least 4 digits, with thousands separators or a decimal part
# allowed ("11,692,713", "96,089,997", "3.14159", "12500"); not a bare year (1900-2099).
_NUMBER = re.compile(r"(?<![\w.,])\d{1,3}(?:[,\u202f\u00a0 ]\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])\d{4,}(?:\.\d+)?(?![\w])"
                     r"|(?<![\w.,])\d+\.\d{2,}(?![\w])")
_YEAR = re.compile(r"(?:19|20)\d\d")
# A figure an answer states or a passage holds: "$1,475", "3.5%", "0.83", "12"; not part of a word,
# a model name or a range ("A350", "F-35C", "1-2/3").
_FIGURE = re.compile(r"(?<![\w.,\-])\$?\s?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?(?![\w\-])"
                     r"|(?<![\w.,\-])\$?\s?\d+(?:\.\d+)?%?(?![\w\-])")
# A number that names a part of the text, not a quantity: "Section 13", "Item 5.07", "Note 5".
_REFERENCE = re.compile(r"\b(?:Section|Item|Note|Rule|Form|Exhibit|Article|Chapter|Part|Schedule|Page)s?\s+"
                        r"\d+(?:\.\d+)?[A-Za-z]?(?:\([a-z0-9]\))?", re.IGNORECASE)
_CUT_NUMBER = re.compile(r"[\d.,]+\s*\u2026\s*$")
_CITATION = re.compile(r"\[[^\]\n]{0,200}\]")
_LIST_ITEM = re.compile(r"\d{1,2}[.)]\s")


@dataclass(frozen=True)
class QuotedPassage:
    """A passage quoted under an answer: its page or file `label`, its `text` (cut), its `share` of
    the attention (0..1)."""

    label: str
    text: str
    share: float


def quote_text(text: str, limit: int = QUOTE_CHARACTERS) -> str:
    """`text` as one quoted line: white space collapsed, cut at `limit` characters with '…'."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def quoted_passages(passages: Sequence, count: int = QUOTED_PASSAGES) -> list[QuotedPassage]:
    """The `count` strongest of `passages` (`AttendedSpan`s, which carry their `quote`) that have
    text, strongest first."""
    ranked = sorted((p for p in passages if p.quote), key=lambda p: -p.share)
    return [QuotedPassage(p.label, p.quote, p.share) for p in ranked[:count]]


def numbers_in(text: str) -> list[str]:
    """The numbers of `text` a reader would check (`_NUMBER`), as written, years left out."""
    return [m.group() for m in _NUMBER.finditer(text) if not _YEAR.fullmatch(m.group())]


def _digits(number: str) -> str:
    return re.sub(r"[^\d.]", "", number).rstrip(".")


def stated_figures(text: str) -> list[str]:
    """The figures an answer states (`_FIGURE`), as written: amounts, percentages, decimals and
    whole numbers of two or more digits; a bare year and a list's item number ("10. Airbus") are
    not figures, nor is a part of a name or model ("A350", "F-35C"), nor a citation ("[page 42]")."""
    text = _CITATION.sub(" ", text)
    found = []
    for m in _FIGURE.finditer(text):
        figure, digits = m.group().strip(), _digits(m.group())
        if not digits or (_YEAR.fullmatch(digits) and "%" not in figure):
            continue
        if _LIST_ITEM.match(text, m.start()) and (m.start() == 0 or text[m.start() - 1] == "\n"):
            continue
        if "." not in digits and "%" not in figure and "$" not in figure and len(digits) < 2:
            continue
        found.append(figure)
    return found


def _every_number(text: str) -> set[str]:
    """The digits of every number in `text`, small ones and years too, with "1 234 567"'s spaces."""
    found = {_digits(m.group()) for m in _FIGURE.finditer(text)} | {_digits(n) for n in numbers_in(text)}
    found.discard("")
    return found


def held_text(quoted: str) -> str:
    """`quoted` without what looks like a figure but is none: a reference number ("Section 13",
    "Item 5.07", "Note 5", "page 42") and a number cut by the quote's end ("Net revenue $ 3…" of
    $3,991): a chance match with either let a wrong figure through unmarked."""
    return _CUT_NUMBER.sub("…", _REFERENCE.sub(" ", quoted))


def number_caution(answer: str, question: str, quoted: Sequence[QuotedPassage]) -> str | None:
    """A caution when every figure the answer states (`stated_figures`) is missing from the
    `quoted` passages while they hold numbers (a table row, a figure's sentence): the answer may
    have taken another cell, made it up, or computed it (a ratio is worth checking too; counting
    ratios of the passages' numbers as held let chance matches through: a table's few dozen numbers
    give hundreds of ratios). None when the answer states no figure (the question's own numbers
    left out), when one is held, or when the quoted passages hold no number (prose: nothing to
    compare).

    How often it and the grounding note mark wrong and right answers: docs/BENCHMARKS.md, "Marks
    under answers" (§9a, bench/answer_marks.py)."""
    asked = _every_number(question)
    stated = [n for n in stated_figures(answer) if _digits(n) not in asked]
    held = set().union(*(_every_number(held_text(passage.text)) for passage in quoted))
    if not stated or not held:
        return None
    missing = [n for n in stated if _digits(n) not in held]
    if len(missing) < len(stated):
        return None
    where = quoted[0].label
    return (f"check the number: {missing[0]} is not in what the answer read most ({where}: "
            f"“{quote_text(quoted[0].text, 80)}”)")


__all__ = ["QUOTED_PASSAGES", "QuotedPassage", "held_text", "number_caution", "numbers_in", "quote_text", "quoted_passages", "stated_figures"]
