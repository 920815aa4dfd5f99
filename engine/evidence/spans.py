"""A document's spans (its pages, or parts of long pages and files) in token space, with their
full-text index and the document's structure.

`DocumentSpans.build` cuts every segment into spans (a code file at its definitions, found by
tree-sitter, prose at blank lines: `engine.evidence.code_units`), maps each to
the token range it occupies in the prompt prefix, opens (or rebuilds) the full-text index of their
texts, and reads the document's structure (sections, contents, named sections:
`engine.evidence`). Which spans a question reads is `engine.evidence.select`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.documents import Document
from engine.evidence.named_sections import NamedSections
from engine.evidence.structure import DocumentStructure
from engine.evidence.code_units import indexed_names, segment_spans
from engine.evidence.page_break import runs_on
from engine.evidence.text_index import Hit, TextIndex, load_or_build

# Candidates read from the index per question.
CANDIDATES = 8


@dataclass(frozen=True)
class Span:
    """One span: `segment` (index into `Document.segments`), `token_start` / `token_end` (its range
    in the prompt prefix's token ids, end exclusive; the first span of a segment starts at its
    marker line), `char_start` / `char_end` (the same range in the segment's text),
    `marker_start` / `marker_end` (the tokens of its segment's marker line, "[page 12]" or
    "=== src/app.py ===")."""

    segment: int
    token_start: int
    token_end: int
    char_start: int
    char_end: int
    marker_start: int = 0
    marker_end: int = 0

    @property
    def marker_tokens(self) -> int:
        """Tokens of the marker line recalled with this span beyond its own range: 0 for the first
        span of a segment, which starts at the marker."""
        return self.marker_end - self.marker_start if self.token_start >= self.marker_end else 0

    @property
    def tokens(self) -> int:
        """Tokens recalled for this span: its range plus its segment's marker line."""
        return self.token_end - self.token_start + self.marker_tokens


@dataclass
class DocumentSpans:
    """The spans of the open document and their full-text index.

    head_tokens: prompt tokens before the document text (template head + instructions);
    text_end: the first token after the document text (the template tail starts there);
    n_tokens: tokens of the whole prefix. rebuilt: the index was (re)built at this open.
    structure / named: the document's sections, contents and opening, and its named sections
    (None when built without the document's structure).
    """

    spans: list[Span]
    index: TextIndex
    head_tokens: int
    text_end: int
    n_tokens: int
    rebuilt: bool
    structure: DocumentStructure | None = None
    named: NamedSections | None = None
    token_chars: Sequence[int] = ()   # render() offset of each document-text token
    bodies: Sequence[int] = ()        # render() offset of each segment's text
    by_segment: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # segment -> its span indices
    fingerprints: Sequence[int] = ()  # each span's text, white space folded, hashed: equal text, equal print
    runs_on: Sequence[bool] = ()      # the span's text goes on in the next span, across a page break (`runs_on`)

    @classmethod
    def build(cls, document: Document, token_chars: Sequence[int], head_tokens: int, text_tokens: int,
              n_tokens: int, index_path: Path | None) -> DocumentSpans:
        """Spans of `document` given `token_chars` (the character offset in `document.render()` at
        which each document-text token starts, ascending), the number of prompt tokens before the
        text (`head_tokens`) and of the text itself, and the prefix length. The index lives at
        `index_path` (in memory when None); a missing or damaged one is rebuilt there."""
        spans: list[Span] = []
        texts: list[str] = []
        defs: list[tuple[str, ...]] = []
        prints: list[int] = []

        def token_at(offset: int) -> int:
            return head_tokens + bisect.bisect_left(token_chars, offset)

        for i, (segment, (marker, body)) in enumerate(zip(document.segments, document.offsets(), strict=True)):
            marker_tokens = (token_at(marker), token_at(body))
            # A single file's segment has no path: its label is the file name ("auth.py").
            for piece in segment_spans(segment.path or segment.label, segment.text):
                start, end = piece.start, piece.end
                first = marker if start == 0 else body + start
                spans.append(Span(i, token_at(first), token_at(body + end), start, end, *marker_tokens))
                texts.append(f"{segment.label}\n{segment.text[start:end]}")
                prints.append(hash(" ".join(segment.text[start:end].split())))  # a binder's copies of one page
                defs.append(indexed_names(piece))
        index, rebuilt = load_or_build(texts, index_path, defs)
        structure = DocumentStructure.of(document)
        named = NamedSections.of(document, exclude=frozenset(structure.contents))
        by_segment: dict[int, list[int]] = {}
        for k, span in enumerate(spans):
            by_segment.setdefault(span.segment, []).append(k)
        return cls(spans, index, head_tokens, head_tokens + text_tokens, n_tokens, rebuilt, structure, named,
                   token_chars, [body for _, body in document.offsets()], by_segment, prints,
                   [runs_on(document, spans, k) for k in range(len(spans))])

    def of_segment(self, segment: int) -> list[int]:
        """Indices of the spans of `segment`, in order."""
        return self.by_segment.get(segment, [])

    def char_at(self, span: Span, token: int) -> int:
        """The character offset in `span`'s segment text at which prefix token `token` starts (its
        segment's text length at or past the segment's end)."""
        k = token - self.head_tokens
        if not self.token_chars or k >= len(self.token_chars):
            return span.char_end
        return max(0, min(self.token_chars[k] - self.bodies[span.segment], span.char_end))

    def candidates(self, question: str, limit: int = CANDIDATES) -> list[Hit]:
        """The best `limit` spans for the question's words (BM25), best first; empty when the
        question shares no word with the document."""
        return self.index.search(question, limit)

    def recall_positions(self, chosen: Sequence[Span], *, in_order: bool = False) -> list[int]:
        """Prefix token positions to recall for `chosen`: the template head (instructions), each
        span with its segment's marker line (a part of a long file is read under its path, so
        "which file …?" can be answered and the file cited), the template tail; unique, ascending,
        or with `in_order` the head, then the spans in `chosen`'s order (`Selection.recalled`), then
        the tail (a position already listed is not listed again)."""
        spans = [p for span in chosen
                 for p in (*range(span.marker_start, span.marker_end), *range(span.token_start, span.token_end))]
        ordered = [*range(self.head_tokens), *spans, *range(self.text_end, self.n_tokens)]
        return list(dict.fromkeys(ordered)) if in_order else sorted(set(ordered))

    def close(self) -> None:
        self.index.close()
