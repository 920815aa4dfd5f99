"""Whether a page's text runs on across the page break: a sentence cut in the middle, or a table
the next page continues ("(continued)" under its heading, as filings and reports print it).

A question whose evidence page is chosen reads the next page too when its text runs on there
(`engine.evidence.select`, a reading budget with `neighbours`): a statement whose totals sit on the
next page, a paragraph whose second half states the answer. Page footers (a page number, a
running title of a few words) are skipped before the last line is judged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.documents import Document

_FOOTER = re.compile(r"^\W*(page\s+)?[\divxlc]+(\s*(of|/)\s*\d+)?\W*$|^.{0,40}\b(10-?K|10-?Q|annual report)\b.{0,20}$", re.I)
_CONTINUED = re.compile(r"\(\s*continued\s*\)|\bcontinued\b", re.I)
LINES_LOOKED_AT = 4
"""Lines at a page's end (footers skipped) and at the next page's start looked at."""


def _content_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _cut_mid_sentence(page: str, following: str) -> bool:
    """The page's last text line ends without closing punctuation and the next page opens in
    lower case: one sentence over the break."""
    tail = [line for line in _content_lines(page)[-LINES_LOOKED_AT:] if not _FOOTER.match(line)]
    head = _content_lines(following)[:1]
    if not tail or not head:
        return False
    last = tail[-1][-1]
    return last in ",;-–(" or (last.isalpha() and last.islower() and head[0][:1].islower())

def runs_on(document: Document, spans: Sequence, k: int) -> bool:
    """Whether span `k` of `spans` (`engine.evidence.spans.Span`) ends its page and its text goes on
    at the top of the next page (a cut sentence, or the next page says "continued" in its first
    lines). False for files, for a page whose next segment is not the next page, and for a span
    that ends before its page does."""
    if k + 1 >= len(spans):
        return False
    span, following = spans[k], spans[k + 1]
    segments = document.segments
    page, after = segments[span.segment], segments[following.segment]
    if page.page is None or after.page != page.page + 1 or span.char_end < len(page.text.rstrip()):
        return False
    if any(_CONTINUED.search(line) for line in _content_lines(after.text)[:LINES_LOOKED_AT]):
        return True
    return _cut_mid_sentence(page.text, after.text)


__all__ = ["runs_on"]
