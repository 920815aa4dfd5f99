"""Span recall: the full-text index proposes whole spans, recalled in every layer from the archive.

A needle on page k of a many-page document is answered with span recall and not without; the
sources name page k first; the index ranks as a brute-force BM25 does; the recalled keys and values
are exactly the archive's; a damaged or missing index is rebuilt."""

import dataclasses
import math
import random
from collections import Counter

import pytest
import torch

from engine.documents import Document, Segment
from engine.evidence.code_units import code_spans, indexed_names, segment_spans
from engine.evidence import reading_budget
from engine.evidence.reading_budget import ReadingBudget
from engine.evidence.select import select
from engine.kvcache.archive import Archive
from engine.kvcache.span_recall import SpanCapture, SpanRecaller
from engine.prefix_store import PrefixStore
from engine.prompt import chat_layout, encode_document
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings, RecallSettings
from engine.evidence.spans import DocumentSpans
from engine.evidence.text_index import (
    IndexDamaged,
    TextIndex,
    load_or_build,
    rank,
    spans_digest,
    split_spans,
    terms,
)

TOPICS = [
    "The harbour master counted {n} fishing boats returning before the storm reached the bay.",
    "Engineers measured the old bridge and found {n} rusted bolts under the eastern railing.",
    "The orchard behind the school gave {n} baskets of apples to the autumn market.",
    "A survey of the valley listed {n} species of birds nesting near the river bank.",
    "The printing office delivered {n} crates of pamphlets to the town hall on Friday.",
    "Volunteers repaired {n} benches in the park after the spring festival ended.",
]
PAGES, NEEDLE_PAGE = 24, 17
QUESTION = "What is the combination of the observatory safe?"
COMBINATION = "48213"


def book() -> Document:
    """24 'pages' of varied prose (~90 tokens each); the observatory safe's combination on page 17."""
    rng = random.Random(7)
    texts = []
    for page in range(1, PAGES + 1):
        lines = [rng.choice(TOPICS).format(n=rng.randint(2, 90)) for _ in range(5)]
        if page == NEEDLE_PAGE:
            lines.insert(2, f"Note: the combination of the observatory safe is {COMBINATION}.")
        texts.append(" ".join(lines))
    return Document(title="book", source="", kind="pdf", pages=PAGES,
                    segments=[Segment(text=t, label=f"page {i + 1}", page=i + 1, path=None) for i, t in enumerate(texts)])


def settings(**recall) -> EngineSettings:
    cache = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=64, chunk_tokens=256)
    return EngineSettings(max_new_tokens=16, cache=cache, recall=RecallSettings(recall_tokens=512, **recall))


@pytest.fixture
def store(tmp_path):
    return PrefixStore(tmp_path / "prefix", disk_budget_bytes=512 * 1024**2)


def test_a_needle_on_page_k_is_answered_with_span_recall_and_not_without(smol, store):
    session = DocumentSession(smol, settings(), store)
    report = session.open(book())
    assert report.document_tokens > 4 * 256, "most of the book is evicted from the snapshot"
    answer = session.ask(QUESTION)
    assert COMBINATION in answer.text
    assert answer.recall.spans == (f"page {NEEDLE_PAGE}",)
    assert answer.sources[0].label == f"page {NEEDLE_PAGE}" and answer.sources[0].page == NEEDLE_PAGE
    assert answer.recall.refreshes == 0, "spans are chosen once per question"
    session.settings = session.settings.replace(recall=session.settings.recall.replace(recall_tokens=0))
    without = session.ask(QUESTION)
    assert COMBINATION not in without.text and without.recall is None


def test_without_focus_the_snapshot_stays_visible_beside_the_recalled_page(smol):
    # The embedded model then answers this question from the snapshot's distractors instead (focus
    # is the default for that reason); what must hold is that the page is recalled and attended.
    session = DocumentSession(smol, settings(focus=False), None)
    session.open(book())
    answer = session.ask(QUESTION)
    assert answer.recall.spans == (f"page {NEEDLE_PAGE}",) and answer.sources[0].page == NEEDLE_PAGE
    held = session.opened.snapshot.layers[0].index  # what the layer held when the question recalled
    recalled = session.conversation.layers[0].recalled
    assert recalled.focus_from is None
    for head in range(held.shape[0]):  # held tokens are not attended twice
        assert torch.equal(recalled.valid[head], ~torch.isin(recalled.index[head], held[head]))


