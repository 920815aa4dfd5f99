"""Where a document's questions get their recalled tokens, decided once when the document opens.

The compressed cache keeps a few thousand of a document's tokens; a question brings back the ones
it needs (recall). `plan_recall` decides, from the settings, the model's shape, the document's
length and what became of its archive, where they come from:

    whole     the cache keeps the whole document (with room for a question): nothing to recall
    archive   the spans a question chooses (`engine.evidence.select`) are read from the archive
    re-read   there is no archive: the chosen spans are prefilled again from their token ids
              (`engine.kvcache.span_recall`), slower answers
    blocks    each layer's attention picks archive blocks (`engine.kvcache.recall`): the selection
              "blocks", or a tokenizer without character offsets (no spans to choose)
    off       recall is off in the settings, or the document has no archive and cannot re-read

The session keeps the plan of the open document (`DocumentSession.recall_plan`, also in its
`OpenReport`) and recalls by it; the CLI's report, the answer's library record and the warnings
read it; `halaman estimate` calls the same function before any model is loaded. Torch-free.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.disk_budget import parts_fit
from engine.estimate import QUESTION_RESERVE_TOKENS, archive_file_bound, kept_whole, snapshot_file_bound
from engine.models.profile import ModelProfile
from engine.settings import EngineSettings
from engine.units import format_bytes


# Spans re-read from their token ids (no archive: the document is not read yet, or its archive does
# not fit the disk) are prefilled before the first answer token, so they are held to fewer tokens
# than an archive recall reads: the selection puts the best spans first, and a page with
# distractors around it is answered worse than the page alone (engine.kvcache.span_recall).
REREAD_RECALL_TOKENS = 2048


def recall_budget(settings, max_positions: int, *, reread: bool) -> int:
    """Recalled tokens one question may read: the settings' `recall.recall_tokens`, within the
    model's `max_positions` less the question's reserve and the answer's length, and at most
    `REREAD_RECALL_TOKENS` when the tokens are re-read (prefilled before the first answer token).
    `settings`: `engine.settings.EngineSettings`. Returns tokens, 0 or more."""
    room = max_positions - QUESTION_RESERVE_TOKENS - settings.max_new_tokens
    if reread:
        room = min(room, REREAD_RECALL_TOKENS)
    return max(0, min(settings.recall.recall_tokens, room))


class RecallSource(enum.StrEnum):
    """Where a question's recalled tokens come from (see the module docstring)."""

    WHOLE = "whole"
    ARCHIVE = "archive"
    REREAD = "re-read"
    BLOCKS = "blocks"
    OFF = "off"


@dataclass(frozen=True)
class RecallPlan:
    """How one document recalls. source: `RecallSource`; reason: why, in plain words (one clause
    for people); archive_missing: why the document has no archive although it needs one (the open
    report's warning), None otherwise; archive_bytes: the archive file's size bound in bytes, when
    the plan writes or reads one (0 otherwise)."""

    source: RecallSource
    reason: str
    archive_missing: str | None = None
    archive_bytes: int = 0

    @property
    def uses_archive(self) -> bool:
        """Questions read the archive: one is written when the document is read, opened on a hit."""
        return self.source in (RecallSource.ARCHIVE, RecallSource.BLOCKS)

    @property
    def recalls(self) -> bool:
        """Questions recall at all (from the archive, or by re-reading spans)."""
        return self.uses_archive or self.source is RecallSource.REREAD

    @property
    def by_spans(self) -> bool:
        """Questions recall the spans selection chooses (from the archive or re-read)."""
        return self.source in (RecallSource.ARCHIVE, RecallSource.REREAD)


def plan_recall(settings: EngineSettings, profile: ModelProfile, n_tokens: int, *, disk_budget_bytes: int | None,
                spans: bool = True, archive_missing: str | None = None) -> RecallPlan:
    """The recall plan of a document of `n_tokens` prefix tokens read with `settings` by a model of
    `profile`'s shape.

    disk_budget_bytes: the prefix store's budget, which the snapshot and the archive must fit
    together (`engine.disk_budget.parts_fit`); None without a store (the archive is then a session
    file that no budget limits). spans: the document has spans and a full-text index to select from
    (False: the tokenizer gives no character offsets, or the index could not be built).
    archive_missing: why the archive the plan would use is not there (it could not be written,
    kept or opened), None when it is there or still to be written. Raises nothing.
    """
    recall, policy = settings.recall, settings.cache
    if kept_whole(n_tokens, policy):
        return RecallPlan(RecallSource.WHOLE, f"the cache keeps the whole document ({n_tokens:,} tokens within its "
                                              f"budget of {policy.budget_tokens:,}): nothing to recall")
    if recall.recall_tokens < 1:
        return RecallPlan(RecallSource.OFF, "recall is off in the settings (recall_tokens is 0)")
    if not recall.archive:
        return RecallPlan(RecallSource.OFF, "the archive is off in the settings: answers use the snapshot only")
    archive_bytes = archive_file_bound(profile, recall, policy.group_size, n_tokens)
    if archive_missing is None and disk_budget_bytes is not None:
        snapshot_bytes = snapshot_file_bound(profile, policy, n_tokens)
        if not parts_fit(snapshot_bytes, archive_bytes, disk_budget_bytes):
            archive_missing = (f"its archive ({format_bytes(archive_bytes)}) and snapshot ({format_bytes(snapshot_bytes)}) "
                               f"would not fit the prefix-cache disk budget ({format_bytes(disk_budget_bytes)}) "
                               "and the archive is not written")
    if archive_missing is not None:
        if recall.selection == "spans" and spans:
            return RecallPlan(RecallSource.REREAD, f"{archive_missing}: each question re-reads the parts it chooses "
                                                   "from their token ids (slower answers)", archive_missing)
        without = "selection by blocks needs it" if recall.selection == "blocks" else "the document has no spans to re-read"
        return RecallPlan(RecallSource.OFF, f"{archive_missing}, and {without}: recall is off for this document",
                          archive_missing)
    if recall.selection == "spans" and spans:
        return RecallPlan(RecallSource.ARCHIVE, "questions read the pages they choose from the archive",
                          archive_bytes=archive_bytes)
    why = "the selection is by blocks" if recall.selection == "blocks" else "the document has no spans to choose from"
    return RecallPlan(RecallSource.BLOCKS, f"{why}: each layer's attention picks archive blocks",
                      archive_bytes=archive_bytes)
