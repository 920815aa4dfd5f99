"""Ask the library: one question over several documents, answered from their chosen spans side by side.

Each document is opened index first into an `OpenDocument` (`engine.reading.Reader`, one model
shared by all): its spans, its full-text index and, when it was read whole before, its archive.
(The stored list of documents is `engine.library.Library`; this is the open one.) A question then

1. picks the documents: those the question names, if any (a word of the question in a document's
   title or file name that other documents' texts rarely contain: "3M" names `3M_2022_10K.pdf`,
   "MGM" both `MGMRESORTS_…` filings, "Walmart" the Walmart filing though Best Buy's mentions it
   once, while "proxy", all over the requests code as in Nike's proxy statement, names nothing);
   among them (else among all), by one full-text index over every document's spans, so the BM25
   scores of different documents compare: the best document, and the next ones whose best span
   scores at least SECOND_DOCUMENT_SHARE of its best (at most DOCUMENTS_AT_MOST);
2. chooses spans in each as for a single document (`engine.evidence.select`: structure, named
   sections, words), within an equal share of the recall budget;
3. brings back those spans' keys and values where each document keeps them
   (`OpenDocument.recall_source`: ARCHIVE from its archive, WHOLE from its snapshot when the
   cache keeps it whole, else REREAD from their token ids, as for an unread document) and
   lays them side by side in one stream over the whole library, renumbered 0..R-1 in focus
   (`SpanRecaller`), so the model reads

       [prompt head + instructions] [spans of one document] [spans of another] … [prompt tail]

   as one document (in library order), with nothing read whole and no heavy hitter in view;
4. maps the attention each recalled token received back to its document and page
   (`Source.document`).

A follow-up goes on from the previous answer, as within one document: the documents it read stay
(their spans chosen again with the previous question's kept: `engine.evidence.select`'s
conversation signal), and the best new document the follow-up picks joins them.

Peers answer a library from a few retrieved text chunks; this answers from the keys and values
the documents' own reads computed when they have archives (design: issue "A library").
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.answer import Answer, Source, StopReason
from engine.attended import AttendedSpan
from engine.documents import Document
from engine.errors import HalamanError
from engine.citations import distinct_titles
from engine.evidence.reading_budget import reading_budget
from engine.evidence.select import Selection, Turn, select
from engine.generate import Asked, Decoding, answer_frame, decoding_for, recall_budget, stop_token_ids
from engine.prompt import check_question
from engine.kvcache.cache import CompressedCache
from engine.kvcache.span_recall import SpanRecaller
from engine.models.loader import LoadedModel
from engine.open_document import SOURCE_MIN_SHARE, SOURCES_MAX, OpenDocument, OpenReport
from engine.prefix_store import PrefixStore
from engine.recall_plan import RecallSource
from engine.recall_source import reread_keys_values
from engine.progress import Progress
from engine.reading import Reader
from engine.settings import EngineSettings
from engine.evidence.text_index import QUESTION_WORDS, TextIndex, terms
from engine.threads import ThreadGovernor

# At most this many documents answer one question: the recall budget is shared equally among them,
# and the embedded model answered a book's questions worse with distractors beside the right page.
DOCUMENTS_AT_MOST = 2
# A second document is read when its best span scores at least this share of the best document's
# best span (a question naming two years of a company's filings matches both about as well).
SECOND_DOCUMENT_SHARE = 0.8
# Spans read from the library's index to rank the documents (more when the question names some,
# whose spans may rank below other documents').
MERGED_CANDIDATES = 16
NAMED_CANDIDATES = 256
# A question word names the documents whose name holds it when at most this share of the spans
# that mention it are in other documents (a competitor named in one paragraph of another filing).
NAMED_ELSEWHERE_SHARE = 0.1
# A question word names a document inside a run-together name ("mgm" in MGMRESORTS) only when that
# name part is this long: shorter ones are words ("filed" would take "file").
RUN_TOGETHER_CHARS = 7


@dataclass(frozen=True)
class LibraryPick:
    """A document a library question reads: its place in `OpenLibrary.documents`, its title, its best
    span's BM25 score in the library's index (0 when no word of the question is in the library),
    the spans chosen in it, and whether the question matched it at all (`matched`)."""

    document: int
    title: str
    score: float
    selection: Selection
    matched: bool = True  # False: no word of the question in the library, its opening read instead


@dataclass(frozen=True)
class StreamPart:
    """Prefix positions [start, end) of one document, placed at virtual position `offset` of a
    library question's stream."""

    document: int
    start: int
    end: int
    offset: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LibraryTurn:
    """A library question answered: what a follow-up keeps."""

    question: str
    picks: list[LibraryPick]


