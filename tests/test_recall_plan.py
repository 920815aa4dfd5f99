"""One recall plan per document (engine.recall_plan), read by the session, the CLI, the estimate and
the warnings alike; the disk budget's one rule for a snapshot and its archive (engine.disk_budget);
an archive checked per block, so a damaged one is found by the question that reads it."""

import random

import pytest

from engine.cli import recall_line
from engine.documents import Document, Segment
from engine.errors import HalamanError
from engine.estimate import KNOWN_SHAPES, archive_file_bound, snapshot_file_bound
from engine.prefix_store import PrefixStore
from engine.prompt import chat_layout, encode_document
from engine.recall_plan import RecallPlan, RecallSource, plan_recall
from engine.open_document import RecallGap, RecallNotice
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings, RecallSettings
from engine.workspace import RecallOff, recall_off

SMOL = KNOWN_SHAPES["smollm2-135m"]
BOOK_TOKENS = 100_000
GIB = 1024**3


def plan(tokens: int = BOOK_TOKENS, budget: int | None = 2 * GIB, **recall) -> RecallPlan:
    return plan_recall(EngineSettings(recall=RecallSettings(**recall)), SMOL, tokens, disk_budget_bytes=budget)


# ------------------------------------------------------------------------------ each source
def test_a_document_the_cache_keeps_whole_recalls_nothing_whatever_the_settings():
    for recall in ({}, {"recall_tokens": 0}, {"archive": False}, {"selection": "blocks"}):
        whole = plan(tokens=1000, **recall)
        assert whole.source is RecallSource.WHOLE and not whole.recalls and not whole.uses_archive
        assert "whole document" in whole.reason and whole.archive_missing is None


def test_a_book_reads_its_chosen_pages_from_the_archive_or_its_blocks():
    spans = plan()
    assert spans.source is RecallSource.ARCHIVE and spans.by_spans and spans.uses_archive
    assert spans.archive_bytes == archive_file_bound(SMOL, RecallSettings(), 32, BOOK_TOKENS) > 0
    blocks = plan(selection="blocks")
    assert blocks.source is RecallSource.BLOCKS and blocks.uses_archive and not blocks.by_spans
    no_offsets = plan_recall(EngineSettings(), SMOL, BOOK_TOKENS, disk_budget_bytes=2 * GIB, spans=False)
    assert no_offsets.source is RecallSource.BLOCKS and "no spans" in no_offsets.reason
    # Without a prefix store the archive is a session file: no budget applies.
    assert plan(budget=0).source is RecallSource.REREAD and plan(budget=None).source is RecallSource.ARCHIVE


def test_a_book_without_room_for_its_archive_re_reads_or_has_recall_off():
    reread = plan(budget=64 * 1024**2)
    assert reread.source is RecallSource.REREAD and reread.recalls and not reread.uses_archive
    assert "would not fit the prefix-cache disk budget" in reread.archive_missing
    assert "re-reads" in reread.reason
    off = plan(budget=64 * 1024**2, selection="blocks")
    assert off.source is RecallSource.OFF and off.archive_missing == reread.archive_missing
    lost = plan_recall(EngineSettings(), SMOL, BOOK_TOKENS, disk_budget_bytes=2 * GIB, spans=False,
                       archive_missing="its archive cannot be written (disk full)")
    assert lost.source is RecallSource.OFF and "no spans to re-read" in lost.reason


def test_recall_off_in_the_settings_is_off_without_a_warning_about_re_reading():
    # Symptom: with recall_tokens 0 and an archive over the budget, the session warned that recall
    # "re-reads the pages it chooses for each question" while recall was off.
    for settings_off in (plan(recall_tokens=0, budget=64 * 1024**2), plan(archive=False)):
        assert settings_off.source is RecallSource.OFF and settings_off.archive_missing is None
        assert RecallNotice.of(settings_off) is None
        assert recall_line(None, settings_off) == "off" and recall_off(settings_off) is RecallOff.OFF


def test_the_warnings_and_the_answer_lines_follow_the_plan():
    reread = plan(budget=64 * 1024**2)
    assert RecallNotice.of(reread).gap is RecallGap.REREAD
    assert RecallNotice.of(plan(budget=64 * 1024**2, selection="blocks")).gap is RecallGap.OFF
    # Symptom: the CLI said "the cache keeps the whole document" for a question it could not recall for.
    line = recall_line(None, reread)
    assert "whole" not in line and line.startswith("off for this question")
    assert recall_off(reread) is RecallOff.NO_ARCHIVE
    whole = plan(tokens=1000)
    assert recall_line(None, whole) == "off (the cache keeps the whole document: nothing to recall)"
    assert recall_off(whole) is RecallOff.WHOLE and recall_off(plan()) is RecallOff.NOT_CHOSEN


# ------------------------------------------------------------------------------ on the real model
SENTENCES = [
    "The harbour master counted fishing boats returning before the storm reached the bay.",
    "Engineers measured the old bridge and found rusted bolts under the eastern railing.",
    "The orchard behind the school gave baskets of apples to the autumn market.",
    "A survey of the valley listed the birds nesting near the river bank.",
]