def test_a_question_sharing_no_word_with_the_document_reads_its_opening_not_block_recall(smol):
    # Block recall scored every archive block per layer and decoded at 1-3 tokens/s; a question whose
    # words point nowhere now reads the document's opening pages (the "map" signal) as spans.
    session = DocumentSession(smol, settings(), None)
    session.open(book())
    answer = session.ask("Qzxv wkpt?")
    assert answer.recall is not None and answer.recall.blocks_scored == 0
    assert answer.recall.spans[0] == "page 1" and set(answer.recall.signals) == {"map"}


def test_a_span_cut_to_the_recall_budget_ends_where_its_tokens_end_and_none_is_chosen_without_room(smol):
    """The best span is bigger than the budget leaves: it is read cut, its character end moved with
    its token end (it used to keep the whole page's and be labelled as all of it); with no room for
    one token of its text, nothing is chosen (it used to be an empty span)."""
    document = book()
    encoding = encode_document(smol.tokenizer, chat_layout(smol.tokenizer), document)
    spans = DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                                len(encoding.ids), None)
    around = spans.head_tokens + spans.n_tokens - spans.text_end  # the template's head and tail, recalled too
    whole = select(spans, QUESTION, budget_tokens=10_000, max_spans=1)
    [best] = whole.chosen
    page = document.segments[best.segment].text
    assert page[best.char_start:best.char_end].strip() == page.strip(), "the needle's page, whole"

    [cut] = select(spans, QUESTION, budget_tokens=around + best.tokens - 20, max_spans=1).chosen
    assert cut.token_end == best.token_end - 20 and cut.tokens == best.tokens - 20
    assert best.char_start < cut.char_end < best.char_end
    assert page[cut.char_start:cut.char_end] == page[best.char_start:spans.char_at(best, cut.token_end)]
    assert select(spans, QUESTION, budget_tokens=around + best.marker_tokens, max_spans=1).chosen == []


def test_span_recall_reads_exactly_the_archived_tokens_in_every_layer(smol, store):
    session = DocumentSession(smol, settings(), store)
    session.open(book())
    archive: Archive = session.opened.archive
    lay = archive.layout
    tokens = torch.tensor([3, 4, 5, 100, 101, 400])
    hook = SpanRecaller(archive, tokens, focus=True)
    query = torch.zeros(lay.kv_heads * 3, 1, lay.head_dim)
    for layer in range(lay.num_layers):
        recalled = hook.recall(layer, torch.arange(8)[None].expand(lay.kv_heads, -1), query, 0, torch.float32)
        whole = torch.arange(lay.n_tokens).expand(lay.kv_heads, -1)
        keys, values = archive.decode(archive.read(layer, whole), torch.float32)  # the reference: every token
        assert torch.equal(recalled.keys, keys[:, tokens]) and torch.equal(recalled.values, values[:, tokens])
        assert recalled.valid.all() and recalled.focus_from == lay.n_tokens
        assert hook.recall(layer, None, query, 0, torch.float32) is recalled, "read once per question"
    with pytest.raises(ValueError):
        SpanRecaller(archive, torch.tensor([3, 5, 3]), focus=True)
    with pytest.raises(ValueError):  # without focus the recalled tokens keep their document positions
        SpanRecaller(archive, torch.tensor([5, 3]), focus=False)
    permuted = SpanRecaller(archive, torch.tensor([400, 100, 101, 3]), focus=True).recall(0, None, query, 0, torch.float32)
    keys, _ = archive.decode(archive.read(0, torch.arange(lay.n_tokens).expand(lay.kv_heads, -1)), torch.float32)
    assert torch.equal(permuted.keys, keys[:, [400, 100, 101, 3]]), "in focus, slots follow the order given"