def unmatched_note(picks: list[LibraryPick]) -> str | None:
    """A line for the reader when no document the question read matched it (no word of it in the
    library, nor a document it names): the answer comes from the first documents' openings. None
    when one matched."""
    if any(pick.matched for pick in picks):
        return None
    return ("no document of the library has the question's words: the answer read the openings of "
            + ", ".join(pick.title for pick in picks) + ", which may not be about it")


@dataclass
class LibraryAnswer:
    """A library question's answer (its `sources` name their document), the documents it read in
    stream order, and the attended sentences of each (document index -> passages)."""

    answer: Answer
    picks: list[LibraryPick]
    passages: dict[int, list[AttendedSpan]] = field(default_factory=dict)


class OpenLibrary:
    """Several open documents and one question over them (see the module docstring). Not
    thread-safe: one caller at a time; `close` releases every document."""

    def __init__(self, model: LoadedModel, settings: EngineSettings, store: PrefixStore | None = None) -> None:
        settings.validate()
        self.model = model
        self.settings = settings
        self.reader = Reader(model, settings, store)
        self.documents: list[OpenDocument] = []
        self._stop_ids: frozenset[int] | None = None
        self._index: TextIndex | None = None
        self._owners: list[tuple[int, int]] = []  # library index row -> (document, span)
        self._names: list[set[str]] = []          # each document's name terms (title and file name)
        # The conversation: the cache the last answer left (a follow-up goes on from it) and its turn.
        self._conversation: CompressedCache | None = None
        self._turn: LibraryTurn | None = None

    def add(self, path: str | Document, *, password: str | None = None,
            progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None) -> OpenReport:
        """Open one more document index first (`Reader.open(read_now=False)`: seconds for a book
        not read before; its saved reading when it was). Raises what `open` raises, and
        HalamanError when its spans cannot be built (a tokenizer without character offsets)."""
        opened = self.reader.open(path, password=password, progress=progress, cancel=cancel, read_now=False)
        if opened.spans is None:
            opened.close()
            raise HalamanError(f"{opened.report.title}: its text index could not be built, so the library cannot ask it")
        self.documents.append(opened)
        self._drop_index()
        return opened.report

    def titles(self) -> list[str]:
        """Each document's name in picks and citations, same-named files told apart by their paths
        ("a/minutes.txt", "b/minutes.txt": `engine.citations.distinct_titles`)."""
        return distinct_titles([d.document.title for d in self.documents], [d.document.source for d in self.documents])

    def close(self) -> None:
        """Close every document (idempotent)."""
        self._drop_index()
        for opened in self.documents:
            opened.close()
        self.documents = []

    def prepare(self) -> None:
        """Build the library's full-text index now (about 5 s for 30 documents with a 288-page book
        on a laptop CPU) rather than at the first question, which would wait for it."""
        self._library_index()

    # ------------------------------------------------------------- choose
    def choose(self, question: str, previous: LibraryTurn | None = None) -> list[LibraryPick]:
        """The documents `question` reads, best first, each with its chosen spans (see the module
        docstring); a document whose selection is empty is left out. `previous`: the conversation's
        last question, for a follow-up. Raises HalamanError when the library is empty."""
        if not self.documents:
            raise HalamanError("the library is empty: add documents first (halaman library add PATH)")
        index = self._library_index()
        named = self.named(question)
        best: dict[int, float] = {}
        for hit in index.search(question, NAMED_CANDIDATES if named else MERGED_CANDIDATES):
            document = self._owners[hit.span][0]
            if not named or document in named:
                best.setdefault(document, hit.score)
        ranked = sorted(best.items(), key=lambda item: -item[1])
        ranked += [(d, 0.0) for d in sorted(named) if d not in best]
        if ranked:
            ranked = [(d, s) for d, s in ranked if s >= SECOND_DOCUMENT_SHARE * ranked[0][1]][:DOCUMENTS_AT_MOST]
        else:  # no word of the question anywhere ("what are these?"): the first documents' openings
            ranked = [(d, 0.0) for d in range(min(len(self.documents), DOCUMENTS_AT_MOST))]
        matched = bool(best) or bool(named)
        history: dict[int, list[Turn]] = {}
        if previous is not None:  # the documents read before stay, and the best new one joins them
            kept = [(pick.document, pick.score) for pick in previous.picks]
            history = {pick.document: [Turn(previous.question, pick.selection.chosen_index)] for pick in previous.picks}
            ranked = kept + [(d, s) for d, s in ranked if d not in history][:1]
        archived = all(self.documents[d].recall_source is not RecallSource.REREAD for d, _ in ranked)
        first = self.documents[ranked[0][0]].spans
        frame = first.head_tokens + first.n_tokens - first.text_end  # the prompt's head and tail, read once
        share = max(0, self._budget(archived) - frame) // len(ranked)
        picks, titles = [], self.titles()
        for d, score in ranked:
            opened = self.documents[d]
            spans = opened.spans
            own_frame = spans.head_tokens + spans.n_tokens - spans.text_end
            selection = select(spans, question, budget_tokens=own_frame + share, max_spans=self.settings.recall.max_spans,
                               reading=reading_budget(self.model.profile),
                               history=history.get(d, ()))
            if selection.chosen:
                picks.append(LibraryPick(d, titles[d], score, selection, matched or d in history))
        return picks

    def named(self, question: str) -> set[int]:
        """The documents `question` names most (see the module docstring): indices into `documents`;
        empty when it names none. "3M … FY2022" names 3M's filing by two words and every 2022
        filing by one: the 3M filing."""
        index = self._library_index()
        votes: Counter[int] = Counter()
        for term in set(terms(question)) - QUESTION_WORDS:
            owners = {d for d, name in enumerate(self._names)
                      if term in name or (len(term) >= 3 and any(len(part) >= RUN_TOGETHER_CHARS and term in part for part in name))}
            if not owners or len(owners) == len(self._names):
                continue
            mentions = index.rows_with(term)
            elsewhere = sum(self._owners[row][0] not in owners for row in mentions)
            if elsewhere <= NAMED_ELSEWHERE_SHARE * len(mentions):
                votes.update(owners)
        most = max(votes.values(), default=0)
        return {d for d, n in votes.items() if n == most}

    def _budget(self, archived: bool) -> int:
        """Recalled tokens a library question may read (`engine.generate.recall_budget`, as for one
        document; re-read before the first token unless every document is `archived`)."""
        return recall_budget(self.settings, self.model.profile.max_positions, reread=not archived)

    def _library_index(self) -> TextIndex:
        if self._index is None:
            texts, owners, names = [], [], []
            for d, opened in enumerate(self.documents):
                document = opened.document
                name = terms(f"{document.title} {Path(document.source).stem}".replace("_", " "))
                names.append(set(name))
                for k, span in enumerate(opened.spans.spans):
                    segment = document.segments[span.segment]
                    texts.append(f"{segment.label}\n{segment.text[span.char_start:span.char_end]}")
                    owners.append((d, k))
            self._index, self._owners, self._names = TextIndex.build(texts), owners, names
        return self._index

    def _drop_index(self) -> None:
        """Forget the library's index and the conversation (a document added or removed changes
        the stream a follow-up would go on in)."""
        if self._index is not None:
            self._index.close()
        self._index, self._owners, self._names = None, [], []
        self._conversation, self._turn = None, None

    # ---------------------------------------------------------------- ask
    def ask(self, question: str, *, follow_up: bool = False, on_text: Callable[[str], None] | None = None,
            cancel: threading.Event | None = None, max_new_tokens: int | None = None) -> LibraryAnswer:
        """Answer `question` from the spans `choose` picks in the library's documents, streaming
        text pieces to `on_text` (`engine.generate.answer_frame`, recalling by `LibraryStream`);
        `follow_up` goes on from the previous answer (a first question when there is none, or it
        was cancelled). Cancelling keeps what was generated (stop_reason "cancelled").
        Raises HalamanError when the library is empty, the question is empty, recall is off, or
        an archive block is damaged (that document's archive is dropped: ask again to re-read)."""
        check_question(question, "the documents")
        if self.settings.recall.recall_tokens < 1:
            raise HalamanError("recall is off (Settings › Advanced › Recall): a library question reads chosen pages "
                               "of each document, so it needs recall on")
        began = time.perf_counter()
        previous = self._turn if follow_up and self._conversation is not None else None
        conversation, self._conversation, self._turn = self._conversation, None, None
        picks = self.choose(question, previous)
        if not picks:
            raise HalamanError("no page of the library fits the recall budget: raise it in Settings › Advanced › Recall")
        stream = LibraryStream(self, picks, time.perf_counter() - began)
        if previous is not None:
            cache, question_ids = conversation, self.reader.question_ids(question, follow_up=True)
        else:  # empty, its stream past the library's: focus hides it and renumbers the recalled tokens
            cache, question_ids = self.model.decoder.new_cache(stream.policy, "compact"), self.reader.question_ids(question)
            cache.seen_tokens = stream.n_stream
        # Every picked document is consulted (a list, not `all`'s shortcut): each says once that it was just read.
        hit = all([self.documents[pick.document].take_prefix_hit() for pick in picks])
        asked = Asked(question, question_ids, cache, stream.n_stream + len(question_ids), hit, began)
        threads = self.settings.threads if self.model.device.type == "cpu" else None
        answer, passages = answer_frame(self.model.decoder, self.model.tokenizer, asked, stream,
                                        self._decoding(max_new_tokens), threads=threads, on_text=on_text, cancel=cancel)
        if answer.stop_reason is not StopReason.CANCELLED:
            self._conversation, self._turn = cache, LibraryTurn(question, picks)
        return LibraryAnswer(answer, picks, passages)

    def _decoding(self, max_new_tokens: int | None) -> Decoding:
        if self._stop_ids is None:  # the model's stop tokens, looked up once
            self._stop_ids = stop_token_ids(self.model.tokenizer, getattr(self.model.decoder.model, "generation_config", None))
        return decoding_for(self.model, self.settings, self._stop_ids, max_new_tokens)

    def stream(self, picks: list[LibraryPick]) -> tuple[list[StreamPart], torch.Tensor]:
        """The library's stream: the prompt's head (the best picked document's: every document's
        head and tail are the same tokens), every document's text in library order, the prompt's
        tail; and the stream positions of the picked spans (`[R]`, ascending). Its length does not
        depend on the picks, so a follow-up goes on in the same stream."""
        best = picks[0].document
        spans = self.documents[best].spans
        ranges = [(best, 0, spans.head_tokens)]
        ranges += [(d, opened.spans.head_tokens, opened.spans.text_end) for d, opened in enumerate(self.documents)]
        ranges.append((best, spans.text_end, spans.n_tokens))
        chosen = {p.document: torch.tensor(self.documents[p.document].spans.recall_positions(p.selection.chosen))
                  for p in picks}
        parts, positions, offset = [], [], 0
        for d, start, end in ranges:
            parts.append(StreamPart(d, start, end, offset))
            local = chosen.get(d)
            if local is not None:
                positions.append(local[(local >= start) & (local < end)] - start + offset)
            offset += end - start
        return parts, torch.cat(positions)

    def local(self, part: StreamPart, positions: torch.Tensor) -> torch.Tensor:
        """The prefix positions of `part`'s document at the stream `positions` that fall in `part`."""
        inside = positions[(positions >= part.offset) & (positions < part.offset + part.length)]
        return inside - part.offset + part.start

    def _recaller(self, parts: list[StreamPart], positions: torch.Tensor, n_stream: int, policy,
                  governor: ThreadGovernor | None, cancel: threading.Event | None) -> SpanRecaller:
        """Span recall of the stream `positions`, each picked document's tokens from where it keeps
        them (`OpenDocument.recall_source`); the documents that keep none (REREAD) are re-read
        together, in stream order, before the first token."""
        began = time.perf_counter()
        used = [(part, self.local(part, positions)) for part in parts]
        used = [(self.documents[part.document], local) for part, local in used if local.numel()]
        rereads = [(opened, local) for opened, local in used if opened.recall_source is RecallSource.REREAD]
        reread = None
        if rereads:
            ids = torch.cat([torch.tensor(opened.ids)[local] for opened, local in rereads])
            reread = reread_keys_values(self.model.decoder, ids, policy, governor=governor, cancel=cancel)
        keys_values, read = {}, 0
        for layer in range(self.model.profile.num_layers):
            pieces, cursor = [], 0
            for opened, local in used:
                if opened.recall_source is RecallSource.REREAD:
                    keys, values = (t[:, cursor:cursor + local.numel()] for t in reread[layer])
                    cursor += local.numel()
                else:
                    keys, values, n = opened.keys_values_at(layer, local)
                    read += n
                pieces.append((keys.to("cpu", torch.float32), values.to("cpu", torch.float32)))
            keys_values[layer] = (torch.cat([k for k, _ in pieces], 1), torch.cat([v for _, v in pieces], 1))
        hook = SpanRecaller.reread(keys_values, positions, n_stream)
        hook.stats.reread, hook.stats.bytes_read = reread is not None, read
        hook.stats.read_s = time.perf_counter() - began
        return hook

    def _sources(self, parts: list[StreamPart], picked: set[int], mass: torch.Tensor
                 ) -> tuple[list[Source], dict[int, list[AttendedSpan]]]:
        """Pages / files of every picked document that received the most of `mass` (`[stream
        tokens]`), their shares of the attention all of them received, each naming its document;
        and each document's attended sentences."""
        local: dict[int, torch.Tensor] = {}
        for part in parts:
            if part.document not in picked:
                continue
            n = len(self.documents[part.document].ids)
            into = local.setdefault(part.document, torch.zeros(n, dtype=torch.float64))
            into[part.start:part.end] = mass[part.offset:part.offset + part.length]
        totals = {}
        for d, doc_mass in local.items():
            first, end = self.documents[d].text_range
            totals[d] = float(doc_mass[first:end].sum())
        grand = sum(totals.values())
        sources, passages = [], {}
        if grand <= 0:
            return [], {}
        titles = self.titles()
        for d, doc_mass in local.items():
            opened = self.documents[d]
            found, passages[d] = opened.sources(doc_mass.clone())
            weight, shown = totals[d] / grand, opened.document.shown_labels()  # pages named as printed
            sources += [replace(s, share=s.share * weight, document=titles[d], document_source=opened.document.source,
                                shown=shown.get(s.label)) for s in found]
        sources.sort(key=lambda s: -s.share)
        return [s for s in sources if s.share >= SOURCE_MIN_SHARE][:SOURCES_MAX], passages

    def _unsupported(self, picks: list[LibraryPick], text: str, question: str) -> list[str]:
        """Names in the answer that none of the documents it read contains (`engine.grounding`)."""
        missing: list[str] | None = None
        for pick in picks:
            found = self.documents[pick.document].words().unsupported(text, question)
            missing = found if missing is None else [name for name in missing if name in found]
        return missing or []


