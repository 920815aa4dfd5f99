"""OpenDocument: one open document's state in one handle, released by `close()`.

`DocumentSession.open` reads, tokenizes and prefills (or restores) a document, then holds the
result here: the document, its prompt-prefix encoding, its prefix-cache key, its snapshot, where
recall gets its tokens (the archive, or the prefix token ids to re-read), its spans and full-text
index, its report and, opened index first, its whole read still to do (`PendingRead`). Nothing in
it is a model: a session keeps the model, the settings and the conversation, so several of these
could share one model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.answer import Source
from engine.attended import AttendedSpan, attended_spans
from engine.documents import Document
from engine.grounding import DocumentWords
from engine.errors import HalamanError
from engine.kvcache.archive import Archive, ArchiveError, ArchiveLayout, ArchiveWriter
from engine.kvcache.cache import CompressedCache, MemoryBreakdown
from engine.prompt import PrefixEncoding
from engine.prompt_lookup import PromptLookup
from engine.read_checkpoint import ReadCheckpoints
from engine.read_time import ReadPlan
from engine.recall_plan import RecallPlan, RecallSource
from engine.settings import CachePolicy
from engine.evidence.spans import DocumentSpans

# Sources below this share of the recalled attention are not listed.
SOURCE_MIN_SHARE = 0.05
SOURCES_MAX = 5


class RecallGap(enum.Enum):
    """What a document that needed an archive (one the cache does not keep whole) does without one,
    as the first words of its warning: its recall plan (`engine.recall_plan`) is OFF, or it REREADs
    the spans it chooses from their token ids for each question (slower answers)."""

    OFF = "recall is off for this document"
    REREAD = "recall re-reads the parts it chooses for each question (slower answers)"


@dataclass(frozen=True)
class RecallNotice:
    """A `RecallGap` and what caused it; `str()` is the warning's line."""

    gap: RecallGap
    why: str

    def __str__(self) -> str:
        return f"{self.gap.value}: {self.why}"

    @classmethod
    def of(cls, plan: RecallPlan) -> RecallNotice | None:
        """The warning of a plan whose document has no archive although it needs one, else None."""
        if plan.archive_missing is None:
            return None
        return cls(RecallGap.REREAD if plan.source is RecallSource.REREAD else RecallGap.OFF, plan.archive_missing)


@dataclass
class OpenReport:
    """What opening a document did and cost."""

    title: str
    kind: str
    document_tokens: int
    prefix_hit: bool
    position_mode: str
    seconds: float              # whole open, reading included
    prefill_seconds: float      # 0 on a prefix-cache hit
    prefill_tokens_per_s: float
    kv: MemoryBreakdown
    full_fp16_bytes: int        # what a full 16-bit cache of the document would take
    warnings: list[str] = field(default_factory=list)
    pages: int | None = None
    threads: int = 0            # CPU threads the prefill ran with (0: no prefill, or on a GPU)
    recall_notice: RecallNotice | None = None  # the document needed an archive and has none (also in `warnings`)
    recall_plan: RecallPlan | None = None      # where its questions' recalled tokens come from
    unread: bool = False        # opened index first and not read whole yet: questions re-read their spans
    read_plan: ReadPlan | None = None  # when unread: how long its whole read will take on this machine
    read_from: int = 0          # when unread: tokens an earlier read kept (`engine.read_checkpoint`), where its read goes on


@dataclass
class PendingRead:
    """The whole read of a document: its prefix token ids and where it stands. `cache` (None before
    the first chunk) holds the tokens read so far (`cache.seen_tokens`), `writer` the archive being
    written; once finished, `archive` is the kept archive (None without one) and `own_archive` its
    file when no prefix store keeps it (deleted when the document closes). `checkpoints`: what it
    keeps in the prefix store to go on after a stop or a restart (None without a store)."""

    ids: list[int]
    policy: CachePolicy
    key: str
    layout: ArchiveLayout | None
    label: str                  # the prefix-cache entry's label
    cache: CompressedCache | None = None
    writer: ArchiveWriter | None = None
    archive: Archive | None = None
    own_archive: Path | None = None
    seconds: float = 0.0        # prefilling, over every part of the read
    threads: int = 0            # CPU threads of its last part (0 on a GPU)
    missing: list[str] = field(default_factory=list)  # why the archive the plan needs was not kept
    checkpoints: ReadCheckpoints | None = None
    resumed_from: int = 0       # tokens its checkpoint held when this process took the read up (`seconds` reads the rest)

    @property
    def tokens_read(self) -> int:
        """Tokens read so far: in memory, else by its checkpoint on disk (where the read goes on)."""
        if self.cache is not None:
            return self.cache.seen_tokens
        return self.checkpoints.saved_tokens if self.checkpoints is not None else 0

    def restarted(self) -> PendingRead:
        """The same read from its checkpoint, else its first token (a cancelled chunk leaves the
        cache in memory inconsistent)."""
        return PendingRead(self.ids, self.policy, self.key, self.layout, self.label, checkpoints=self.checkpoints)

    def close(self) -> None:
        """Stop: its archive file is kept when a checkpoint holds part of it, else deleted."""
        if self.checkpoints is not None:
            self.checkpoints.close(self.writer)
        elif self.writer is not None:
            self.writer.abort()
        self.writer = None


