"""Index first: a document opened with `read_now=False` is answered from its spans, re-read from their
token ids, before (and while) it is read whole; the whole read can pause between chunks and go on.

The reference for the answers is the path that already existed: a document read whole whose archive
does not fit the disk re-reads its spans the same way, and span recall in focus hides everything
the snapshot holds, so an unread document must give the same tokens."""

import threading

import pytest
import torch

from engine.errors import Cancelled
from engine.prefix_store import PrefixStore
from engine.progress import Phase
from engine.session import DocumentSession
from test_span_recall import COMBINATION, NEEDLE_PAGE, QUESTION, book, settings


@pytest.fixture
def store(tmp_path):
    return PrefixStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2)


def test_an_unread_document_is_answered_from_its_index_as_a_read_one_without_archive(smol, store, tmp_path):
    session = DocumentSession(smol, settings(), store)
    prefills = []
    report = session.open(book(), read_now=False, progress=lambda p: prefills.append(p) if p.phase is Phase.PREFILL else None)
    assert report.unread and session.unread and not prefills and report.prefill_seconds == 0
    assert session.unread_progress() == (0, report.document_tokens)
    assert store.entries() == [], "nothing is saved before the read"
    answer = session.ask(QUESTION)
    assert COMBINATION in answer.text and answer.recall.reread and answer.recall.spans == (f"page {NEEDLE_PAGE}",)
    assert answer.sources[0].page == NEEDLE_PAGE and not answer.prefix_hit

    # The same document read whole, its archive over the disk budget: spans are re-read the same way.
    full = DocumentSession(smol, settings(), PrefixStore(tmp_path / "probe", disk_budget_bytes=512 * 1024**2))
    full.open(book())
    entry = full.store.entries()[0]
    small = DocumentSession(smol, settings(), PrefixStore(tmp_path / "small", disk_budget_bytes=entry.size_bytes + entry.archive_bytes // 2))
    assert not small.open(book()).unread and small.opened.archive is None
    reference = small.ask(QUESTION)
    assert reference.recall.reread and reference.token_ids == answer.token_ids


def test_a_paused_read_goes_on_from_its_chunk_and_then_questions_recall_from_the_archive(smol, store):
    session = DocumentSession(smol, settings(), store)
    n = session.open(book(), read_now=False).document_tokens
    pause, seen = threading.Event(), []

    def progress(p):
        seen.append(p.done)
        if len(seen) == 2:
            pause.set()

    assert session.read(progress=progress, pause=pause) is False
    done, total = session.unread_progress()
    assert done == 2 * settings().cache.chunk_tokens and total == n and session.unread
    between = session.ask(QUESTION)  # a question while the read is paused re-reads its spans
    assert between.recall.reread and COMBINATION in between.text
    pause.clear()
    assert session.read(progress=lambda p: seen.append(p.done)) is True
    assert seen[2] > done and seen[-1] == n, "the read went on from the chunk it stopped at"
    assert not session.unread and not session.report.unread and session.report.prefill_seconds > 0
    after = session.ask(QUESTION)
    assert not after.recall.reread and after.recall.bytes_read > 0 and COMBINATION in after.text

    # What the paused read saved is what a read in one go saves: a reopen hits the same key.
    again = DocumentSession(smol, settings(), store)
    report = again.open(book())
    assert report.prefix_hit and again.prefix_key == session.prefix_key and again.opened.archive is not None
    straight = DocumentSession(smol, settings(), None)
    straight.open(book())
    for kept, reference in zip(again.opened.snapshot.layers, straight.opened.snapshot.layers, strict=True):
        assert torch.equal(kept.index, reference.index)


def test_a_cancelled_read_keeps_the_document_answerable_and_goes_on_from_its_checkpoint(smol, store):
    """Cancelled inside its second chunk, the read keeps the first in a checkpoint (tests/test_resume_read.py)."""
    session = DocumentSession(smol, settings(), store)
    session.open(book(), read_now=False)
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        session.read(progress=lambda p: cancel.set(), cancel=cancel)
    assert session.unread and session.unread_progress()[0] == settings().cache.chunk_tokens
    assert [entry.n_tokens for entry in store.entries()] == [settings().cache.chunk_tokens], "only the checkpoint"
    assert COMBINATION in session.ask(QUESTION).text
    assert session.read() is True and [entry.key for entry in store.entries()] == [session.prefix_key]


def test_a_document_the_cache_keeps_whole_is_read_at_once(smol, store):
    whole = settings().replace(cache=settings().cache.replace(budget_tokens=4096, window_tokens=512, residual_tokens=64))
    session = DocumentSession(smol, whole, store)
    report = session.open(book(), read_now=False)
    assert not report.unread and not session.unread and report.prefill_seconds > 0
    assert session.read() is True


def test_cancel_stops_a_question_while_it_re_reads_its_spans(smol, store):
    """The trial: Esc during an answer over an unread book left "Cancelling…" for 80 s, the re-read
    of the chosen pages before the first word not watching the cancel. Cancelled during that re-read,
    the question stops between its chunks: the spans are not read, nothing is answered."""
    session = DocumentSession(smol, settings(), store)
    session.open(book(), read_now=False)
    cancel = threading.Event()
    passes = []
    forward = smol.decoder.forward

    def counting(*args, **kwargs):  # cancel once the re-read's first chunk went through
        passes.append(1)
        cancel.set()
        return forward(*args, **kwargs)

    smol.decoder.forward = counting
    try:
        answer = session.ask(QUESTION, cancel=cancel)
    finally:
        smol.decoder.forward = forward
    assert answer.stop_reason == "cancelled" and answer.token_ids == [] and answer.recall is None
    assert len(passes) == 1, "one chunk of the re-read, then nothing"
    session.close()
