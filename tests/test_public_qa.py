"""bench/public_qa.py's marks: whether a question's evidence is among what it reads, among the first
pages `find` lists and in the BM25 windows, on a made-up example worked out by hand; and where
bench/public_qa_data.py places evidence in a real .docx read by the engine."""

import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported (render_pdf, pytest-qt's qapp)

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_marks_on_a_made_up_question():
    public_qa = load_bench("public_qa")
    wanted = [(2, 100, 200)]  # the answer's paragraph: characters 100-200 of unit 2
    chosen = [(5, 0, 900), (2, 0, 80)]  # reads unit 5 and the start of unit 2, which stops short
    ranked = [(5, 0, 900), (5, 900, 1500), (7, 0, 400), (2, 0, 80), (2, 150, 300), (9, 0, 10)]
    windows = [(7, 0, 3000), (2, 90, 3090), (2, 3090, 6000)]
    marks = public_qa.score(wanted, chosen, ranked, windows)
    assert marks == {"read": False, "read_unit": True, "read_passage": None, "find_8": True, "find_4": True, "find_3": True, "find_2": False,
                     "find_1": False,
                     "bm25_1": False, "bm25_2": True, "pages_read": 2, "pages_bm25_2": 2}
    # the same span reaching into the paragraph is a read; a range that ends where it starts is not
    assert public_qa.score(wanted, [(2, 0, 101)], ranked, windows)["read"]
    assert not public_qa.score(wanted, [(2, 0, 100)], ranked, windows)["read"]
    # on a PDF the page is the evidence; the passage on it is the stricter mark
    page = [(2, 0, 5000)]
    assert public_qa.score(page, chosen, ranked, windows, wanted)["read"]
    assert public_qa.score(page, chosen, ranked, windows, wanted)["read_passage"] is False
    # find's list counts distinct units: unit 5 twice is one place, so unit 2 is the third
    assert public_qa.first_units(ranked, 3) == [(5, 0, sys.maxsize), (7, 0, sys.maxsize), (2, 0, sys.maxsize)]


def test_summary_shares_per_set_and_overall():
    public_qa = load_bench("public_qa")
    marks = {"read_unit": True, "read_passage": None, "find_8": True, "find_4": True, "find_3": False, "find_2": False, "find_1": False, "bm25_1": False, "bm25_2": False,
             "pages_bm25_2": 2, "tokens": 100, "document_units": 10}
    rows = [{"set": "a", "kind": "text", "spread": "single", "document": "x.pdf", "read": True, "pages_read": 1, **marks},
            {"set": "a", "kind": "text", "spread": "multi", "document": "x.pdf", "read": False, "pages_read": 3, **marks},
            {"set": "b", "kind": "table/figure", "spread": "single", "document": "y.pdf", "read": False, "pages_read": 2,
             **marks},
            {"set": "b-docx", "kind": "text", "spread": "single", "document": "y.docx", "read": True, "pages_read": 1,
             **marks}]
    rows[1] = {**rows[1], "read_passage": False}  # only this one's passage was found on its page
    table = {(r["set"], r["part"]): r for r in public_qa.summary(rows)}
    assert table["a", "all"]["read_passage"] == 0.0 and table["a", "all"]["passage_questions"] == 1
    assert table["b", "all"]["read_passage"] is None
    assert table["a", "all"]["read"] == 0.5 and table["a", "all"]["pages_read"] == 2.0
    assert table["all PDF sets", "all"]["questions"] == 3 and table["all PDF sets", "all"]["read"] == 0.333
    assert table["a", "evidence on multi unit(s)"]["read"] == 0.0


def test_paragraphs_are_placed_in_their_section_of_a_real_docx(tmp_path):
    data = load_bench("public_qa_data")
    from engine.documents import load_document

    paper = {"title": "A paper", "abstract": "We study things.",
             "full_text": {"section_name": ["Introduction", "Method ::: Encoder", "Results"],
                           "paragraphs": [["Intro words here."], ["The encoder  has\nsix layers of attention."],
                                          ["Scores went up by four points on the test set."]]},
             "figures_and_tables": {"caption": ["Table 1: Scores per model."]}}
    path = tmp_path / "paper.docx"
    data._write_docx(paper, path)
    texts = [s.text for s in load_document(path).segments]
    unit, start, end = data.locate_paragraph(texts, "the encoder has six layers of attention.")
    assert "Encoder" in texts[unit] and "Results" not in texts[unit]
    assert " ".join(texts[unit][start:end].split()) == "The encoder has six layers of attention."
    caption = data.locate_paragraph(texts, "Table 1: Scores per model.")
    assert caption is not None and "Figures and tables" in texts[caption[0]]
    assert data.locate_paragraph(texts, "Nowhere in the paper.") is None


def test_a_latex_paragraph_is_placed_on_the_pages_that_hold_its_words():
    data = load_bench("public_qa_data")
    pages = ["Introduction. Quasi-periodic eruptions were seen in the galaxy.",
             ("The best-fit blackbody temperature is 38,063 K and the power-law slope is much steeper than "
              "that of AGNs, which have a typical index, further disfavoring the AGN scenario.")]
    source = (r"The best-fit blackbody temperature is $\rm38,063\pm107\,K$, and the power-law "
              r"slope is much steeper than that of AGNs, which have a typical index \citep{Vanden2001}, "
              r"further disfavoring the AGN scenario.")
    assert data.locate_pages(pages, source) == [1]
    assert data.locate_pages(pages, r"\begin{equation}P(k) \propto k^4\end{equation}") == []  # too few words
    # a paragraph that runs on over a page break is on both pages
    broken = [pages[0], pages[1][:80], pages[1][80:]]
    assert data.locate_pages(broken, source) == [1, 2]
    # a page that holds it all is the evidence; a part repeated elsewhere is not
    assert data.locate_pages([*pages, pages[1][:80]], source) == [1]


def test_a_rendered_pdf_is_read_by_the_engine_and_a_passage_found_on_its_page(tmp_path, qapp):
    # qapp: the QApplication the GUI tests need exists before render_pdf looks for one
    data = load_bench("public_qa_data")
    from engine.documents import load_document

    filler = [(0, f"Filler paragraph {i} about the general settings screen and its many options.") for i in range(120)]
    answer = "To reset the remote, press and hold the Return and Play buttons together for three seconds."
    blocks = [(2, "Getting started"), *filler, (2, "Resetting the remote"), (0, answer)]
    path = tmp_path / "manual.pdf"
    data.render_pdf("A manual", blocks, path)
    texts = [s.text for s in load_document(path).segments]
    assert len(texts) >= 2  # the filler pushes the answer past the first page
    pages = data.locate_pages(texts, answer)
    assert pages == [len(texts) - 1] and "Resetting the remote" in texts[pages[0]]
    unit, start, end = data.locate_paragraph(texts, answer)
    assert unit == pages[0] and " ".join(texts[unit][start:end].split()) == answer


def test_rules_read_the_evidence_page_find_lists_next_only_with_pages_at_least(tmp_path):
    """`--rules`: each reading budget measured on the same spans. On a real PDF whose renewal clause
    scores below 80 % of the best page, today's small budget reads one page and misses it; at
    least 3 pages reads it (issue 42's candidate rule), per set and over the PDF sets."""
    sys.path.insert(0, str(BENCH))
    try:
        public_qa = load_bench("public_qa")
        from pdf_fixtures import helvetica_book

        from engine.documents import load_document
        from engine.settings import EngineSettings

        best = ["The lease term of the harbour office is five years; the harbour office lease term starts in June."]
        renewal = ["Renewal: the office may be extended by three years."]
        filler = [[f"Schedule {k}: parking spaces, keys and the cleaning rota."] for k in range(5)]
        pages = [filler[0], best, filler[1], renewal, filler[2], ["The harbour crane is painted red."], *filler[3:]]
        document = load_document(helvetica_book(tmp_path / "lease.pdf", pages))
        question = public_qa.data.Question("made-up", "lease.pdf", "What is the lease term of the harbour office?",
                                           "text", "lease#1", evidence=[(3, 0, len(document.segments[3].text))])
        rules = [("today", "small", {}), ("three pages", "small", {"pages_at_least": 3})]
        rows = public_qa.run_rules([question], {"lease.pdf": document}, EngineSettings(), rules)
    finally:
        sys.path.remove(str(BENCH))
    marks = {(r["rule"], r["set"]): (r["read_count"], r["pages_read"], r["find_8"]) for r in rows}
    assert marks == {("today", "made-up"): (0, 1.0, 1.0), ("today", "all PDF sets"): (0, 1.0, 1.0),
                     ("three pages", "made-up"): (1, 3.0, 1.0), ("three pages", "all PDF sets"): (1, 3.0, 1.0)}, rows