@dataclass
class OpenDocument:
    """One open document.

    document: as read (`engine.documents.load_document`).
    encoding: its prompt prefix: token ids, where each segment and the text start, the character
        offset of each text token (`engine.prompt.PrefixEncoding`).
    key: its prefix-cache key (`engine.prefix_store.prefix_key`), whether or not it is stored.
    snapshot: the compressed cache of the whole prefix; questions fork it. Opened index first and not
        read yet: empty, its stream past the prefix (`DocumentSession.read` replaces it).
    report: what opening it did and cost; its `recall_plan` says where recall gets its tokens.
    spans: its spans, full-text index and structure (None: the tokenizer gives no offsets, or the
        index could not be built).
    archive: every prefix token's K/V on disk, for recall (None: none; spans are then re-read from
        `encoding.ids`, or recall is off).
    own_archive: the archive's file when no prefix store keeps it: deleted by `close`.
    pending_read: its whole read, not done yet (opened index first); None once read.
    prefilled: the open prefilled it (a prefix-cache miss): the first answer is no prefix hit.
    """

    document: Document
    encoding: PrefixEncoding
    key: str
    snapshot: CompressedCache
    report: OpenReport
    spans: DocumentSpans | None = None
    archive: Archive | None = None
    own_archive: Path | None = None
    pending_read: PendingRead | None = None
    prefilled: bool = False
    _lookup: PromptLookup | None = field(default=None, init=False, repr=False)  # built at the first drafting question
    _words: DocumentWords | None = field(default=None, init=False, repr=False)  # folded at the first answer checked

    @property
    def ids(self) -> list[int]:
        """The prefix token ids `[prefix tokens]`."""
        return self.encoding.ids

    @property
    def text_range(self) -> tuple[int, int]:
        """Prefix tokens of the document text: [first, end)."""
        return self.encoding.head_tokens, self.encoding.head_tokens + self.encoding.text_tokens

    @property
    def recall_plan(self) -> RecallPlan | None:
        """Where its questions get their recalled tokens (`engine.recall_plan`), from its report."""
        return self.report.recall_plan

    @property
    def unread(self) -> bool:
        """Opened index first and not read whole yet."""
        return self.pending_read is not None

    def unread_progress(self) -> tuple[int, int]:
        """(tokens read, tokens) of its whole read; (n, n) once it is read. Before the read runs,
        what its checkpoint on disk holds: where it will go on (`engine.read_checkpoint`)."""
        n = len(self.ids)
        if self.pending_read is None:
            return n, n
        return self.pending_read.tokens_read, n

    def read_finished(self) -> PendingRead:
        """Take the finished whole read's snapshot and archive in place of the unread ones; returns
        the read (its cost and why its archive is missing, for the report)."""
        read = self.pending_read
        assert read is not None and read.cache is not None
        self.snapshot, self.archive, self.pending_read = read.cache, read.archive, None
        if read.own_archive is not None:
            self.own_archive = read.own_archive
        return read

    def take_prefix_hit(self) -> bool:
        """Whether the next answer is a prefix hit (`engine.answer.Answer.prefix_hit`): the document
        is read whole and was not read just for it (the open prefilled it, and this is the first
        answer since). Only the first answer after a prefilling open is no hit: this says so once."""
        hit = not self.prefilled and self.pending_read is None
        self.prefilled = False
        return hit

    def words(self) -> DocumentWords:
        """Its text folded for `engine.grounding` (once: a book's takes 0.06 s)."""
        if self._words is None:
            self._words = DocumentWords(self.document.render())
        return self._words

    def prompt_lookup(self, context_ids: list[int]) -> PromptLookup:
        """The n-gram draft index over the prefix tokens (built once, ≈0.2 s per 100k tokens),
        reset to an answer whose context so far is `context_ids` (`engine.prompt_lookup`)."""
        if self._lookup is None:
            self._lookup = PromptLookup(self.ids)
        self._lookup.reset(context_ids)
        return self._lookup

    @property
    def recall_source(self) -> RecallSource:
        """Where a library question gets its tokens (one vocabulary with `engine.recall_plan`):
        ARCHIVE (read whole, archive kept), WHOLE (read whole and kept whole by the cache: every
        token is in its snapshot) or REREAD (not read whole yet, or its archive is missing:
        prefilled again from its token ids)."""
        if self.archive is not None:
            return RecallSource.ARCHIVE
        if not self.unread and self.recall_plan is not None and self.recall_plan.source is RecallSource.WHOLE:
            return RecallSource.WHOLE
        return RecallSource.REREAD

    def keys_values_at(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(keys before RoPE, values) `[kv_heads, len(positions), head_dim]` float32 of `layer` at the
        prefix `positions` (`[R]`), from its archive (ARCHIVE) or its snapshot (WHOLE), and the
        archive bytes read (0 from the snapshot). Raises HalamanError when an archive block differs
        from its digest (the archive is dropped: the next question re-reads its pages), ValueError
        for a position its snapshot does not hold (REREAD: nothing to read here)."""
        archive = self.archive
        if archive is None:
            keys, values = self.snapshot.layers[layer].keys_values_at(positions, torch.float32)
            return keys, values, 0
        try:
            fields = archive.read(layer, positions.expand(archive.layout.kv_heads, -1).contiguous())
        except ArchiveError as error:
            self.drop_archive()
            raise HalamanError(f"{self.document.title}: a block of its saved reading is damaged ({error}); "
                               "ask again to re-read its pages") from None
        keys, values = archive.decode(fields, torch.float32)
        return keys, values, sum(t.nbytes for t in fields.values())

    def drop_archive(self) -> None:
        """Stop recalling from the archive (found damaged): close it; the file is the store's."""
        if self.archive is not None:
            self.archive.close()
        self.archive = None

    def span_label(self, span) -> str:
        """How an answer names a recalled span (`engine.evidence.spans`): its segment's label, with the
        characters when it is only part of the segment."""
        segment = self.document.segments[span.segment]
        whole = span.char_start == 0 and span.char_end == len(segment.text)
        return segment.label if whole else f"{segment.label} (characters {span.char_start:,}–{span.char_end:,})"

    def sources(self, mass: torch.Tensor) -> tuple[list[Source], list[AttendedSpan]]:
        """Pages / files whose tokens received the most of `mass` (`[document tokens]` float64,
        the attention each prefix token received while the question and the answer were fed: its
        recalled copy's, or for a document kept whole its own), with their share; and the
        sentences / lines within them that received it (`engine.attended.attended_spans`)."""
        starts_list = self.encoding.segment_starts
        if not starts_list:
            return [], []
        n_doc = self.report.document_tokens
        # float64: a float32 total and per-page sums added in another order can give a share > 1
        mass = mass.double()
        first, end = self.text_range
        mass[:first] = 0  # the template and the instructions are nobody's page
        mass[end:] = 0
        total = float(mass.sum())
        if total <= 0:
            return [], []
        starts = torch.tensor(starts_list)
        segment = (torch.searchsorted(starts, torch.arange(n_doc), right=True) - 1).clamp(min=0)
        per_segment = (torch.zeros(len(starts_list), dtype=torch.float64).index_add_(0, segment, mass) / total).clamp_(max=1.0)
        shares, order = per_segment.sort(descending=True)
        sources = []
        for share, i in zip(shares.tolist()[:SOURCES_MAX], order.tolist()[:SOURCES_MAX], strict=True):
            if share < SOURCE_MIN_SHARE:
                break
            seg = self.document.segments[i]
            sources.append(Source(label=seg.label, share=share, page=seg.page, path=seg.path,
                                  shown=seg.shown if seg.shown != seg.label else None))
        cover = order.tolist()[:len(sources)]  # a source listed is a source a click shows a passage of
        return sources, attended_spans(mass.tolist(), self.encoding.token_chars, first, self.document, cover=cover)

    def close(self) -> None:
        """Release what it holds: the archive (closed), the index (closed), a read paused half-way
        (its archive is kept only with the checkpoint that holds part of it), an archive kept only
        for this session (deleted). Idempotent."""
        if self.archive is not None:
            self.archive.close()
            self.archive = None
        if self.spans is not None:
            self.spans.close()
            self.spans = None
        if self.pending_read is not None:
            self.pending_read.close()
        self.pending_read = None
        if self.own_archive is not None:
            self.own_archive.unlink(missing_ok=True)
            self.own_archive = None
        self._lookup = None
