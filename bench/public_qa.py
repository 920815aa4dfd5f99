"""Evidence on public document-QA sets nobody tuned on: is the page (or section) that holds each
answer among what the question reads, among the first pages `halaman find` lists, and in a chunk
retriever's best windows?

    python bench/public_qa.py --fill-cache PATH/TO/pdfQA PATH/TO/qasper-personal PATH/TO/EMNLP-2021-Findings
    python bench/public_qa.py [--name public_qa] [--reading large] [--words-relative 0.6 --several-at-least 4 ...]
    python bench/public_qa.py --rules candidates       # docs/bench/public_qa_rules.{json,csv}

No model runs, only its tokenizer: each document is read as the app reads it (bench/evidence.py's
`load`), its spans and index built as `halaman find` builds them (`engine.find.document_spans`'s
encoding; `chooser`: find's budget, span limit and reading budget for the default model), and each question's
selection made. The sets and how their evidence is located: bench/public_qa_data.py.
Per question: the evidence is found when a chosen span overlaps one of its ranges (a PDF page: any
span on the page; a QASPER paragraph: a span that overlaps the paragraph).
  read      among the chosen spans (what the question reads); read_unit: a chosen span on the
            evidence's page or section (the same as read for a PDF page); read_passage: a chosen
            span overlaps the passage itself, where it is found exactly on a PDF page
  find_8/4/3/2/1  among the first 8 / 4 / 3 / 2 / 1 distinct pages or sections of the ranked list
            `find` shows
  bm25_1/2  in the best one / two BM25 windows of 3,000 characters (bench/evidence.py's arms)
and pages read (distinct units among the chosen spans) and pages in the two windows.
Results: docs/bench/public_qa.{json,csv} (per question) and public_qa_summary.{json,csv}
(per set, per kind of evidence, single or multi-unit evidence, and overall).
--words-relative, --words-at-most, --several-at-least, --neighbours and --pages-at-least change
single fields of the reading budget chosen (engine.evidence.reading_budget.ReadingBudget).
--rules candidates|all measures bench/evidence_rules.py's rules instead (each a budget the default
model is given, spans built once): per rule and set the questions, read (share and count), find_8
and pages read, to docs/bench/public_qa_rules.{json,csv} (--name sets the stem: <name>_rules).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import common
import evidence
import public_qa_data as data

CACHE = common.WORK / "public_qa"
FIND_PAGES = (8, 4, 3, 2, 1)


def overlaps(wanted: list[tuple[int, int, int]], ranges: list[tuple[int, int, int]]) -> bool:
    """Whether any (unit, start, end) of `wanted` overlaps any of `ranges` in the same unit."""
    return any(u == s and a < e and b < f for u, a, f in wanted for s, b, e in ranges)


def first_units(ranges: list[tuple[int, int, int]], n: int) -> list[tuple[int, int, int]]:
    """The first `n` distinct units of the ranked `ranges`, each as the whole unit (0, a big end):
    what a list of pages shows."""
    units = list(dict.fromkeys(r[0] for r in ranges))[:n]
    return [(u, 0, sys.maxsize) for u in units]


def score(wanted, chosen, ranked, windows, passages=()) -> dict:
    """One question's marks: `wanted` its evidence ranges, `chosen` the ranges it reads, `ranked`
    the ranges `find` lists best first, `windows` the BM25 windows best first (all (unit, start,
    end); `passages` the evidence's own ranges where `wanted` are whole pages (may be empty).
    Returns read, read_unit (a chosen span anywhere on an evidence unit), read_passage (a chosen
    span overlaps a passage; None without passages), find_8 ... find_1, bm25_1, bm25_2 (bool) and
    pages_read, pages_bm25_2 (distinct units)."""
    whole = [(u, 0, sys.maxsize) for u, _, _ in wanted]
    marks = {"read": overlaps(wanted, chosen), "read_unit": overlaps(whole, chosen),
             "read_passage": overlaps(list(passages), chosen) if passages else None}
    marks |= {f"find_{n}": overlaps(wanted, first_units(ranked, n)) for n in FIND_PAGES}
    marks |= {"bm25_1": overlaps(wanted, windows[:1]), "bm25_2": overlaps(wanted, windows[:2]),
              "pages_read": len({r[0] for r in chosen}), "pages_bm25_2": len({r[0] for r in windows[:2]})}
    return marks


def chooser(spans, settings, tokenizer, reading: str = "default", fields: dict | None = None):
    """One question's selection as `halaman find` makes it (engine.find's chooser, rebuilt from
    public names): the settings' recall budget within the model's positions, its span limit and,
    where the engine has reading budgets (engine.evidence.reading_budget), the model's. `reading`
    "large" takes the budget of a >= 1B model with 32k positions instead (SystemExit when the
    engine has none); `fields` (ReadingBudget field -> value) change that budget's fields.
    Returns (question, history) -> Selection."""
    from engine.evidence.select import select
    from engine.recall_plan import recall_budget

    try:
        from engine.evidence import reading_budget as budgets
    except ImportError:
        if reading == "large" or fields:
            raise SystemExit("--reading large and the budget's fields: this engine has no reading budgets "
                             "(engine.evidence.reading_budget)") from None
        budgets = None
    positions = 32768 if reading == "large" else tokenizer.profile.max_positions
    budget = recall_budget(settings, positions, reread=False)
    extra = {}
    if budgets is not None:
        extra["reading"] = budgets.LARGE if reading == "large" else budgets.reading_budget(tokenizer.profile)
        extra["reading"] = dataclasses.replace(extra["reading"], **(fields or {}))
    return lambda question, history: select(spans, question, budget_tokens=budget, max_spans=settings.recall.max_spans,
                                            history=history, **extra)


def spans_of(tokenizer, document):
    """The document's spans as `halaman find` builds them (its encoding with the model's tokenizer)."""
    from engine.evidence.spans import DocumentSpans
    from engine.prompt import encode_document

    encoding = encode_document(tokenizer, tokenizer.layout, document)
    return DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                               len(encoding.ids), None), encoding


def run(questions: list[data.Question], documents: dict, settings, reading: str = "default",
        fields: dict | None = None) -> list[dict]:
    """Each question's marks (`score`) and what it read, document by document; `reading`
    "default" selects as `halaman find` does with the settings' model, "large" with a large
    model's reading budget, `fields` changing that budget's fields (`chooser`)."""
    from engine.tokenizer_cache import text_tokenizer

    tokenizer = text_tokenizer(settings.model)
    rows = []
    for name in dict.fromkeys(q.document for q in questions):
        document = documents[name]
        spans, encoding = spans_of(tokenizer, document)
        choose = chooser(spans, settings, tokenizer, reading, fields)
        chunks, window_index = evidence.windows(document)
        for question in (q for q in questions if q.document == name):
            began = time.perf_counter()
            selection = choose(question.q, ())
            select_s = time.perf_counter() - began
            chosen = [(s.segment, s.char_start, s.char_end) for s in selection.chosen]
            ranked = [(spans.spans[c.span].segment, spans.spans[c.span].char_start, spans.spans[c.span].char_end)
                      for c in selection.ranked]
            windows = [chunks[h.span] for h in window_index.search(question.q, 10)]
            units = sorted({e[0] for e in question.evidence})
            marks = score(question.evidence, chosen, ranked, windows, question.passages)
            rows.append({"set": question.set, "document": name, "kind": question.kind,
                         "spread": "multi" if len(units) > 1 else "single", "qid": question.qid,
                         "q": question.q if question.shown else "",
                         "evidence": "; ".join(document.segments[u].label for u in units),
                         **marks, "chosen": "; ".join(dict.fromkeys(document.segments[c[0]].label for c in chosen)),
                         "why": "; ".join(f"{document.segments[span.segment].label}:{c.signal}"
                                          for span, c in zip(selection.chosen, selection.reasons())),
                         "listed": "; ".join(document.segments[u].label
                                             for u in list(dict.fromkeys(r[0] for r in ranked))[:max(FIND_PAGES)]),
                         "first_evidence_rank": next((k for k, u in enumerate(dict.fromkeys(r[0] for r in ranked), 1)
                                                      if u in units), None),
                         "tokens": sum(s.tokens for s in selection.chosen), "select_s": round(select_s, 4),
                         "document_units": len(document.segments), "document_tokens": len(encoding.ids)})
            r = rows[-1]
            print(f"[{question.set}] {'READ' if r['read'] else ('f8  ' if r['find_8'] else 'miss')} "
                  f"{question.qid} {question.q[:60]!r} ev={r['evidence'][:30]} read={r['chosen'][:60]}", flush=True)
        spans.close()
        window_index.close()
    return rows


def run_rules(questions: list[data.Question], documents: dict, settings, rules) -> list[dict]:
    """Per rule of `rules` ((label, "small"|"large", fields) as bench/evidence_rules.RULES) and per
    set (and over the PDF sets): questions, read (share and count), find_8 (share) and pages read
    (mean), each question selected as `halaman find` does with that budget (spans built once)."""
    from engine.tokenizer_cache import text_tokenizer

    tokenizer = text_tokenizer(settings.model)
    marks: dict[tuple[str, str], list[dict]] = {}
    for name in dict.fromkeys(q.document for q in questions):
        spans, _ = spans_of(tokenizer, documents[name])
        for label, base, fields in rules:
            choose = chooser(spans, settings, tokenizer, "large" if base == "large" else "default", fields)
            for question in (q for q in questions if q.document == name):
                selection = choose(question.q, ())
                chosen = [(s.segment, s.char_start, s.char_end) for s in selection.chosen]
                ranked = [(spans.spans[c.span].segment, 0, 0) for c in selection.ranked]
                cell = score(question.evidence, chosen, ranked, [], question.passages)
                for group in (question.set, "all PDF sets") if name.endswith(".pdf") else (question.set,):
                    marks.setdefault((label, group), []).append(cell)
        spans.close()
    rows = []
    for (label, group), cells in sorted(marks.items(), key=lambda item: ([r[0] for r in rules].index(item[0][0]),
                                                                        item[0][1] == "all PDF sets")):
        n = len(cells)
        rows.append({"rule": label, "set": group, "questions": n, "read": round(sum(c["read"] for c in cells) / n, 3),
                     "read_count": sum(c["read"] for c in cells),
                     "find_8": round(sum(c["find_8"] for c in cells) / n, 3),
                     "pages_read": round(sum(c["pages_read"] for c in cells) / n, 2)})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Shares per set, per set and kind, per set and spread, and over the questions of the PDF sets."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        for key in ((r["set"], "all"), (r["set"], f"kind={r['kind']}"), (r["set"], f"evidence on {r['spread']} unit(s)")):
            groups.setdefault(key, []).append(r)
    # over the PDF sets: qasper-docx asks the same questions of the same papers in another rendering
    groups["all PDF sets", "all"] = [r for r in rows if r["document"].endswith(".pdf")]
    out = []
    for (name, part), cell in groups.items():
        n = len(cell)
        row = {"set": name, "part": part, "questions": n, "documents": len({r["document"] for r in cell})}
        for mark in ("read", "read_unit", *(f"find_{n}" for n in FIND_PAGES), "bm25_1", "bm25_2"):
            row[mark] = round(sum(r[mark] for r in cell) / n, 3)
        placed = [r["read_passage"] for r in cell if r["read_passage"] is not None]
        row["read_passage"] = round(sum(placed) / len(placed), 3) if placed else None
        row["passage_questions"] = len(placed)
        row["pages_read"] = round(sum(r["pages_read"] for r in cell) / n, 2)
        row["pages_bm25_2"] = round(sum(r["pages_bm25_2"] for r in cell) / n, 2)
        row["median_tokens"] = common.median([r["tokens"] for r in cell])
        row["median_document_units"] = common.median([r["document_units"] for r in cell])
        out.append(row)
    return out


def engine_used() -> dict:
    """The engine this run imported: its checkout's commit, and whether that checkout is this one
    (with another checkout first on PYTHONPATH, it is not)."""
    import subprocess

    folder = Path(sys.modules["engine"].__file__).parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=folder, capture_output=True,
                          text=True).stdout
    return {"engine_head": head.strip(), "engine_of_this_checkout": folder.parent == common.REPO}


def load_sets(documents: dict) -> tuple[list[data.Question], dict]:
    key = evidence.documents_code_key()

    def texts_of(name: str) -> list[str]:
        if name not in documents:
            documents[name] = evidence.load(CACHE / name, key)
        return [s.text for s in documents[name].segments]

    pdfqa, pdfqa_dropped = data.pdfqa_questions(CACHE, texts_of)
    qasper_pdf, qasper_pdf_dropped = data.qasper_questions(CACHE, texts_of, "pdf")
    qasper_docx, qasper_docx_dropped = data.qasper_questions(CACHE, texts_of, "docx")
    emanual, emanual_dropped = data.emanual_questions(CACHE, texts_of)
    return pdfqa + qasper_pdf + qasper_docx + emanual, {
        "pdfqa_unplaced": pdfqa_dropped, "qasper_pdf_unplaced": qasper_pdf_dropped,
        "qasper_docx_unplaced": qasper_docx_dropped, "emanual_unplaced": emanual_dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fill-cache", nargs=3, metavar=("PDFQA_REPO", "QASPER_REPO", "EMANUAL_REPO"), type=Path,
                        help="write the sets' files into bench/.work/public_qa from clones of the three repositories")
    parser.add_argument("--name", default="public_qa")
    parser.add_argument("--reading", choices=("default", "large"), default="default",
                        help="the default model's selection (as `halaman find`), or a large model's reading budget")
    common.budget_field_flags(parser)
    parser.add_argument("--rules", choices=("candidates", "all"),
                        help="measure bench/evidence_rules.py's rules (the candidates or all) instead")
    args = parser.parse_args()
    if args.fill_cache:
        data.fill_cache(CACHE, *args.fill_cache)
        print(f"filled {CACHE}")
        return
    if not (CACHE / "qasper" / "qasper.json").exists():
        raise SystemExit(f"{CACHE}: no sets yet; run with --fill-cache first (see the module docstring)")
    common.setup(1)  # records the load and commit the run starts with
    from engine.settings import EngineSettings

    settings = EngineSettings()
    documents: dict = {}
    questions, unplaced = load_sets(documents)
    fields = {k: v for k, v in (("words_relative", args.words_relative), ("words_at_most", args.words_at_most),
                                ("several_at_least", args.several_at_least), ("pages_at_least", args.pages_at_least),
                                ("neighbours", None if args.neighbours is None else bool(args.neighbours)))
              if v is not None}
    if args.rules:
        import evidence_rules

        table = run_rules(questions, documents, settings, evidence_rules.rules_named(args.rules))
        meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                "recall_tokens": settings.recall.recall_tokens, "max_spans": settings.recall.max_spans,
                **engine_used(), **unplaced}
        common.write_results(f"{args.name}_rules", table, list(table[0]), meta)
        return
    rows = run(questions, documents, settings, args.reading, fields)
    meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "recall_tokens": settings.recall.recall_tokens, "max_spans": settings.recall.max_spans,
            "reading": args.reading, "reading_fields": fields, **engine_used(), **unplaced}
    columns = list(rows[0])
    common.write_results(args.name, rows, columns, meta)
    table = summary(rows)
    common.write_results(f"{args.name}_summary", table, list(table[0]), meta)
    print(common.markdown_table(table, list(table[0])))


if __name__ == "__main__":
    main()
