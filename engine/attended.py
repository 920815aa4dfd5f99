"""Attended passages: the sentences or lines of a document the answer's attention went to.

`DocumentSession` measures, per prompt token, the attention the recalled tokens received while the
question and the answer were decoded (`RecallHook.token_attention`). `Answer.sources` sums it per
page or file; `attended_spans` here sums it per *sentence or line* of each page or file and returns
the strongest as character ranges in that segment's text (`Segment.text`), so a viewer can
highlight them (the GUI's source pane maps them to PDFium's character boxes) and the CLI can print
them (`halaman ask --show-spans`).

Torch-free: the mass comes in as a list of floats.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.documents import Document
from engine.evidence_quotes import quote_text

PASSAGES_MAX = 5
"""At most this many passages per answer above the floors (`attended_spans`' `cover` may add a few)."""
PASSAGE_MIN_SHARE = 0.03
"""A passage below this share of the attended mass is not shown (noise, not evidence)."""
PASSAGE_MIN_OF_STRONGEST = 0.25
"""Nor below this part of the strongest passage's mass: on a recalled page every sentence gets some
attention, and highlighting five of a page's six lines says nothing."""
COVER_RUNS_MAX = 2
"""A page or file listed among an answer's sources that none of its passages is on gets at most
this many of its own (`attended_spans`' `cover`)."""
TOKEN_CAP_QUANTILE = 0.95
"""Each token's mass is capped at this quantile of the attended tokens' masses. A few tokens soak up
attention whatever they say (attention sinks, StreamingLLM, Xiao et al. 2023): on the embedded
model one token of a distractor sentence got 165 where the needle's sentence's strongest got 36,
and uncapped that sentence outranked the needle's (tests/test_cli.py)."""

# A unit ends after a line break, or after sentence punctuation followed by white space.
_UNIT_END = re.compile(r"\n|(?<=[.!?])\s+")


@dataclass(frozen=True)
class AttendedSpan:
    """A passage the answer attended to: characters `char_start`..`char_end` (end exclusive) of
    `Document.segments[segment_index].text`, whose tokens received `share` (0..1) of all the
    attention the recalled document tokens received. label / page / path as in `Segment`.
    document_source: the file or folder (`Document.source`) of the document it is in, for an answer
    over several (`engine.workspace.Workspace.library_outcome`); None for one document's answer.
    quote: the passage's text, cut (`engine.evidence_quotes.quote_text`), so a stored answer shows
    its evidence without the document ("" in records from before it was kept)."""

    segment_index: int
    label: str
    page: int | None
    path: str | None
    char_start: int
    char_end: int
    share: float
    document_source: str | None = None
    quote: str = field(default="", compare=False)

    def text(self, document: Document) -> str:
        """The passage's characters in `document` (the one it was measured on)."""
        return document.segments[self.segment_index].text[self.char_start:self.char_end]


def segment_text_starts(document: Document) -> list[int]:
    """Offset in `document.render()` of each segment's text (after its marker line)."""
    return [text for _, text in document.offsets()]


def units(text: str) -> list[int]:
    """Start offsets of the sentences / lines of `text` (the first is 0)."""
    return [0] + [m.end() for m in _UNIT_END.finditer(text) if m.end() < len(text)]


def attended_spans(mass: list[float], token_chars: list[int], first_text_token: int, document: Document,
                   *, max_spans: int = PASSAGES_MAX, min_share: float = PASSAGE_MIN_SHARE,
                   cover: Iterable[int] = ()) -> list[AttendedSpan]:
    """The strongest attended passages, strongest first.

    mass: attention per prompt token (index = token position); only the document-text tokens
    `first_text_token .. first_text_token + len(token_chars)` count, the template is nobody's
    passage. token_chars: each text token's first character in `document.render()`. Each token's
    mass goes to the sentence or line (`units`) of the segment its first character lies in
    (tokens of marker lines to none), capped at `TOKEN_CAP_QUANTILE`; units are ranked by summed
    mass and the `max_spans` strongest are kept while above `min_share` of the total and
    `PASSAGE_MIN_OF_STRONGEST` of the first. Neighbours are not merged: each keeps its own share,
    so a viewer shows the strong sentence stronger than the weak ones around it.

    cover: indices of segments the answer lists as its sources (`Answer.sources`). One whose
    attention is spread over many lines (two functions of a file, half each) may have no unit above
    the floors; it then gets its strongest runs of attended units (neighbours, one unattended unit
    between them allowed), at most `COVER_RUNS_MAX`, each above `PASSAGE_MIN_OF_STRONGEST` of its
    first, so that a click on that source shows where in it the attention went. A page (a PDF's:
    sentences and table rows) gets its strongest units alone instead of runs: on a recalled page
    every row is attended a little, and a run was the whole table.
    """
    starts = segment_text_starts(document)
    end = first_text_token + len(token_chars)
    attended = sorted(w for w in mass[first_text_token:end] if w > 0)
    if not attended:
        return []
    cap = attended[int(TOKEN_CAP_QUANTILE * (len(attended) - 1))]
    per_unit: dict[tuple[int, int], float] = {}
    unit_starts: dict[int, list[int]] = {}
    total = 0.0
    attended_at = (i for i, w in enumerate(mass[first_text_token:end]) if w > 0)  # few: the recalled tokens
    for i in attended_at:
        char, weight = token_chars[i], min(mass[first_text_token + i], cap)
        total += weight
        seg = bisect.bisect_right(starts, char) - 1
        if seg < 0:
            continue
        offset = char - starts[seg]
        text = document.segments[seg].text
        if offset >= len(text):  # the blank line after the text, or the next marker
            continue
        bounds = unit_starts.get(seg)
        if bounds is None:
            bounds = unit_starts[seg] = units(text)
        unit = bisect.bisect_right(bounds, offset) - 1
        per_unit[seg, unit] = per_unit.get((seg, unit), 0.0) + weight
    if total <= 0:
        return []
    ranked = sorted(per_unit, key=lambda key: -per_unit[key])[:max_spans]
    floor = max(min_share * total, PASSAGE_MIN_OF_STRONGEST * per_unit[ranked[0]])
    spans = []
    for seg, unit in ranked:
        if per_unit[seg, unit] < floor:
            break
        spans.append(_span(document, seg, unit_starts[seg], unit, unit, per_unit[seg, unit] / total))
    shown = {span.segment_index for span in spans}
    for seg in dict.fromkeys(cover):
        if seg in shown or seg not in unit_starts:
            continue
        own = sorted(unit for s, unit in per_unit if s == seg)
        if document.segments[seg].page is not None:
            # A page's units are its sentences and a table's rows: a run of them on a recalled page
            # (every row gets some attention) was the whole table, highlighted evenly. Its
            # strongest rows instead, each with its own share.
            runs = sorted(((unit, unit, per_unit[seg, unit]) for unit in own), key=lambda run: -run[2])
        else:  # a file's lines: a function's body is a run of weak lines, each too weak alone
            runs = _runs(own, lambda unit: per_unit[seg, unit])
        for first, last, weight in runs[:COVER_RUNS_MAX]:
            if weight < PASSAGE_MIN_OF_STRONGEST * runs[0][2]:
                break
            spans.append(_span(document, seg, unit_starts[seg], first, last, weight / total))
    return sorted(spans, key=lambda span: -span.share)  # stable: equal shares keep their order


def _runs(attended: list[int], weight) -> list[tuple[int, int, float]]:
    """Runs of the sorted unit indices `attended` (a gap of one unit allowed), as (first unit, last
    unit, summed `weight(unit)`), strongest first."""
    runs: list[list] = []
    for unit in attended:
        if runs and unit <= runs[-1][1] + 2:
            runs[-1][1] = unit
            runs[-1][2] += weight(unit)
        else:
            runs.append([unit, unit, weight(unit)])
    return sorted((tuple(run) for run in runs), key=lambda run: -run[2])


def _span(document: Document, seg: int, bounds: list[int], first: int, last: int, share: float) -> AttendedSpan:
    """The passage of units `first`..`last` of segment `seg` (unit starts `bounds`), its trailing
    white space left out."""
    segment = document.segments[seg]
    start = bounds[first]
    end = bounds[last + 1] if last + 1 < len(bounds) else len(segment.text)
    while end > start and segment.text[end - 1].isspace():
        end -= 1
    return AttendedSpan(seg, segment.label, segment.page, segment.path, start, end, share,
                        quote=quote_text(segment.text[start:end]))

def describe(span: AttendedSpan, document: Document, width: int = 120, file_lines: list[int] | None = None) -> str:
    """One line for a person: 'page 12, characters 340–520 (41 %): "…text…"' (the text's white
    space collapsed, cut to about `width` characters). `file_lines`: for a file, the line number
    on disk of each line of its segment's text (`engine.documents.lines.file_line_numbers`); the
    passage's lines are then named as the file numbers them ('src/app.py, lines 127–128, …')."""
    text = " ".join(span.text(document).split())
    if len(text) > width:
        text = text[:width - 1].rstrip() + "…"
    where = span.label
    if file_lines is not None:
        segment_text = document.segments[span.segment_index].text
        first = file_lines[segment_text.count("\n", 0, span.char_start)]
        last = file_lines[segment_text.count("\n", 0, max(span.char_start, span.char_end - 1))]
        where += f", line {first:,}" if first == last else f", lines {first:,}–{last:,}"
    return f"{where}, characters {span.char_start:,}–{span.char_end:,} ({span.share * 100:.0f} %): \"{text}\""