def _spans_of(smol, document: Document) -> DocumentSpans:
    encoding = encode_document(smol.tokenizer, chat_layout(smol.tokenizer), document)
    return DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                               len(encoding.ids), None)


# The needle's page ranks first; pages about the park's benches after it.
PARK_QUESTION = "What is the combination of the observatory safe near the park benches?"


def test_best_last_recalls_the_ranked_pages_in_reverse_with_the_best_nearest_the_question(smol):
    spans = _spans_of(smol, book())
    three = ReadingBudget(pages_at_least=3)
    plain = select(spans, PARK_QUESTION, budget_tokens=10_000, max_spans=12, reading=three)
    ordered = select(spans, PARK_QUESTION, budget_tokens=10_000, max_spans=12, reading=dataclasses.replace(three, best_last=True))
    assert ordered.chosen == plain.chosen and len(plain.chosen) == 3, "the same pages either way"
    assert [s.token_start for s in plain.chosen] == sorted(s.token_start for s in plain.chosen)
    assert plain.recalled() == plain.chosen, "document order unless the budget says best last"
    rank = {c.span: k for k, c in enumerate(ordered.ranked)}
    by_rank = sorted(zip(ordered.chosen_index, ordered.chosen), key=lambda pair: rank[pair[0]])
    assert ordered.recalled() == [span for _, span in reversed(by_rank)]
    assert ordered.recalled()[-1].segment == NEEDLE_PAGE - 1, "the needle's page (segment k is page k + 1)"
    # Positions: the template's head, the spans in that order (each under its marker), the tail.
    positions = spans.recall_positions(ordered.recalled(), in_order=True)
    expected = list(range(spans.head_tokens))
    for span in ordered.recalled():
        expected += [*range(span.marker_start, span.marker_end), *range(span.token_start, span.token_end)]
    expected = list(dict.fromkeys(expected))  # a page's marker line lies within its span: listed once
    assert positions == expected + list(range(spans.text_end, spans.n_tokens))
    assert spans.recall_positions(ordered.recalled()) == sorted(positions), "without in_order: ascending"


def test_a_session_with_best_last_reads_the_needle_page_last_and_answers(smol, store, monkeypatch):
    monkeypatch.setattr(reading_budget, "SMALL", ReadingBudget(pages_at_least=3, best_last=True))
    # 24 tokens: on an AMX Xeon the model restates the whole question first ("The combination of the
    # observatory safe near the park benches is 4821"), and 16 tokens cut the last digit off
    session = DocumentSession(smol, settings().replace(max_new_tokens=24), store)
    session.open(book())
    answer = session.ask(PARK_QUESTION)
    assert len(answer.recall.spans) == 3 and f"page {NEEDLE_PAGE}" in answer.recall.spans
    index = session.conversation.layers[0].recalled.index[0].tolist()
    spans = session.opened.spans
    [needle] = [s for s in spans.spans if s.segment == NEEDLE_PAGE - 1]
    tail = list(range(spans.text_end, spans.n_tokens))
    assert index[-len(tail) - needle.tokens:] == [*range(needle.token_start, needle.token_end), *tail]
    assert index != sorted(index), "the pages are not in document order"
    assert COMBINATION in answer.text


