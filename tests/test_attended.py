"""Attended passages: the sentences / lines an answer's attention went to, as character ranges of
the segment's text. The real model, asked about a needle on page 17 of a 24-page book, attends
most to the needle's sentence; the grouping and merging rules hold on a hand-made mass."""

from engine.attended import AttendedSpan, attended_spans, segment_text_starts, units
from engine.documents import Document, Segment
from engine.session import DocumentSession
from test_span_recall import COMBINATION, NEEDLE_PAGE, QUESTION, book, settings

NEEDLE = f"the combination of the observatory safe is {COMBINATION}"


def two_pages() -> Document:
    return Document(title="t", source="", kind="pdf", pages=2, segments=[
        Segment(text="One. Two two. Three.", label="page 1", page=1, path=None),
        Segment(text="Alpha beta.\nGamma.", label="page 2", page=2, path=None)])


def test_segment_text_starts_point_at_each_text_in_render():
    document = two_pages()
    rendered = document.render()
    for start, segment in zip(segment_text_starts(document), document.segments, strict=True):
        assert rendered[start:start + len(segment.text)] == segment.text
    assert units("One. Two two. Three.") == [0, 5, 14]


def test_mass_is_summed_per_sentence_capped_and_kept_above_the_floors():
    document = two_pages()
    starts = segment_text_starts(document)
    # one "token" per word of interest: its render offset, its mass
    chars = [starts[0], starts[0] + 5, starts[0] + 9, starts[0] + 14, starts[1], starts[1] + 12, starts[0] - 3]
    mass = [9.0, 0.5] + [0.4, 1.0, 1.0, 0.3, 5.0, 2.0, 7.0]  # two template tokens first; the last is a marker's
    spans = attended_spans(mass, chars, 2, document, min_share=0.1)
    # "Alpha beta." 5.0, "Gamma." 2.0, "Two two." 2.0; "One." and "Three." under 10 %
    total = sum(min(m, 5.0) for m in mass[2:])  # the marker's 7 is capped at the 95th percentile, 5
    assert spans == [AttendedSpan(1, "page 2", 2, None, 0, 11, 5.0 / total),
                     AttendedSpan(0, "page 1", 1, None, 5, 13, 2.0 / total),
                     AttendedSpan(1, "page 2", 2, None, 12, 18, 2.0 / total)]
    assert [s.text(document) for s in spans] == ["Alpha beta.", "Two two.", "Gamma."]
    # under a quarter of the strongest: not shown, whatever its share of the total
    weak = attended_spans([4.0, 4.0, 0.0, 0.9, 4.0, 0.0, 0.0], chars, 0, document, min_share=0.01)
    assert [s.text(document) for s in weak] == ["One.", "Two two.", "Alpha beta."], "Three. (7 %) is dropped"


def test_the_first_passage_of_a_needle_answer_is_the_needle_sentence(smol):
    session = DocumentSession(smol, settings(), None)
    document = book()
    session.open(document)
    answer = session.ask(QUESTION)
    assert answer.passages, "the answer attended to recalled tokens"
    first = answer.passages[0]
    page = document.segments[first.segment_index].text
    needle = page.index(NEEDLE)
    assert first.page == NEEDLE_PAGE and first.label == f"page {NEEDLE_PAGE}"
    assert first.char_start < needle + len(NEEDLE) and needle < first.char_end, (first, first.text(document))


