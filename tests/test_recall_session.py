"""Recall end to end on the real embedded model: a needle the snapshot evicted is answered only with
recall; damaged archives; memory; attention-grounded sources; compact positions; follow-ups."""

import random
import threading

import pytest

from engine.documents import Document, Segment
from engine.errors import Cancelled
from engine.kvcache.archive import Archive
from engine.prefix_store import PrefixStore
from engine.progress import Phase
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings, RecallSettings

QUESTION = "What is the access code for the archive room?"
SENTENCES = [
    "The committee met on Tuesday to review the quarterly budget and discussed several minor items.",
    "Rain fell steadily over the valley while the farmers repaired fences along the northern fields.",
    "The library extended its opening hours during the examination period for the students.",
    "A new bus route connects the harbour with the railway station every twenty minutes.",
    "The bakery on the corner sells fresh bread each morning before seven o'clock.",
    "Engineers inspected the old bridge and recommended painting the railings next spring.",
    "The museum added a small exhibition about local pottery from the last century.",
    "Volunteers planted trees along the river bank to prevent erosion after the floods.",
    "The choir rehearsed twice a week in the hall behind the town church.",
    "Several shops on the main street closed early because of the festival parade.",
    "The school garden produced more tomatoes this year than ever before.",
    "Fishermen returned to the harbour at dusk with a modest catch of mackerel.",
]
# Seed 2 of bench/recall_needle.py's CI probe: ~1,550 tokens, the code at 70 % depth; with budget 256
# (84 % dropped) the snapshot answers "123456" and recall the stated code.
CODE = "17412"


def prose(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(SENTENCES) for _ in range(count)]


def haystack() -> Document:
    body = prose(83, 2)
    body.insert(int(0.7 * 83), f"Note: the access code for the archive room is {CODE}.")
    return Document(title="haystack", source="", kind="text",
                    segments=[Segment(text=" ".join(body), label="haystack.txt", page=None, path="haystack.txt")])


def pages() -> Document:
    """Three 'pages' of the same prose; the fact on page 2."""
    texts = [" ".join(prose(28, 10 + i)) for i in range(3)]
    middle = texts[1].split(". ")
    middle.insert(len(middle) // 2, f"Note: the access code for the archive room is {CODE}")
    texts[1] = ". ".join(middle)
    return Document(title="pages", source="", kind="pdf", pages=3,
                    segments=[Segment(text=t, label=f"page {i + 1}", page=i + 1, path=None) for i, t in enumerate(texts)])


def settings(recall_tokens: int = 512, selection: str = "blocks", **policy) -> EngineSettings:
    """Block recall unless `selection` says otherwise: most tests here are about the archive and the
    per-layer selection, which span recall falls back to (tests/test_span_recall.py has the rest)."""
    cache = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=64, chunk_tokens=256, **policy)
    return EngineSettings(max_new_tokens=16, cache=cache,
                          recall=RecallSettings(recall_tokens=recall_tokens, selection=selection))


@pytest.fixture
def store(tmp_path):
    return PrefixStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2)