def brute_force_bm25(texts: list[str], query: str, k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 as FTS5 defines it (idf = ln((N − n + 0.5) / (n + 0.5)), floored at 1e-6)."""
    docs = [Counter(terms(t)) for t in texts]
    lengths = [sum(d.values()) for d in docs]
    average = sum(lengths) / len(docs)
    scores = [0.0] * len(docs)
    for word in set(terms(query)):
        n = sum(1 for d in docs if word in d)
        if not n:
            continue
        idf = max(math.log((len(docs) - n + 0.5) / (n + 0.5)), 1e-6)
        for i, d in enumerate(docs):
            if d[word]:
                scores[i] += idf * d[word] * (k1 + 1) / (d[word] + k1 * (1 - b + b * lengths[i] / average))
    return scores


def test_the_index_ranks_as_brute_force_bm25_does():
    texts = [" ".join(book().segments[i].text for i in range(j, j + 2)) for j in range(0, PAGES, 2)]
    for query in ("observatory safe combination", "rusted bolts bridge", "apples market orchard baskets"):
        ours, reference = rank(texts, query), brute_force_bm25(texts, query)
        assert [round(x, 6) for x in ours] == pytest.approx([round(x, 6) for x in reference], rel=1e-6)
        assert max(range(len(texts)), key=ours.__getitem__) == max(range(len(texts)), key=reference.__getitem__)


def test_terms_split_identifiers_and_scripts_without_spaces():
    assert {"parse", "header", "links", "parse_header_links"} <= set(terms("def parse_header_links(value):"))
    assert {"http", "digest", "auth"} <= set(terms("class HTTPDigestAuth"))
    assert "备份" in terms("数据库备份每天凌晨运行") and "the" not in terms("the answer")
    chinese = ["第一节 介绍 本系统用于管理文件", "第二节 数据库备份每天凌晨两点运行", "第三节 联系方式"]
    assert max(range(3), key=rank(chinese, "数据库什么时候备份？").__getitem__) == 1


def test_tree_sitter_names_the_definitions_of_the_common_languages_and_none_in_prose():
    files = {
        "a.py": ("import os\nDEFAULT_REDIRECT_LIMIT: int = 30\nos.environ['X'] = '1'\n"
                 "class TooManyRedirects(RequestException):\n    retries = 3\n    async def fetch(self):\n"
                 "        total = 0\n\n@cache\ndef parse_args():\n    pass\n"),
        "b.go": "package main\n\ntype Reader struct { n int }\n\nconst Limit = 3\n\nfunc (r *Reader) Read(p []byte) int { return 0 }\n",
        "c.rs": "pub(crate) fn parse_args() {}\nstruct Page { n: u32 }\nimpl Page { fn new() -> Self { Page { n: 0 } } }\n",
        "d.js": "export default class Viewer { render() {} }\nconst limit = 3;\nfunction open(path) { return path }\n",
        "e.c": "#define MAX_PAGES 288\nstruct Page { int n; };\nint main(int argc, char **argv) { return 0; }\n",
    }
    names = {name: [n for span in code_spans(name, text) for n in span.names] for name, text in files.items()}
    assert names == {
        "a.py": ["DEFAULT_REDIRECT_LIMIT", "TooManyRedirects", "TooManyRedirects.retries", "TooManyRedirects.fetch",
                 "parse_args"],  # `total` is local to fetch; os.environ[...] names nothing of its own
        "b.go": ["Reader", "Limit", "Read"],
        "c.rs": ["parse_args", "Page", "Page.n", "Page.new"],
        "d.js": ["Viewer", "Viewer.render", "limit", "open"],
        "e.c": ["MAX_PAGES", "Page", "Page.n", "main"],
    }
    prose = "The answer = 42, said the class teacher.\nLet it be.\nx == y"
    assert code_spans("notes.txt", prose) is None and [s.names for s in segment_spans("notes.txt", prose)] == [()]


def test_a_big_class_is_cut_at_its_methods_and_every_span_starts_a_line():
    methods = "".join(f"    # step {i}\n    def step_{i}(self):\n        return {i}  # " + "x" * 300 + "\n\n"
                      for i in range(12))
    text = f'"""Steps."""\n\nclass Pipeline:\n    """Many steps."""\n\n{methods}\nLIMIT = 3\n'
    spans = code_spans("src/pipeline.py", text, max_chars=1000)
    assert [(s.start, s.end) for s in spans] == list(zip([0] + [s.end for s in spans[:-1]], [s.end for s in spans]))
    assert spans[-1].end == len(text) and all(s.end - s.start <= 1000 for s in spans)
    for span in spans[1:]:
        assert text[span.start - 1] == "\n" and text[span.start:].lstrip().startswith(("# step", "LIMIT")), span
    named = {n: span for span in spans for n in span.names}
    assert {f"Pipeline.step_{i}" for i in range(12)} <= named.keys() and "LIMIT" in named
    for i in range(12):  # each method's span holds its comment and its whole body
        span = named[f"Pipeline.step_{i}"]
        assert f"# step {i}\n    def step_{i}" in text[span.start:span.end] and f"return {i}" in text[span.start:span.end]


def test_the_span_that_defines_a_name_outranks_spans_that_use_it():
    uses = ["    links = parse_header_links(header)  # parse the Link header into links\n" * 3,
            "for link in parse_header_links(value):\n    headers.append(link)  # link headers\n"]
    defines = 'def parse_header_links(value):\n    """Return a list of parsed link headers."""\n    return []\n'
    texts = [*uses, defines]
    defs = [[name for span in code_spans("x.py", text) for name in span.names] for text in texts]
    question = "Which file defines the function that parses Link headers?"
    scores = rank(texts, question, defs)
    assert max(range(3), key=scores.__getitem__) == 2, scores
    without = rank(texts, question)
    assert max(range(3), key=without.__getitem__) != 2, "the defs column is what lifts the definition"


def test_in_a_real_repository_the_defining_file_is_ranked_first(corpus):
    from engine.documents import load_document

    document = load_document(corpus / "repos" / "requests-2.34.2")
    pieces = [(segment.path, f"{segment.label}\n{segment.text[s.start:s.end]}", s)
              for segment in document.segments for s in segment_spans(segment.path, segment.text)]
    for question, path in (("Which file defines the function that parses Link headers?", "requests/utils.py"),
                           ("Which class implements HTTP Digest authentication?", "requests/auth.py")):
        scores = rank([text for _, text, _ in pieces], question, [indexed_names(names) for _, _, names in pieces])
        assert pieces[max(range(len(pieces)), key=scores.__getitem__)][0] == path, question


def test_words_that_say_where_the_answer_is_do_not_rank_a_span(corpus):
    # auth.py alone: "Which file …" must not favour the parts that talk about a file-like object.
    from engine.documents import load_document

    (segment,) = load_document(corpus / "repos" / "requests-2.34.2" / "requests" / "auth.py").segments
    pieces = segment_spans(segment.label, segment.text)
    parts = [segment.text[p.start:p.end] for p in pieces]
    scores = rank([f"auth.py\n{part}" for part in parts], "Which file defines HTTPDigestAuth?",
                  [indexed_names(p) for p in pieces])
    assert "class HTTPDigestAuth" in parts[max(range(len(parts)), key=scores.__getitem__)], scores
    assert rank(["a page about files", "nothing"], "Which file?")[0] > 0, "a question of only such words still searches"


def test_the_document_naming_itself_does_not_rank_a_span():
    preface = "This book is for beginners. The book teaches Python; each chapter of the book ends with exercises."
    glossary = "fruitful function: A function that returns a value. void function: A function that returns None."
    scores = rank([preface, glossary], "What does the book call a function that returns a value?")
    assert scores[1] > scores[0] == 0, scores  # "the book" says where to look, not what to find
    assert rank([preface, glossary], "Which book does this chapter recommend?")[0] > 0, "a book without a determiner is a word"
    assert rank([preface, glossary], "What is this book?")[0] > 0, "a question of nothing else still searches"


def test_split_spans_cover_the_text_at_line_ends():
    text = "\n".join(f"line {i} " + "x" * 50 for i in range(200))
    spans = split_spans(text, max_chars=1000)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(end - start <= 1000 for start, end in spans) and all(text[end - 1] == "\n" for _, end in spans[:-1])


def test_a_damaged_or_missing_index_is_rebuilt(smol, store):
    first = DocumentSession(smol, settings(), store)
    first.open(book())
    assert first.spans.rebuilt
    key = first.prefix_key
    path = store.text_index_path(key)
    assert path.is_file()
    first.close()

    again = DocumentSession(smol, settings(), store)
    assert again.open(book()).prefix_hit and not again.spans.rebuilt, "an intact index is reused"
    again.close()

    intact = path.read_bytes()
    for damage in (intact[: len(intact) // 2], b"\0" * 4096 + intact[4096:]):  # a cut copy, a zeroed header
        path.write_bytes(damage)
        damaged = DocumentSession(smol, settings(), store)
        damaged.open(book())
        assert damaged.spans.rebuilt
        assert damaged.ask(QUESTION).recall.spans == (f"page {NEEDLE_PAGE}",)
        damaged.close()

    path.unlink()
    missing = DocumentSession(smol, settings(), store)
    missing.open(book())
    assert missing.spans.rebuilt and path.is_file()
    missing.close()
    store.delete(key)
    assert not path.exists(), "the index goes with its entry"


def test_an_index_built_from_other_spans_is_refused(tmp_path):
    path = tmp_path / "spans.sqlite"
    TextIndex.build(["alpha beta", "gamma"], path).close()
    with pytest.raises(IndexDamaged):
        TextIndex.open(path, spans_digest(["alpha beta", "delta"]))
    index, rebuilt = load_or_build(["alpha beta", "delta"], path)
    assert rebuilt and index.search("delta")[0].span == 1
    index.close()


def test_without_room_for_the_archive_the_chosen_page_is_read_again_from_its_tokens(smol, tmp_path):
    # A disk budget that holds the snapshot but not the archive (as for a 3B model at 128k tokens).
    probe = DocumentSession(smol, settings(), PrefixStore(tmp_path / "probe", disk_budget_bytes=512 * 1024**2))
    probe.open(book())
    entry = probe.store.entries()[0]
    budget = entry.size_bytes + entry.archive_bytes // 2
    store = PrefixStore(tmp_path / "small", disk_budget_bytes=budget)
    session = DocumentSession(smol, settings(), store)
    report = session.open(book())
    assert session.opened.archive is None and store.archive(session.prefix_key) is None
    assert any("re-reads the parts" in w and "would not fit" in w for w in report.warnings)
    answer = session.ask(QUESTION)
    assert COMBINATION in answer.text and answer.recall.spans == (f"page {NEEDLE_PAGE}",)
    assert answer.sources[0].page == NEEDLE_PAGE and answer.recall.bytes_read == 0
    # The re-read keys and values are those of a prefill of just the recalled tokens.
    recalled = session.conversation.layers[5].recalled
    capture = SpanCapture()
    ids = torch.tensor(session.opened.ids)[recalled.index[0]]
    smol.decoder.prefill(ids, smol.decoder.new_cache(settings().cache.replace(budget_tokens=2048), "original"), archive=capture)
    keys, values = capture.keys_values()[5]
    assert torch.equal(recalled.keys, keys) and torch.equal(recalled.values, values)



def test_a_part_of_a_long_file_is_recalled_under_its_path():
    from engine.evidence.spans import DocumentSpans

    lines = "\n".join(f"value_{i} = {i}  # setting number {i}" for i in range(300))
    document = Document(title="repo", source="", kind="repo",
                        segments=[Segment(text=lines, label="src/big.py", path="src/big.py", page=None)])
    rendered = document.render()
    spans = DocumentSpans.build(document, list(range(len(rendered))), 0, len(rendered), len(rendered), None)  # a token a character
    assert len(spans.spans) > 2 and spans.spans[0].token_start == 0
    second = spans.spans[1]
    chosen = [second]
    positions = spans.recall_positions(chosen)
    marker = "=== src/big.py ===\n"
    assert rendered.startswith(marker)
    assert positions[: len(marker)] == list(range(len(marker))), "the path's marker line comes with the part"
    assert positions[len(marker):] == list(range(second.token_start, second.token_end))
    assert "".join(rendered[p] for p in positions).startswith(marker + "value_")
    assert chosen[0].tokens == len(marker) + second.token_end - second.token_start, "the marker counts in the budget"
    spans.close()
