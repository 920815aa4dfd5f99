"""One open document's state in one handle (`engine.open_document.OpenDocument`), without a model:
what `close` releases, the whole read's progress and end, the draft index, the sources."""

from types import SimpleNamespace

import pytest
import torch

from engine.documents import Document, Segment
from engine.open_document import OpenDocument, PendingRead
from engine.prompt import PrefixEncoding
from engine.settings import CachePolicy


class Held:
    """Something the handle must release: counts its close / abort calls."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    abort = close


def handle(**fields) -> OpenDocument:
    document = Document(title="t", source="", kind="pdf", pages=2,
                        segments=[Segment(text="first page", label="page 1", page=1, path=None),
                                  Segment(text="second page", label="page 2", page=2, path=None)])
    # 10 prefix tokens: 2 of template, the text's 6 (page 1 from token 2, page 2 from token 5), 2 of template
    encoding = PrefixEncoding(ids=list(range(100, 110)), segment_starts=[2, 5], token_chars=[], head_tokens=2, text_tokens=6)
    report = SimpleNamespace(document_tokens=10, recall_plan="plan")
    return OpenDocument(document, encoding, "key", snapshot=SimpleNamespace(seen_tokens=10), report=report, **fields)


def test_close_releases_what_it_holds(tmp_path):
    own = tmp_path / "session-archive.safetensors"
    own.write_bytes(b"x")
    archive, spans, writer = Held(), Held(), Held()
    read = PendingRead(list(range(10)), CachePolicy(), "key", None, "label", writer=writer)
    opened = handle(archive=archive, spans=spans, own_archive=own, pending_read=read)
    opened.close()
    assert (archive.closed, spans.closed, writer.closed) == (1, 1, 1) and not own.exists()
    assert opened.archive is None and opened.spans is None and not opened.unread
    opened.close()  # twice: nothing is released again
    assert (archive.closed, spans.closed, writer.closed) == (1, 1, 1)


def test_a_read_in_progress_then_finished():
    read = PendingRead(list(range(10)), CachePolicy(), "key", None, "label")
    opened = handle(pending_read=read)
    assert opened.unread and opened.unread_progress() == (0, 10)
    read.cache = SimpleNamespace(seen_tokens=4)
    assert opened.unread_progress() == (4, 10)
    read.cache.seen_tokens, read.archive, read.own_archive = 10, Held(), None
    assert opened.read_finished() is read
    assert not opened.unread and opened.snapshot is read.cache and opened.archive is read.archive
    assert opened.unread_progress() == (10, 10)
    restarted = read.restarted()
    assert restarted.cache is None and restarted.ids == read.ids and restarted.key == read.key


def test_the_draft_index_is_built_once_and_reset_per_answer():
    opened = handle()
    lookup = opened.prompt_lookup([101, 102])
    assert lookup.propose(2) == [103, 104]
    assert opened.prompt_lookup([7]) is lookup and lookup.context == [7]


def test_sources_count_only_the_text_by_page():
    opened = handle()
    mass = torch.zeros(10)
    mass[0] = mass[9] = 50.0  # template tokens: nobody's page
    mass[3], mass[6] = 1.0, 3.0
    sources, passages = opened.sources(mass)
    assert [(s.label, s.page) for s in sources] == [("page 2", 2), ("page 1", 1)]
    assert [s.share for s in sources] == pytest.approx([0.75, 0.25])
    assert passages == []  # no character offsets in this encoding
    assert opened.sources(torch.zeros(10)) == ([], [])


def test_span_labels():
    opened = handle()
    assert opened.span_label(SimpleNamespace(segment=1, char_start=0, char_end=len("second page"))) == "page 2"
    assert opened.span_label(SimpleNamespace(segment=0, char_start=0, char_end=5)) == "page 1 (characters 0–5)"
