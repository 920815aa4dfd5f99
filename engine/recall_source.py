"""Where one question about an open document gets its recalled tokens, one class per `RecallSource`.

The document's recall plan (`engine.recall_plan`, decided when it opened) names the source; for a
question, `question_recall` chooses what it reads and returns a `engine.generate.QuestionRecall`
(the hook the question is fed with, and the map from the attention the recalled tokens received
back to pages) with the conversation's turn it chose, so the answer frame (`engine.generate.answer_frame`)
asks every source the same way:

    WHOLE         `WholeRecall`: nothing recalled; the attention is the growth of the snapshot's scores
    ARCHIVE       `SpanRecall`: the spans `engine.evidence.select` chooses, read from the archive
    REREAD        `SpanRecall.reread`: the same spans prefilled again from their token ids
    BLOCKS        `BlockRecall`: archive blocks chosen layer by layer by the question's attention
                  (also a spans plan that chose none, when there is an archive)
    OFF           `NoRecall` (also: a budget of 0, or nothing chosen and no archive)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.answer import Source
from engine.attended import AttendedSpan
from engine.evidence.reading_budget import reading_budget
from engine.evidence.select import Selection, Turn, select
from engine.generate import recall_budget
from engine.kvcache.cache import CompressedCache
from engine.kvcache.recall import RecallHook, Recaller
from engine.kvcache.span_recall import SpanCapture, SpanRecaller
from engine.models.decoder import CompressedDecoder
from engine.models.profile import ModelProfile
from engine.open_document import OpenDocument
from engine.progress import Phase, Progress
from engine.recall_plan import RecallSource
from engine.settings import CachePolicy, EngineSettings
from engine.threads import ThreadGovernor

if TYPE_CHECKING:
    from engine.models.loader import LoadedModel


def reread_keys_values(decoder: CompressedDecoder, ids: torch.Tensor, policy: CachePolicy, *,
                       governor: ThreadGovernor | None = None, cancel: threading.Event | None = None,
                       progress: Callable[[Progress], None] | None = None
                       ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys (before RoPE) and values of the token ids `ids` `[R]`, prefilled on
    their own at positions 0..R-1 in a cache of `policy` widened to hold them all (span recall
    without an archive: `SpanRecaller.reread`). `governor` re-decides the CPU threads between
    chunks. `progress` is told after each chunk (`Phase.REREADING`, tokens re-read of R, and the
    rate), the last time at R of R. Returns layer -> (keys, values) `[kv_heads, R, head_dim]`.
    Raises Cancelled when `cancel` is set (checked between chunks)."""
    policy = policy.replace(budget_tokens=max(policy.budget_tokens, len(ids) + policy.chunk_tokens), position_mode="original")
    capture = SpanCapture()

    def chunk_done(done: int, total: int, seconds: float) -> None:
        rate = done / seconds if seconds > 0 else 0.0
        progress(Progress(Phase.REREADING, done, total, "tokens", tokens_per_s=rate,
                          eta_s=(total - done) / rate if rate > 0 else None))

    decoder.prefill(ids, decoder.new_cache(policy, "original"), archive=capture, governor=governor, cancel=cancel,
                    progress=chunk_done if progress is not None else None)
    return capture.keys_values()


def select_spans(opened: OpenDocument, settings: EngineSettings, profile: ModelProfile, question: str,
                 history: Sequence[Turn], *, reread: bool = False) -> Selection:
    """The spans of `opened` that `question` reads (`engine.evidence.select`) within the recall
    budget (`engine.generate.recall_budget`; `reread`: they are re-read, not read from an archive)
    and the model's reading budget (`engine.evidence.reading_budget`, from `profile`)."""
    return select(opened.spans, question, budget_tokens=recall_budget(settings, profile.max_positions, reread=reread),
                  max_spans=settings.recall.max_spans, history=history, reading=reading_budget(profile))


class NoRecall:
    """RecallSource.OFF, or nothing recalled for this question: no hook, no sources."""

    def __init__(self, opened: OpenDocument) -> None:
        self.opened = opened

    def hook(self, cache: CompressedCache, governor, cancel) -> RecallHook | None:
        return None

    def sources(self, cache: CompressedCache, hook: RecallHook | None) -> tuple[list[Source], list[AttendedSpan]]:
        return [], []

    def unsupported(self, text: str, question: str) -> list[str]:
        """Names in `text` that neither the document nor `question` contains (`engine.grounding`)."""
        return self.opened.words().unsupported(text, question)

    def instructions(self) -> list[str]:
        """The document's text written as instructions to the model (`engine.grounding`)."""
        return self.opened.words().instructions