class LibraryStream:
    """How a library question recalls (an `engine.generate.QuestionRecall`): the picked spans of
    every document laid side by side in one stream (`OpenLibrary.stream`), read where each document
    keeps them (`OpenLibrary.recaller`), and the attention they received mapped back to each
    document's pages (`OpenLibrary.sources`)."""

    def __init__(self, library: OpenLibrary, picks: list[LibraryPick], chose_s: float) -> None:
        self.library, self.picks, self.chose_s = library, picks, chose_s
        self.parts, self.positions = library.stream(picks)
        self.n_stream = self.parts[-1].offset + self.parts[-1].length
        self.policy = library.documents[picks[0].document].snapshot.policy.replace(position_mode="compact")

    def hook(self, cache: CompressedCache, governor: ThreadGovernor | None, cancel: threading.Event | None) -> SpanRecaller:
        library, picks = self.library, self.picks
        hook = library._recaller(self.parts, self.positions, self.n_stream, self.policy, governor, cancel)
        hook.stats.score_s = self.chose_s
        hook.stats.spans = tuple(f"{pick.title}: {library.documents[pick.document].span_label(span)}"
                                 for pick in picks for span in pick.selection.chosen)
        hook.stats.signals = tuple(c.signal for pick in picks for c in pick.selection.reasons())
        hook.stats.reasons = tuple(c.reason for pick in picks for c in pick.selection.reasons())
        return hook

    def sources(self, cache: CompressedCache, hook: SpanRecaller | None) -> tuple[list[Source], dict[int, list[AttendedSpan]]]:
        if hook is None:
            return [], {}
        mass = hook.token_attention([layer.recalled for layer in cache.layers]).double()
        return self.library._sources(self.parts, {pick.document for pick in self.picks}, mass)

    def unsupported(self, text: str, question: str) -> list[str]:
        return self.library._unsupported(self.picks, text, question)

    def instructions(self) -> list[str]:
        return list(dict.fromkeys(phrase for pick in self.picks
                                  for phrase in self.library.documents[pick.document].words().instructions))
