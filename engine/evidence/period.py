"""A year's figure answered with one quarter's (`quarter_cell`).

Why: asked "What were Netflix's total revenues in 2017?", the model read the year's income
statement and the quarterly table and answered with the fourth quarter's $3,285,755. The figure is
in what it read, so the number check passes; the row it comes from says otherwise: "Total revenues
$ 3,285,755 $ 2,984,859 $ 2,785,464 $ 2,636,635" holds four amounts, a quarterly table's four
columns, and they add up to the year's 11,692,713. A row of exactly four amounts is the shape of
"Selected Quarterly Financial Data" in a 10-K (an annual statement has two or three columns, a
five-year summary five). Pure: strings in, a `QuarterCell` or None out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# A question about a year: "in 2017", "for fiscal 2022", "FY2019", "annual", "full-year".
_ASKS_YEAR = re.compile(r"\b(?:in|for|during|of|over)\s+(?:the\s+)?(?:fiscal\s+(?:year\s+)?|FY\s?)?(?:19|20)\d{2}\b|"
                        r"\bFY\s?'?\d{2}(?:\d{2})?\b|\bannual\b|\bfull[- ]year\b|\bfiscal (?:year )?(?:19|20)\d{2}\b",
                        re.IGNORECASE)
_ASKS_QUARTER = re.compile(r"\bquarter|\bQ[1-4]\b|\bthree months\b|\bthree-month\b", re.IGNORECASE)
_AMOUNT = r"\$?\s?\(?\d{1,3}(?:,\d{3})+(?:\.\d+)?\)?"
# A table row as text: its label, then exactly four amounts (a fifth would make it another table).
_ROW = re.compile(rf"([A-Za-z][A-Za-z ,'&()/-]{{2,60}}?)\s+((?:{_AMOUNT}\s+){{3}}{_AMOUNT})(?!\s*\$?\s?\(?\d)")


@dataclass(frozen=True)
class QuarterCell:
    """The answer's `figure` found as one of the four amounts of the row `label` on page `where`;
    `total`: the four added (what the year's figure would be), as written with thousands commas."""

    figure: str
    label: str
    where: str
    total: str

    def note(self) -> str:
        return (f"check the period: {self.figure} is one of four figures in the row \u201c{self.label}\u201d "
                f"({self.where}), a quarterly table's shape; the question asks for the year, and the four "
                f"add up to {self.total}")


def _value(amount: str) -> float:
    return float(re.sub(r"[^\d.]", "", amount))


def quarter_cell(question: str, figures: Sequence[str], passages: Sequence[tuple[str, str]]) -> QuarterCell | None:
    """The first of `figures` (as the answer writes them) that is one cell of a four-amount row of
    `passages` ((label, text) pairs, strongest first), when `question` asks about a year and not a
    quarter; None otherwise. Raises nothing."""
    if not _ASKS_YEAR.search(question) or _ASKS_QUARTER.search(question):
        return None
    for figure in figures:
        digits = re.sub(r"[^\d.]", "", figure).rstrip(".")
        if not digits:
            continue
        for where, text in passages:
            for row in _ROW.finditer(" ".join(text.split())):
                amounts = re.findall(_AMOUNT, row.group(2))
                if any(re.sub(r"[^\d.]", "", a).rstrip(".") == digits for a in amounts):
                    total = sum(_value(a) for a in amounts)
                    shown = f"{total:,.0f}" if total == int(total) else f"{total:,.2f}"
                    return QuarterCell(figure, row.group(1).strip(), where, shown)
    return None