class WholeRecall(NoRecall):
    """RecallSource.WHOLE: the cache keeps the whole document, so nothing is recalled; the attention
    each token received is the growth of the snapshot's scores while the question and the answer
    were fed (`CompressedCache.attention_since`)."""

    def __init__(self, opened: OpenDocument) -> None:
        super().__init__(opened)
        self._before = None  # the scores before the question: this question's, one object per question

    def hook(self, cache: CompressedCache, governor, cancel) -> RecallHook | None:
        self._before = cache.score_snapshot()
        return None

    def sources(self, cache: CompressedCache, hook: RecallHook | None) -> tuple[list[Source], list[AttendedSpan]]:
        if self._before is None:
            return [], []
        return self.opened.sources(cache.attention_since(self._before, self.opened.report.document_tokens))


class BlockRecall(NoRecall):
    """RecallSource.BLOCKS: archive blocks chosen layer by layer by the question's attention
    (`engine.kvcache.recall.Recaller`); the sources are where the recalled tokens' attention went."""

    def __init__(self, opened: OpenDocument, model: LoadedModel, recall_tokens: int) -> None:
        super().__init__(opened)
        self.model, self.recall_tokens = model, recall_tokens

    def hook(self, cache: CompressedCache, governor, cancel) -> RecallHook | None:
        decoder = self.model.decoder
        return Recaller(self.opened.archive, self.recall_tokens, decoder.rope, decoder.scaling)

    def sources(self, cache: CompressedCache, hook: RecallHook | None) -> tuple[list[Source], list[AttendedSpan]]:
        if hook is None:
            return [], []
        return self.opened.sources(hook.token_attention([layer.recalled for layer in cache.layers]).double())


class SpanRecall(BlockRecall):
    """RecallSource.ARCHIVE (the chosen spans read from the archive) and RecallSource.REREAD (no
    archive: prefilled again from their token ids before the first answer token)."""

    def __init__(self, opened: OpenDocument, model: LoadedModel, selection: Selection, *, focus: bool,
                 began: float, progress: Callable[[Progress], None] | None = None) -> None:
        super().__init__(opened, model, 0)
        self.selection, self.focus, self.began = selection, focus, began  # began: the selection's start
        self.progress = progress  # told how far the re-read is, before the answer's first word

    def hook(self, cache: CompressedCache, governor, cancel) -> RecallHook | None:
        opened = self.opened
        # In focus (and when re-read) the spans take positions in the order read: the reading budget's.
        in_order = self.focus or opened.archive is None
        positions = torch.tensor(opened.spans.recall_positions(self.selection.recalled(), in_order=in_order))
        if opened.archive is not None:
            hook = SpanRecaller(opened.archive, positions, focus=self.focus)
        else:
            keys_values = reread_keys_values(self.model.decoder, torch.tensor(opened.ids)[positions], opened.snapshot.policy,
                                             governor=governor, cancel=cancel, progress=self.progress)
            hook = SpanRecaller.reread(keys_values, positions, opened.spans.n_tokens)
            hook.stats.reread = True
        reasons = self.selection.reasons()
        hook.stats.spans = tuple(opened.span_label(span) for span in self.selection.chosen)
        hook.stats.signals = tuple(c.signal for c in reasons)
        hook.stats.reasons = tuple(c.reason for c in reasons)
        hook.stats.score_s = time.perf_counter() - self.began
        return hook


def question_recall(opened: OpenDocument, model: LoadedModel, settings: EngineSettings, question: str,
                    history: Sequence[Turn], progress: Callable[[Progress], None] | None = None
                    ) -> tuple[NoRecall, Turn]:
    """How `question` about `opened` recalls, by its `recall_plan` (see the module docstring), and
    the conversation's turn it makes (the spans it chose; none when it chose none). `history`:
    the conversation's earlier turns, for a follow-up. `progress`: told how far the chosen spans
    are re-read (`Phase.REREADING`) where there is no archive to recall them from. Raises nothing
    of its own."""
    recall, plan, turn = settings.recall, opened.recall_plan, Turn(question, ())
    if recall.recall_tokens < 1 or not plan.recalls:
        return (WholeRecall(opened) if plan.source is RecallSource.WHOLE else NoRecall(opened)), turn
    if plan.by_spans:
        began = time.perf_counter()
        selection = select_spans(opened, settings, model.profile, question, history,
                                 reread=opened.archive is None)
        if selection.chosen:
            return (SpanRecall(opened, model, selection, focus=recall.focus, began=began, progress=progress),
                    Turn(question, selection.chosen_index))
    if opened.archive is None:
        return NoRecall(opened), turn
    return BlockRecall(opened, model, recall.recall_tokens), turn
