"""Each reading-budget rule measured on every evidence set: is the evidence among what a question
reads, and how many pages (or files) does it read? (engine.evidence.reading_budget, issue 42)

    python bench/evidence_rules.py [--set financebench-dev ...] [--rules candidates]

The same documents, tokenizer, spans and evidence as bench/evidence.py (its `halaman` arm), built
once; then the selection is made with each budget below. Every row is what
`bench/evidence.py --reading R --words-at-most N --words-relative S --several-at-least K
--neighbours 0|1 --pages-at-least P` gives for that set, and first_8: the evidence among the first
8 distinct pages (files) of the ranked list `halaman find` shows. `--rules candidates` measures only
the rules in CANDIDATES (the embedded model's candidates, docs/BENCHMARKS.md §7e; bench/public_qa.py
--rules measures the same on the public sets). Results: docs/bench/evidence_budget_rules.{json,csv}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import common
import evidence

# (label, budget the embedded model is given, fields changed): each rule alone, then together
RULES = [
    ("small (today: 3 within 80 %)", "small", {}),
    ("small + neighbours", "small", {"neighbours": True}),
    ("small + several (at least 4)", "small", {"several_at_least": 4}),
    ("small, 3 within 60 %", "small", {"words_relative": 0.6}),
    ("small, 3 within 60 % + several (4)", "small", {"words_relative": 0.6, "several_at_least": 4}),
    ("small, 3 within 50 % + several (4)", "small", {"words_relative": 0.5, "several_at_least": 4}),
    ("small, 4 within 50 %", "small", {"words_at_most": 4, "words_relative": 0.5}),
    ("small, 3 best whatever their score", "small", {"words_relative": 0.0}),
    ("small + at least 3 pages", "small", {"pages_at_least": 3}),
    ("small + at least 2 pages", "small", {"pages_at_least": 2}),
    ("small, 3 within 60 % + several (4) + at least 2 pages", "small",
     {"words_relative": 0.6, "several_at_least": 4, "pages_at_least": 2}),
    ("small, 3 within 60 % + several (4) + at least 3 pages", "small",
     {"words_relative": 0.6, "several_at_least": 4, "pages_at_least": 3}),
    ("large: 6 within 50 %, several 2, neighbours", "large", {}),
    ("large without neighbours", "large", {"neighbours": False}),
    ("large without several", "large", {"several_at_least": 1}),
    ("large, 8 within 50 %", "large", {"words_at_most": 8}),
    ("large, 8 within 60 %", "large", {"words_at_most": 8, "words_relative": 0.6}),
    ("large, 6 within 50 %, 4/3 beside sections/chapters", "large", {"beside_structure": 4, "beside_reference": 3}),
]

CANDIDATES = ("small (today: 3 within 80 %)", "small, 3 within 60 % + several (4)", "small, 3 best whatever their score",
              "small, 3 within 60 % + several (4) + at least 3 pages", "small + at least 3 pages",
              "small, 3 within 50 % + several (4)", "small + at least 2 pages",
              "small, 3 within 60 % + several (4) + at least 2 pages")
"""The embedded model's candidate rules (issue 42: the evidence read for >= 80 % of the public
questions at <= 4 pages, and for >= 85 % of the filings), whose answers are measured apart."""


def rules_named(which: str) -> list[tuple[str, str, dict]]:
    """RULES, or with "candidates" the CANDIDATES among them, in CANDIDATES' order."""
    if which == "all":
        return RULES
    by_label = {rule[0]: rule for rule in RULES}
    return [by_label[label] for label in CANDIDATES]


def first_8(document_ranked_units: list[int], evidence_items, n: int = 8) -> bool:
    """Whether any (segment, offset) of `evidence_items` is on the first `n` distinct units of the
    ranked list (units best first, repeated)."""
    units = list(dict.fromkeys(document_ranked_units))[:n]
    return any(evidence.covered(e, [(u, 0, sys.maxsize) for u in units]) for e in evidence_items)