def test_a_needle_the_snapshot_evicted_is_answered_with_recall_only(smol, store):
    session = DocumentSession(smol, settings(), store)
    report = session.open(haystack())
    assert report.document_tokens > 1200 and not report.warnings
    with_recall = session.ask(QUESTION)
    assert CODE in with_recall.text
    stats = with_recall.recall
    blocks = -(-report.document_tokens // 32)
    assert stats.tokens_recalled > 0 and stats.bytes_read > 0 and stats.refreshes == min(16, len(with_recall.token_ids))
    assert stats.blocks_scored == (1 + stats.refreshes) * 30 * 3 * blocks  # every layer and KV head, each selection
    assert stats.tokens_recalled <= 30 * 3 * 512 and 0 < stats.question_s <= stats.seconds
    assert with_recall.sources and with_recall.sources[0].label == "haystack.txt"
    # Memory: held + recalled stay under the mark the gauge shows, and the recalled part is reported.
    memory = session.memory()
    assert with_recall.kv.recalled_bytes > 0 and memory.kv.recalled_bytes == with_recall.kv.recalled_bytes
    assert memory.kv.total_bytes <= memory.budget_bytes
    # The snapshot is never modified: the same session without recall misses the needle.
    session.settings = session.settings.replace(recall=RecallSettings(recall_tokens=0))
    without = session.ask(QUESTION)
    assert CODE not in without.text and without.recall is None and without.kv.recalled_bytes == 0
    # A follow-up recalls again, with its own queries.
    session.settings = session.settings.replace(recall=RecallSettings(recall_tokens=512, selection="blocks"))
    session.ask(QUESTION)
    follow = session.ask("Repeat the code.", follow_up=True)
    assert follow.recall is not None and follow.recall.tokens_recalled > 0


def test_the_archive_is_reused_on_a_prefix_hit_and_a_damaged_one_is_dropped_with_a_warning(smol, store):
    first = DocumentSession(smol, settings(), store)
    first.open(haystack())
    entry = store.entries()[0]
    assert entry.archive_bytes > 0
    expected = first.ask(QUESTION).text

    again = DocumentSession(smol, settings(), store)
    assert again.open(haystack()).prefix_hit
    assert again.ask(QUESTION).text == expected

    # Opening checks the archive's digest tables (a damaged block is found when a question reads it:
    # tests/test_recall_plan.py).
    path, _ = store.archive(entry.key)
    data = bytearray(path.read_bytes())
    data[Archive.open(path)._places["digests.blocks"][0] + 7] ^= 0x55
    path.write_bytes(bytes(data))
    damaged = DocumentSession(smol, settings(), store)
    report = damaged.open(haystack())
    assert report.prefix_hit, "the snapshot is intact and still used"
    assert any("recall is off" in w and "digest" in w for w in report.warnings)
    answer = damaged.ask(QUESTION)
    assert answer.recall is None and CODE not in answer.text
    assert store.archive(entry.key) is None and not path.exists()


class DamagingStore(PrefixStore):
    """A real store on a disk that damages each archive right after it is moved into place (a bad
    sector, another program writing there): it is stored and indexed, but cannot be opened."""

    def put_archive(self, key, temp, *, sha256, size_bytes):
        path = super().put_archive(key, temp, sha256=sha256, size_bytes=size_bytes)
        path.write_bytes(path.read_bytes()[:64])
        return path


def test_an_archive_that_cannot_be_opened_after_it_was_stored_is_dropped_from_the_store(smol, tmp_path):
    store = DamagingStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2)
    report = DocumentSession(smol, settings(), store).open(haystack())
    assert any("its archive was not kept" in w for w in report.warnings)
    [entry] = store.entries()
    assert entry.archive_bytes == 0 and store.archive(entry.key) is None, "the warning says it was not kept"
    assert not list(store.root.glob("*.archive.safetensors"))
    again = DocumentSession(smol, settings(), store).open(haystack())
    assert again.prefix_hit and any("it has no archive" in w for w in again.warnings)


@pytest.mark.parametrize("selection", ["blocks", "spans"])
def test_sources_name_the_page_whose_recalled_tokens_were_attended(smol, selection):
    session = DocumentSession(smol, settings(selection=selection), None)
    session.open(pages())
    answer = session.ask(QUESTION)
    assert CODE in answer.text
    assert answer.sources[0].label == "page 2" and answer.sources[0].page == 2
    assert 0 < answer.sources[0].share <= 1 and sum(s.share for s in answer.sources) <= 1 + 1e-6
    session.close()


@pytest.mark.parametrize("selection", ["blocks", "spans"])
def test_compact_positions_with_recall_answer_the_needle(smol, selection):
    session = DocumentSession(smol, settings(selection=selection, position_mode="compact"), None)
    assert session.open(haystack()).position_mode == "compact"
    assert CODE in session.ask(QUESTION).text


def test_archive_off_means_no_archive_file_and_answers_as_before(smol, store):
    off = EngineSettings(max_new_tokens=16, cache=settings().cache, recall=RecallSettings(archive=False))
    session = DocumentSession(smol, off, store)
    session.open(haystack())
    assert store.entries()[0].archive_bytes == 0 and store.archive(store.entries()[0].key) is None
    answer = session.ask(QUESTION)
    assert answer.recall is None and answer.sources == []


def test_a_cancelled_read_leaves_no_archive_behind_but_its_checkpoints(smol, store):
    """What a cancelled read wrote is either its checkpoint's, indexed and counted in the disk
    budget (`engine.read_checkpoint`), or gone."""
    cancel = threading.Event()
    session = DocumentSession(smol, settings(), store)

    def stop(progress):
        if progress.phase is Phase.PREFILL and progress.done > 0:
            cancel.set()

    with pytest.raises(Cancelled):
        session.open(haystack(), progress=stop, cancel=cancel)
    [checkpoint] = store.entries()
    kept = [p for p in store.root.iterdir() if p.name.endswith((".tmp", ".archive.safetensors"))]
    assert [p.name for p in kept] == [f"{checkpoint.key}.archive.safetensors"]
    assert checkpoint.archive_bytes == kept[0].stat().st_size