def test_a_document_the_cache_keeps_whole_has_attended_passages_too(smol):
    """Issue 32, item 4: a short document is kept whole, so nothing is recalled; its answer's
    passages come from the attention the cache's own tokens received, and the needle's sentence
    is among them (before, such an answer had no sources and no highlights at all)."""
    from engine.estimate import kept_whole

    pages = [segment for segment in book().segments[NEEDLE_PAGE - 2:NEEDLE_PAGE + 1]]  # three pages, the needle's in the middle
    document = Document(title="short", source="", kind="pdf", pages=3,
                        segments=[Segment(s.text, f"page {i + 1}", i + 1, None) for i, s in enumerate(pages)])
    roomy = settings().replace(cache=settings().cache.replace(budget_tokens=1024))
    session = DocumentSession(smol, roomy, None)
    report = session.open(document)
    assert kept_whole(report.document_tokens, roomy.cache)
    answer = session.ask(QUESTION)
    assert answer.recall is None, "nothing to recall: the cache keeps it whole"
    assert {source.label for source in answer.sources} <= {"page 1", "page 2", "page 3"} and answer.sources
    first = answer.passages[0]  # a whole page's attention is spread; its strongest sentence is not
    needle = document.segments[1].text.index(NEEDLE)
    assert first.label == "page 2" and first.char_start < needle + len(NEEDLE) and needle < first.char_end, \
        [(p.label, p.text(document)) for p in answer.passages]


# ------------------------------------------------------------------------- issue 32 (window, second pass)
PART_LINES = 30


def two_part_file(folder):
    """A folder with `parts.py`, two functions of `PART_LINES` alike lines each, and `other.py`,
    with one long comment line."""
    folder.mkdir()
    body = [f"    total_{i:02d} = weight_{i:02d} * factor + offset_{i:02d}" for i in range(PART_LINES)]
    lines = ['"""Two parts."""', "def first_part(factor):", *body, "    return factor", "", "",
             "def second_part(factor):", *body, "    return factor"]
    (folder / "parts.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "other.py").write_text("import os\n\n# " + " ".join(f"note {i} about it" for i in range(12))
                                     + "\nHOME = os.environ.get('HOME')\n", encoding="utf-8")
    return folder


def spread_over_two_parts(smol, folder):
    """Open `two_part_file`'s folder and measure `OpenDocument.sources` on a made-up attention:
    one unit of mass on each token of both functions' bodies (half each) and of other.py's line.
    Returns (session, sources, passages, each body's lines: 1-based in the file's text as read)."""
    import torch

    folder = two_part_file(folder)
    session = DocumentSession(smol, settings(), None)
    session.open(str(folder))
    document = session.document
    starts = dict(zip((s.path for s in document.segments), segment_text_starts(document), strict=True))
    parts = document.segments[[s.path for s in document.segments].index("parts.py")].text
    line_starts = [0] + [i + 1 for i, ch in enumerate(parts) if ch == "\n"] + [len(parts) + 1]
    body = [n for n, line in enumerate(parts.split("\n"), start=1) if line.startswith("    total_")]
    first, second = body[:PART_LINES], body[PART_LINES:]
    wanted = [(starts["parts.py"] + line_starts[n - 1], starts["parts.py"] + line_starts[n]) for n in first + second]
    other = document.segments[[s.path for s in document.segments].index("other.py")].text
    note = other.index("# note")
    wanted.append((starts["other.py"] + note, starts["other.py"] + other.index("\n", note)))
    text_first, _ = session.opened.text_range
    mass = torch.zeros(session.report.document_tokens, dtype=torch.float64)
    for i, char in enumerate(session.opened.encoding.token_chars):
        if any(low <= char < high for low, high in wanted):
            mass[text_first + i] = 1.0
    sources, passages = session.opened.sources(mass)
    return session, sources, passages, (first, second)


def test_a_file_whose_attention_is_spread_over_two_parts_gets_a_passage_in_each(smol, tmp_path):
    """Issue 32 (window, second pass), item 1: a file the answer lists as a source, its attention
    spread evenly over two functions, had no line above the floors, so no passage: a click on it
    opened line 1 saying nothing was attended there. Each of its two parts is a passage now."""
    session, sources, passages, (first, second) = spread_over_two_parts(smol, tmp_path / "project")
    assert sources[0].label == "parts.py" and sources[0].share > 0.8, sources
    text = session.document.segments[passages[0].segment_index].text
    found = sorted((text.count("\n", 0, p.char_start) + 1, text.count("\n", 0, p.char_end - 1) + 1)
                   for p in passages if p.label == "parts.py")
    assert found == [(first[0], first[-1]), (second[0], second[-1])], (found, passages)
    assert [p.label for p in passages[:2]] == ["parts.py", "parts.py"], "strongest first"