def book() -> Document:
    """12 'pages' of prose (~1,100 tokens); the safe's combination on page 9."""
    rng = random.Random(3)
    texts = [" ".join(rng.choice(SENTENCES) for _ in range(5)) for _ in range(12)]
    texts[8] += " Note: the combination of the observatory safe is 48213."
    return Document(title="book", source="", kind="pdf", pages=12,
                    segments=[Segment(text=t, label=f"page {i + 1}", page=i + 1, path=None) for i, t in enumerate(texts)])


def settings(**recall) -> EngineSettings:
    cache = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=64, chunk_tokens=256)
    return EngineSettings(max_new_tokens=8, cache=cache, recall=RecallSettings(**{"recall_tokens": 512, **recall}))


def bounds(smol, settings_: EngineSettings) -> tuple[int, int, int]:
    """(document tokens, snapshot bound, archive bound) of `book()` read with `settings_`."""
    n = len(encode_document(smol.tokenizer, chat_layout(smol.tokenizer), book()).ids)
    policy = settings_.cache
    return n, snapshot_file_bound(smol.profile, policy, n), archive_file_bound(smol.profile, settings_.recall, policy.group_size, n)


def test_the_session_keeps_the_plan_the_estimate_makes_and_the_files_stay_within_its_bounds(smol, tmp_path):
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=512 * 1024**2)
    session = DocumentSession(smol, settings(), store)
    report = session.open(book())
    n, snapshot_bound, archive_bound = bounds(smol, settings())
    assert report.document_tokens == n
    assert session.recall_plan is report.recall_plan
    assert session.recall_plan == plan_recall(settings(), smol.profile, n, disk_budget_bytes=store.disk_budget_bytes)
    assert session.recall_plan.source is RecallSource.ARCHIVE and report.recall_notice is None
    entry = store.entries()[0]
    assert 0 < entry.size_bytes <= snapshot_bound and 0 < entry.archive_bytes <= archive_bound
    assert session.ask("What is the combination of the observatory safe?").recall.spans


def test_recall_off_reads_no_archive_and_warns_of_no_re_reading(smol, tmp_path):
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=64 * 1024)  # no room for any archive
    report = DocumentSession(smol, settings(recall_tokens=0), store).open(book())
    assert report.recall_plan.source is RecallSource.OFF and report.recall_notice is None
    assert not any("re-read" in warning for warning in report.warnings), report.warnings
    assert all(entry.archive_bytes == 0 for entry in store.entries())


def test_an_archive_that_fits_alone_but_not_beside_its_snapshot_is_never_written(smol, tmp_path):
    # Two rules used to disagree here: the session wrote the archive (it fits the budget alone) and
    # the store then refused it (it does not fit beside the snapshot), after the whole read.
    _, snapshot_bound, archive_bound = bounds(smol, settings())
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=archive_bound + snapshot_bound // 2)
    report = DocumentSession(smol, settings(), store).open(book())
    assert report.recall_plan.source is RecallSource.REREAD
    assert "would not fit" in report.recall_notice.why and not any("not kept" in w for w in report.warnings)
    assert store.entries()[0].archive_bytes == 0
    # Room for both bounds: the plan writes the archive and the store keeps it.
    roomy = PrefixStore(tmp_path / "q", disk_budget_bytes=archive_bound + snapshot_bound)
    kept = DocumentSession(smol, settings(), roomy).open(book())
    assert kept.recall_plan.source is RecallSource.ARCHIVE and roomy.entries()[0].archive_bytes > 0


def test_a_damaged_archive_block_fails_its_question_and_the_next_one_re_reads(smol, tmp_path):
    store = PrefixStore(tmp_path / "p", disk_budget_bytes=512 * 1024**2)
    DocumentSession(smol, settings(), store).open(book())
    key = store.entries()[0].key
    path, _ = store.archive(key)
    data = bytearray(path.read_bytes())
    from engine.kvcache.archive import Archive

    archive = Archive.open(path)
    offset, _, _ = archive._places["layer0.k.codes"]  # block 0 of layer 0 holds the chat template every question reads
    archive.close()
    data[offset + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    session = DocumentSession(smol, settings(), store)
    assert session.open(book()).recall_plan.source is RecallSource.ARCHIVE  # opening does not read the blocks
    with pytest.raises(HalamanError, match="archive is damaged"):
        session.ask("What is the combination of the observatory safe?")
    assert session.recall_plan.source is RecallSource.REREAD and store.archive(key) is None
    assert session.ask("What is the combination of the observatory safe?").recall.spans


def test_the_window_s_estimate_promises_an_archive_only_where_the_plan_writes_one():
    from app.memory_panel import document_estimate

    def text(**changes):
        return document_estimate(EngineSettings().replace(**changes), SMOL, BOOK_TOKENS, None)

    assert "archive on disk:" in text()
    small = text(prefix_cache_disk_bytes=64 * 1024**2)
    assert "archive on disk:" not in small and "questions re-read their pages" in small
    off = text(recall=RecallSettings(recall_tokens=0))
    assert "archive" not in off and "re-read" not in off
