"""Which spans a question reads: every signal's candidates in one ranked list, then as many of them
as the question needs and the recall budget allows, in document order (recalled in the reading
budget's order: `Selection.recalled`).

Signals, strongest first (`Candidate.signal`):
- structure: what the question names through the document's structure ("chapter 8", "the
  preface", "which chapter …": the contents) — `engine.evidence.structure`;
- section: a section named by its subject ("working capital": the balance sheet) —
  `engine.evidence.named_sections`;
- conversation: a follow-up keeps the spans its previous question read (a pronoun names nothing
  the index can find: "What did he do next?");
- words: BM25 over the spans' words and the names they define (`engine.evidence.text_index`);
- map: a question about the whole document ("What is this book about?", "What is this project?")
  reads its opening (title page, preface, README) and its contents, as does one that shares no word
  with it (before, such questions fell back to block recall at 1–3 tokens/s).

How much follows the model (`engine.evidence.reading_budget`): the structural and section
candidates are taken whole (a section's first pages); the words add their best span and the next
ones, in the ranking's order, while they score within the budget's `words_relative` of the best
and up to its `words_at_most` (the embedded 135M model: 3 within 50 %, read with the best last,
nearest the question, where pages beside it distract it least; a ≥ 1B model with a 32k window: up
to 6 within 50 %). A question
that asks for several things ("compare", two years, "both") reads at least the budget's
`several_at_least` words spans; with `neighbours`, a chosen page whose text runs on across the page
break (`engine.evidence.page_break`) brings the next page; with `pages_at_least` N, a question
whose rules read fewer than N pages reads the next pages of the ranking (as `halaman find` lists
them) up to N. Everything within `budget_tokens`, and at most `max_spans` spans.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.evidence.reading_budget import SMALL, ReadingBudget
from engine.evidence.spans import DocumentSpans, Span

WORD_CANDIDATES = 50
"""Spans the full-text index is asked for (ranked; `halaman find` lists them)."""
NO_INFORMATION = 1e-3
"""A BM25 score at or below this comes from words in more than half the spans only (FTS5's floor IDF)."""
SECTION_PAGES = 2
"""Pages read of each section a question names by its subject: its best page and a continuation."""
CONTENTS_PAGES = 2
"""Contents pages read for a question about the contents: the one that lists what it names first."""

_THING = (r"(document|book|paper|report|file|project|library|repository|repo|package|code ?base|filing|article|manual|"
          r"thesis|text|program|application|app|tool|module|framework|guide|note|notes|presentation|deck|contract|letter)")
# A question about the document as a whole: what it is or is about, who it is for or by, its summary.
# Not "What does the book call …?": a lookup that names the document is not about all of it.
_WHOLE = re.compile(
    rf"\b(what|which)\s+(is|are|was)\s+(this|the|these)\s+{_THING}\b\s*(about|for|\?|\.|$)"
    rf"|\bwho\s+(is|was|are)\s+(this|the)\s+{_THING}\s+(for|written|meant|intended|aimed|by)\b"
    rf"|\bwho\s+(wrote|published|authored|made|maintains)\s+(this|the)\s+{_THING}\b"
    rf"|\bwhat\s+(does|do|did)\s+(this|the)\s+{_THING}\s+(do|cover|describe|teach|explain|say|offer|provide)\s*(\?|$)"
    rf"|\bwhat\s+(is|was)\s+(this|it)\s+(about|for)\b|\bwhat('s| is) (this|it)\s*\?"
    rf"|\b(summari[sz]e|summary of|overview of|outline of|gist of|tl;?dr)\s+(of\s+)?(this|the|it)\b\s*({_THING}|\?|\.|$)"
    rf"|\bmain\s+(idea|topic|point|purpose|theme|subject)s?\s+of\s+(this|the)\s+{_THING}"
    rf"|\b(purpose|goal|aim|subject|topic)\s+of\s+(this|the)\s+{_THING}", re.I)
# A question asking for several things, each perhaps on its own page: a comparison, both or each of
# two, a change between two periods (two different years are counted by `asks_for_several`).
_SEVERAL = re.compile(r"\b(compar\w*|versus|vs\.?|differen\w*\s+between|both|each\s+of|respectively|"
                      r"year[- ]over[- ]year|from\s+(fy\s*)?\d{4}\s+to|between\s+(fy\s*)?\d{4}\s+and)\b", re.I)
_YEAR = re.compile(r"(?<!\d)(?:fy\s*)?((?:19|20)\d{2})(?!\d)", re.I)


@dataclass(frozen=True)
class Candidate:
    """One ranked span: `span` (index into `DocumentSpans.spans`), `signal` (structure, section,
    conversation, words, map, continuation: the text of the span before runs on into it), `why` (what chose it: "chapter 8", "balance sheet", "words
    (BM25 12.3)") and `score` (the signal's own: BM25 for words, else 1.0 falling with rank)."""

    span: int
    signal: str
    why: str
    score: float

    @property
    def reason(self) -> str:
        """`why` in a reader's words: "chapter 8", "balance sheet", "previous question", "matching
        words" (no score), "the document's opening"."""
        return "matching words" if self.signal == "words" else self.why


@dataclass
class Selection:
    """What a question reads: `ranked`, every candidate best first (each span once, under the
    strongest signal that proposed it); `chosen`, the spans read, in document order (a span cut to
    fit the budget has its token and character ends cut with it)."""

    ranked: list[Candidate]
    chosen: list[Span]
    chosen_index: tuple[int, ...] = ()  # the chosen spans' indices in `DocumentSpans.spans`, same order
    # positions in `chosen` in the order the spans are recalled (`ReadingBudget.best_last`); () = as `chosen`
    read_order: tuple[int, ...] = ()

    def recalled(self) -> list[Span]:
        """The chosen spans in the order the model reads them: `chosen`'s document order, or with
        the reading budget's `best_last` the ranking's reverse (the best span nearest the question)."""
        return [self.chosen[k] for k in self.read_order] if self.read_order else list(self.chosen)

    def reasons(self) -> list[Candidate]:
        """The candidate behind each chosen span, in the order of `chosen`."""
        by_span = {c.span: c for c in self.ranked}
        return [by_span[i] for i in self.chosen_index]


@dataclass(frozen=True)
class Turn:
    """An earlier question of the conversation and the spans (indices) it read."""

    question: str
    spans: tuple[int, ...]


def asks_about_whole(question: str) -> bool:
    """Whether the question is about the document as a whole ("What is this library for?")."""
    return bool(_WHOLE.search(question))


def asks_for_several(question: str) -> bool:
    """Whether the question asks for several things that may sit on different pages: a
    comparison, "both", "each of", a change between two years, or two different years named."""
    return bool(_SEVERAL.search(question)) or len(set(_YEAR.findall(question))) >= 2


def select(spans: DocumentSpans, question: str, *, budget_tokens: int, max_spans: int,
           history: Sequence[Turn] = (), reading: ReadingBudget = SMALL) -> Selection:
    """The spans `question` reads (see the module docstring). `history`: earlier turns of the
    conversation, oldest first; the last one's spans are kept for a follow-up. `budget_tokens`
    counts the template's head and tail besides the spans (as `DocumentSpans.recall_positions`
    recalls them). `reading`: how many spans the words may add (the model's,
    `engine.evidence.reading_budget.reading_budget`; default the embedded model's). Raises
    nothing: an empty selection means nothing of the document fits."""
    ranked = _ranked(spans, question, history)
    if asks_for_several(question) and reading.several_at_least > 1:
        reading = dataclasses.replace(reading, words_at_most=max(reading.words_at_most, reading.several_at_least))
    else:
        reading = dataclasses.replace(reading, several_at_least=1)
    taken = _choose(spans, ranked, budget_tokens, max_spans, reading)
    chosen = sorted(taken, key=lambda pair: pair[1].token_start)
    order = tuple(chosen.index(pair) for pair in _best_last(taken)) if reading.best_last else ()
    return Selection(_with_continuations(spans, ranked, {i for i, _ in chosen}), [span for _, span in chosen],
                     tuple(i for i, _ in chosen), order)


def _best_last(taken: list[tuple[int, Span]]) -> list[tuple[int, Span]]:
    """`taken` (in the order the rules took them: best first, a page's run-on page right after it)
    with its pages in reverse, the best last; a page and the pages after it in the document that
    follow it in `taken` (its run-on page, a file's next part) stay in reading order."""
    groups: list[list[tuple[int, Span]]] = []
    for pair in taken:
        if groups and pair[0] == groups[-1][-1][0] + 1:
            groups[-1].append(pair)
        else:
            groups.append([pair])
    return [pair for group in reversed(groups) for pair in group]


def _with_continuations(spans: DocumentSpans, ranked: list[Candidate], chosen: set[int]) -> list[Candidate]:
    """`ranked` with a "continuation" candidate after each chosen span whose next span was read
    because its text runs on there (and that no signal proposed)."""
    listed = {c.span for c in ranked}
    out: list[Candidate] = []
    for candidate in ranked:
        out.append(candidate)
        after = candidate.span + 1
        if candidate.span in chosen and after in chosen and after not in listed:
            label = "runs on from the page before"
            out.append(Candidate(after, "continuation", label, candidate.score))
            listed.add(after)
    return out


def _ranked(spans: DocumentSpans, question: str, history: Sequence[Turn]) -> list[Candidate]:
    found: list[Candidate] = []
    structure, named = spans.structure, spans.named
    words = spans.candidates(question, WORD_CANDIDATES)
    if structure is not None:
        contents_hits = []
        for k, hit in enumerate(structure.references(question)):
            if hit.why == "contents":
                contents_hits.append(hit)
            else:
                found += [Candidate(i, "structure", hit.why, 1.0 / (1 + k)) for i in spans.of_segment(hit.segment)[:1 + hit.rank]]
        # The contents page that lists what the question names first, then those sharing its words
        # ("Which chapter is about files?" → the page listing "14. Files"; "files" is no query word).
        contents_hits.sort(key=lambda h: (h.rank > 0, -structure.shared_words(h.segment, question), h.rank))
        for k, hit in enumerate(contents_hits[:1 if contents_hits and contents_hits[0].rank == 0 else CONTENTS_PAGES]):
            found += [Candidate(i, "structure", "contents", 0.9 / (1 + k)) for i in spans.of_segment(hit.segment)]
    if named is not None:
        for kind in named.asked(question):
            pages = _with_continuation(named.pages[kind.name], SECTION_PAGES)
            for k, segment in enumerate(pages):
                found += [Candidate(i, "section", kind.title, 0.8 / (1 + k)) for i in spans.of_segment(segment)]
    if history:
        found += [Candidate(i, "conversation", "previous question", 0.7) for i in history[-1].spans]
        # A follow-up's words found on more than half the spans have FTS5's floor IDF: pages ranked
        # by them alone ("examples" in a programming book, listed "BM25 0.0") say less than its
        # last question's pages. A question on its own keeps them (in a short document the asked
        # words may be on every page, and their counts still rank).
        words = [hit for hit in words if hit.score > NO_INFORMATION]
    whole = asks_about_whole(question)
    # no word to go by: the opening and contents, unless the question goes on from the last one
    if (whole or not (words or history)) and structure is not None:
        found += [Candidate(i, "map", "contents" if s in structure.contents else "the document's opening", 0.5)
                  for s in [*structure.opening, *structure.contents[:1]] for i in spans.of_segment(s)[:2]]
    found += [Candidate(hit.span, "words", f"words (BM25 {_score_text(hit.score)})", hit.score) for hit in words]
    seen: set[int] = set()
    return [c for c in found if not (c.span in seen or seen.add(c.span))]


def _score_text(score: float) -> str:
    """A BM25 score as `find` lists it: "7.3", and "0.04" for a word on half the pages (one decimal
    printed "BM25 0.0", which read as no match at all)."""
    return f"{score:.1f}" if score >= 0.95 else f"{score:.2f}"


def _with_continuation(pages: list[int], limit: int) -> list[int]:
    """The best page of a section and the pages next to it that are of the same section (a
    statement over two pages), up to `limit`."""
    if not pages:
        return []
    chosen = [pages[0]]
    for page in sorted(pages[1:], key=lambda p: abs(p - pages[0])):
        if len(chosen) < limit and abs(page - pages[0]) == 1:
            chosen.append(page)
    return chosen


def _choose(spans: DocumentSpans, ranked: list[Candidate], budget_tokens: int, max_spans: int,
            reading: ReadingBudget) -> list[tuple[int, Span]]:
    """(span index, span) of the candidates read, in the order taken (`reading.several_at_least`
    words spans are read whatever their score: `select` sets it for a question asking for several;
    fewer than `reading.pages_at_least` pages (or files) read: the best span of each next page
    ranked is read until that many are)."""
    room = [budget_tokens - spans.head_tokens - (spans.n_tokens - spans.text_end)]
    chosen: list[tuple[int, Span]] = []
    words_taken, best_words, others, referenced = 0, None, False, False
    taken: set[int] = set()  # the candidates the rules took (one cut to the room may be absent from chosen)
    for candidate in ranked:
        if len(chosen) >= max_spans or room[0] <= 0:
            break
        if _already_read(spans, chosen, candidate.span):
            continue
        if candidate.signal == "words":
            best_words = candidate.score if best_words is None else best_words
            if words_taken >= reading.several_at_least and candidate.score < reading.words_relative * best_words:
                continue
            if words_taken >= (reading.words_at_most if not others else
                               reading.beside_reference if referenced else reading.beside_structure):
                continue
            words_taken += 1
        else:
            others = others or candidate.signal != "map"
            referenced = referenced or candidate.signal == "structure"
        taken.add(candidate.span)
        _take(spans, candidate.span, reading.neighbours, chosen, room, max_spans)
    # Too few pages read: the pages `find` lists next, in its order, each by its best span (the
    # 135M model's 1-2 pages missed evidence the ranking holds just below the rules' bar).
    units = {span.segment for _, span in chosen}
    for candidate in ranked:
        if len(units) >= reading.pages_at_least or len(chosen) >= max_spans or room[0] <= 0:
            break
        if (spans.spans[candidate.span].segment in units or candidate.span in taken
                or _already_read(spans, chosen, candidate.span)):
            continue
        _take(spans, candidate.span, reading.neighbours, chosen, room, max_spans)
        units = {span.segment for _, span in chosen}
    return chosen


def _already_read(spans: DocumentSpans, chosen: list[tuple[int, Span]], index: int) -> bool:
    """Whether span `index` is read already, as a chosen page's continuation or as the same text
    (a binder's duplicate page, a copied file: read once)."""
    prints = spans.fingerprints
    return any(i == index or (prints and prints[index] == prints[i]) for i, _ in chosen)


def _take(spans: DocumentSpans, index: int, neighbours: bool, chosen: list[tuple[int, Span]], room: list[int],
          max_spans: int) -> None:
    """Add span `index` (and its run-on page with `neighbours`) to `chosen` within `room[0]` tokens
    (lowered by what is added) and `max_spans`; the first span read is cut to the room when it is
    too long (nothing is added when not one token of its text fits)."""
    for i in _with_run_on(spans, index, neighbours):
        if len(chosen) >= max_spans or any(j == i for j, _ in chosen):
            continue
        span = spans.spans[i]
        if span.tokens > room[0]:
            if chosen:
                continue  # a smaller later candidate may still fit
            span = cut_to(spans, span, room[0])
            if span is None:
                return
        chosen.append((i, span))
        room[0] -= span.tokens


def _with_run_on(spans: DocumentSpans, index: int, neighbours: bool) -> list[int]:
    """`index`, and with `neighbours` the span after it when its text runs on across the page break."""
    if neighbours and index < len(spans.runs_on) and spans.runs_on[index]:
        return [index, index + 1]
    return [index]


def cut_to(spans: DocumentSpans, span: Span, room: int) -> Span | None:
    """`span` shortened to `room` tokens (its marker line included), its character end moved with
    its token end, so it is never labelled as the whole page; None when not one token of text fits."""
    keep = room - span.marker_tokens
    if keep < 1:
        return None
    token_end = span.token_start + keep
    return dataclasses.replace(span, token_end=token_end, char_end=max(span.char_start, spans.char_at(span, token_end)))


@dataclass(frozen=True)
class FoundSpan:
    """One row of `halaman find`: a ranked candidate as a reader finds it. `label` ("page 12",
    "src/app.py"), `page` / `path` (one of them None), `char_start` / `char_end` in its segment's
    text, `line_start` / `line_end` (1-based, inclusive, in that text), `whole` (the span is its
    whole page or file), `tokens`, `signal` and `why` (what chose it), `score`, `chosen` (whether
    the question reads it), `shown`: how a reader is shown its unit (`Segment.shown`: "page 48
    (PDF page 68)" where the PDF prints another number; else the label)."""

    rank: int
    label: str
    page: int | None
    path: str | None
    char_start: int
    char_end: int
    line_start: int
    line_end: int
    whole: bool
    tokens: int
    signal: str
    why: str
    score: float
    chosen: bool
    shown: str = ""


def found_spans(selection: Selection, spans: DocumentSpans, document, limit: int = 10) -> list[FoundSpan]:
    """The chosen spans and the best other candidates, at most max(limit, chosen) rows, best
    first (`halaman find`, the window's list)."""
    chosen = set(selection.chosen_index)
    cut = {i: span for i, span in zip(selection.chosen_index, selection.chosen, strict=True)}
    rows: list[FoundSpan] = []
    for candidate in selection.ranked:
        if len(rows) >= max(limit, len(chosen)) and candidate.span not in chosen:
            continue
        span = cut.get(candidate.span, spans.spans[candidate.span])
        segment = document.segments[span.segment]
        line_start = segment.text.count("\n", 0, span.char_start) + 1
        line_end = line_start + segment.text.count("\n", span.char_start, max(span.char_start, span.char_end - 1))
        whole = span.char_start == 0 and span.char_end == len(segment.text)
        rows.append(FoundSpan(len(rows) + 1, segment.label, segment.page, segment.path, span.char_start, span.char_end,
                              line_start, line_end, whole, span.tokens, candidate.signal, candidate.why,
                              round(candidate.score, 3), candidate.span in chosen, segment.shown))
    return rows