def built_sets(names: list[str]) -> list[tuple[str, object, object, list[dict]]]:
    """(set, document, spans, questions) for every document of `names`, spans built once."""
    from transformers import AutoTokenizer

    from engine.evidence.spans import DocumentSpans
    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path
    from engine.prompt import chat_layout, encode_document

    tokenizer = AutoTokenizer.from_pretrained(converted_folder(default_gguf_path()))
    layout, key, out = chat_layout(tokenizer), evidence.documents_code_key(), []
    for name in names:
        spec = json.loads((evidence.QUESTIONS / f"{name}.json").read_text())
        by_document: dict[str, list[dict]] = {}
        for question in spec["questions"]:
            path = f"{spec['document_folder']}/{question['doc']}.pdf" if "doc" in question else spec["document"]
            by_document.setdefault(path, []).append(question)
        for path, questions in by_document.items():
            document = evidence.load(common.corpus_dir() / path, key)
            encoding = encode_document(tokenizer, layout, document)
            spans = DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                                        len(encoding.ids), None)
            out.append((name, document, spans, questions))
    return out


def measure(loaded, reading, budget_tokens: int, max_spans: int) -> dict[str, dict]:
    """Per set: questions, evidence read (any of its pages), evidence among the first 8 pages
    listed (first_8), pages read in all."""
    from engine.evidence.select import Turn, select

    cells: dict[str, dict] = {}
    for name, document, spans, questions in loaded:
        history: list[Turn] = []
        for question in questions:
            follow = bool(question.get("follow_up"))
            selection = select(spans, question["q"], budget_tokens=budget_tokens, max_spans=max_spans,
                               history=history if follow else (), reading=reading)
            history = [*history, Turn(question["q"], selection.chosen_index)] if follow else [Turn(question["q"], selection.chosen_index)]
            ranges = [(s.segment, s.char_start, s.char_end) for s in selection.chosen]
            cell = cells.setdefault(name, {"questions": 0, "found": 0, "first_8": 0, "pages": 0})
            cell["questions"] += 1
            items = evidence.evidence_of(document, question)
            cell["found"] += any(evidence.covered(e, ranges) for e in items)
            cell["first_8"] += first_8([spans.spans[c.span].segment for c in selection.ranked], items)
            cell["pages"] += len({s.segment for s in selection.chosen})
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help=f"question set (default: all of {', '.join(evidence.SETS)})")
    parser.add_argument("--name", default="evidence_budget_rules")
    parser.add_argument("--rules", choices=("all", "candidates"), default="all",
                        help="every rule, or only the embedded model's candidates (CANDIDATES)")
    args = parser.parse_args()
    common.setup(1)
    import engine.evidence.reading_budget as budgets
    from engine.settings import EngineSettings

    settings = EngineSettings()
    budget_tokens = min(settings.recall.recall_tokens, 8192 - 512 - settings.max_new_tokens)  # as bench/evidence.py
    loaded = built_sets(args.sets or list(evidence.SETS))
    rows = []
    for label, base, fields in rules_named(args.rules):
        reading = dataclasses.replace(budgets.LARGE if base == "large" else budgets.SMALL, **fields)
        cells = measure(loaded, reading, budget_tokens, settings.recall.max_spans)
        for name, cell in cells.items():
            rows.append({"rule": label, "set": name, "questions": cell["questions"], "found": cell["found"],
                         "found_share": round(cell["found"] / cell["questions"], 3), "first_8": cell["first_8"],
                         "mean_pages_read": round(cell["pages"] / cell["questions"], 2),
                         **{k: v for k, v in dataclasses.asdict(reading).items() if k != "label"}})
        print(label, [(r["set"], r["found"], r["mean_pages_read"]) for r in rows[-len(cells):]], flush=True)
    for _, _, spans, _ in loaded:
        spans.close()
    meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "budget_tokens": budget_tokens, "max_spans": settings.recall.max_spans}
    common.write_results(args.name, rows, list(rows[0]), meta)


if __name__ == "__main__":
    main()
