"""Evidence selection without answers: is the page (or the part of a file) that states each answer
among the spans a question reads, and at which rank?

    python bench/evidence.py [--set financebench-dev --set P16-dev ...] [--before REV]

No model runs: the documents are read and tokenized as the app does (the embedded model's
tokenizer and chat layout), their spans built and indexed, and each question's selection made.
Arms, side by side on the same documents and questions:
  halaman  the current selection (engine.evidence.select, the app's recall settings)
  before   the selection of commit REV (default cb17472: BM25 over 2,400-character spans, the best
           and a second within 80 %, at most 1,024 tokens), its own spans and index
  bm25-1   chunk retrieval as desktop peers do it: BM25 over 3,000-character windows within pages /
  bm25-2   files, the top 1 and the top 2 windows
Sets (docs/bench/questions): financebench-dev (evidence located by its text), P16-dev (`page`),
P16-dev-hard (`pages`), requests-dev and requests-dev-hard (the part of `file` around `anchor`).
A follow-up (`follow_up: true`) is selected after the previous question of its set.
Per question: evidence found (any / all of its pages), the rank of the first evidence in the ranked
candidates, tokens read, selection seconds. Results: docs/bench/evidence.{json,csv},
docs/bench/evidence_summary.{json,csv}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import common

QUESTIONS = common.DOCS / "bench" / "questions"
SETS = ("financebench-dev", "P16-dev", "P16-dev-hard", "requests-dev", "requests-dev-hard")
WINDOW_CHARS = 3000


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def load(path, cache_key: str):
    """The document at `path`, read once per documents code (kept as JSON in bench/.work)."""
    from engine.documents import Document, OutlineEntry, Segment, load_document

    cache = common.WORK / "evidence-docs" / f"{path.name}.{cache_key}.json"
    if cache.exists():
        raw = json.loads(cache.read_text())
        return Document(title=raw["title"], source=raw["source"], kind=raw["kind"], pages=raw["pages"],
                        segments=[Segment(**s) for s in raw["segments"]], outline=[OutlineEntry(**o) for o in raw["outline"]])
    document = load_document(path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"title": document.title, "source": document.source, "kind": document.kind,
                                 "pages": document.pages, "segments": [vars(s) for s in document.segments],
                                 "outline": [vars(o) for o in document.outline]}))
    return document


def documents_code_key() -> str:
    import subprocess

    tree = subprocess.run(["git", "rev-parse", "HEAD:engine/documents"], cwd=common.REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "engine/documents"], cwd=common.REPO, capture_output=True, text=True).stdout
    return tree.strip()[:12] + ("-dirty" if dirty.strip() else "")


def evidence_of(document, question: dict) -> list[tuple[int, int | None]]:
    """The evidence as (segment index, character offset in it or None for the whole segment)."""
    segments = document.segments
    if "evidence" in question:  # FinanceBench: by its text, else by its (zero-based) page number
        found = []
        for item in question["evidence"]:
            key = _norm(item["text"])[:60]
            hits = [i for i, s in enumerate(segments) if key and key in _norm(s.text)]
            found += hits[:1] or [i for i, s in enumerate(segments) if s.page == item["page0"] + 1][:1]
        return [(i, None) for i in dict.fromkeys(found)]
    if "file" in question:
        i = next(i for i, s in enumerate(segments) if s.path == question["file"])
        anchor = question.get("anchor")
        return [(i, segments[i].text.index(anchor) if anchor and anchor in segments[i].text else None)]
    pages = question.get("pages") or [question["page"]]
    return [(i, None) for i, s in enumerate(segments) if s.page in pages]


def covered(evidence: tuple[int, int | None], ranges: list[tuple[int, int, int]]) -> bool:
    """Whether (segment, offset) lies in one of the (segment, char_start, char_end) ranges."""
    segment, offset = evidence
    return any(s == segment and (offset is None or a <= offset < b) for s, a, b in ranges)


def first_rank(evidence, ranked_ranges) -> int | None:
    for k, ranges in enumerate(ranked_ranges, 1):
        if any(covered(e, [ranges]) for e in evidence):
            return k
    return None


def windows(document):
    from engine.evidence.text_index import TextIndex, split_spans

    chunks = [(i, a, b) for i, s in enumerate(document.segments) for a, b in split_spans(s.text, WINDOW_CHARS)]
    index = TextIndex.build([f"{document.segments[i].label}\n{document.segments[i].text[a:b]}" for i, a, b in chunks])
    return chunks, index


def run_set(name: str, before, tokenizer, layout, settings, doc_key: str) -> list[dict]:
    from engine.evidence.reading_budget import reading_budget
    from engine.evidence.select import Turn, select
    from engine.prompt import encode_document
    from engine.evidence.spans import DocumentSpans

    spec = json.loads((QUESTIONS / f"{name}.json").read_text())
    by_document: dict[str, list[dict]] = {}
    for question in spec["questions"]:
        path = f"{spec['document_folder']}/{question['doc']}.pdf" if "doc" in question else spec["document"]
        by_document.setdefault(path, []).append(question)
    recall = settings.recall
    room = 8192 - 512 - settings.max_new_tokens  # SmolLM2's positions, as engine.generate.recall_budget
    budget = min(recall.recall_tokens, room)
    rows = []
    for path, questions in by_document.items():
        document = load(common.corpus_dir() / path, doc_key)
        encoding = encode_document(tokenizer, layout, document)
        args = (encoding.token_chars, encoding.head_tokens, encoding.text_tokens, len(encoding.ids))
        began = time.perf_counter()
        spans = DocumentSpans.build(document, *args, None)
        build_s = time.perf_counter() - began
        old = before.build(document, *args)
        chunks, window_index = windows(document)
        history: list[Turn] = []
        for question in questions:
            evidence = evidence_of(document, question)
            follow = bool(question.get("follow_up"))
            t0 = time.perf_counter()
            selection = select(spans, question["q"], budget_tokens=budget, max_spans=recall.max_spans,
                               history=history if follow else (), reading=reading_budget(None))
            select_s = time.perf_counter() - t0
            history = [*history, Turn(question["q"], selection.chosen_index)] if follow else [Turn(question["q"], selection.chosen_index)]
            ranges = [(s.segment, s.char_start, s.char_end) for s in selection.chosen]
            ranked = [(spans.spans[c.span].segment, spans.spans[c.span].char_start, spans.spans[c.span].char_end)
                      for c in selection.ranked]
            old_chosen = old.choose(question["q"])
            old_ranges = [(s.segment, s.char_start, s.char_end) for s in old_chosen]
            hits = window_index.search(question["q"], 50)
            window_ranges = [chunks[h.span] for h in hits]
            arms = {
                "halaman": (ranges, ranked, sum(s.tokens for s in selection.chosen),
                            "; ".join(f"{document.segments[s.segment].label}:{c.signal}" for s, c in zip(selection.chosen, selection.reasons()))),
                "before": (old_ranges, old.ranked(question["q"]), sum(s.tokens for s in old_chosen),
                           "; ".join(document.segments[s.segment].label for s in old_chosen)),
                "bm25-1": (window_ranges[:1], window_ranges, None, "; ".join(document.segments[r[0]].label for r in window_ranges[:1])),
                "bm25-2": (window_ranges[:2], window_ranges, None, "; ".join(document.segments[r[0]].label for r in window_ranges[:2])),
            }
            for arm, (chosen, ranking, tokens, labels) in arms.items():
                units = len({segment for segment, _, _ in chosen})
                rows.append({
                    "set": name, "arm": arm, "document": path.rsplit("/", 1)[-1], "q": question["q"],
                    "kind": question.get("kind") or question.get("type", ""),
                    "evidence": "; ".join(document.segments[i].label for i, _ in evidence),
                    "found_any": any(covered(e, chosen) for e in evidence),
                    "found_all": all(covered(e, chosen) for e in evidence),
                    "rank": first_rank(evidence, ranking), "tokens": tokens, "units_read": units, "chosen": labels,
                    "select_s": select_s if arm == "halaman" else None,
                    "index_build_s": build_s if arm == "halaman" else None, "document_tokens": len(encoding.ids),
                })
            r = rows[-4]
            print(f"[{name}] {'HIT ' if r['found_any'] else 'miss'} before={'hit' if rows[-3]['found_any'] else '-'} "
                  f"{question['q'][:64]!r} ev={r['evidence'][:24]} chosen={r['chosen'][:90]} {select_s * 1000:.0f} ms", flush=True)
        spans.close()
        old.close()
        window_index.close()
    return rows


def _path_at(rev: str, *paths: str) -> str:
    """The first of `paths` that exists at commit `rev`."""
    for path in paths:
        if subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=common.REPO, capture_output=True).returncode == 0:
            return path
    raise FileNotFoundError(f"none of {paths} at {rev}")


class Before:
    """The selection of an older commit: its spans.py and text_index.py side by side with today's."""

    def __init__(self, rev: str, budget_tokens: int = 1024, max_spans: int = 2) -> None:
        # both modules lived in engine/ before they moved into engine/evidence/
        index_path = _path_at(rev, "engine/evidence/text_index.py", "engine/text_index.py")
        spans_path = _path_at(rev, "engine/evidence/spans.py", "engine/spans.py")
        name = index_path.removesuffix(".py").replace("/", ".")
        current = sys.modules.get(name)
        sys.modules[name] = common.module_at(rev, index_path)  # what the old spans.py imports
        try:
            self.module = common.module_at(rev, spans_path)
        finally:
            if current is None:
                del sys.modules[name]
            else:
                sys.modules[name] = current
        self.budget_tokens, self.max_spans = budget_tokens, max_spans

    def build(self, document, token_chars, head_tokens, text_tokens, n_tokens):
        return _OldSpans(self, self.module.DocumentSpans.build(document, token_chars, head_tokens, text_tokens, n_tokens, None))


class _OldSpans:
    def __init__(self, before: Before, spans) -> None:
        self.before, self.spans = before, spans

    def choose(self, question: str):
        hits = self.spans.candidates(question)
        return self.spans.choose(hits, self.before.budget_tokens, self.before.max_spans) if hits else []

    def ranked(self, question: str):
        return [(self.spans.spans[h.span].segment, self.spans.spans[h.span].char_start, self.spans.spans[h.span].char_end)
                for h in self.spans.candidates(question, 50)]

    def close(self) -> None:
        self.spans.close()


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for name, arm in dict.fromkeys((r["set"], r["arm"]) for r in rows):
        cell = [r for r in rows if r["set"] == name and r["arm"] == arm]
        tokens = [r["tokens"] for r in cell if r["tokens"] is not None]
        times = [r["select_s"] for r in cell if r["select_s"] is not None]
        out.append({"set": name, "arm": arm, "questions": len(cell),
                    "found_any": sum(r["found_any"] for r in cell), "found_all": sum(r["found_all"] for r in cell),
                    "share_any": round(sum(r["found_any"] for r in cell) / len(cell), 3),
                    "rank_1": sum(r["rank"] == 1 for r in cell),
                    "median_tokens": common.median(tokens) if tokens else None,
                    "mean_units_read": round(sum(r["units_read"] for r in cell) / len(cell), 2),
                    "median_select_ms": round(1000 * common.median(times), 1) if times else None,
                    "max_select_ms": round(1000 * max(times), 1) if times else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help=f"question set (default: all of {', '.join(SETS)})")
    parser.add_argument("--before", default="cb17472", help="the commit whose selection is the 'before' arm")
    parser.add_argument("--name", default="evidence")
    common.selection_flags(parser)
    args = parser.parse_args()
    common.setup(1)
    limits = common.apply_selection_flags(args)

    from transformers import AutoTokenizer

    from engine.models.gguf_convert import converted_folder
    from engine.models.source import default_gguf_path
    from engine.prompt import chat_layout
    from engine.settings import EngineSettings

    tokenizer = AutoTokenizer.from_pretrained(converted_folder(default_gguf_path()))
    layout = chat_layout(tokenizer)
    settings = EngineSettings()
    before = Before(args.before)
    doc_key = documents_code_key()
    rows = []
    for name in args.sets or SETS:
        rows += run_set(name, before, tokenizer, layout, settings, doc_key)
    meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "before": args.before, "recall_tokens": settings.recall.recall_tokens, "max_spans": settings.recall.max_spans,
            **limits}
    columns = ["set", "arm", "document", "kind", "q", "evidence", "found_any", "found_all", "rank", "tokens", "units_read", "chosen",
               "select_s", "index_build_s", "document_tokens"]
    common.write_results(args.name, rows, columns, meta)
    table = summary(rows)
    common.write_results(f"{args.name}_summary", table, list(table[0]), meta)


if __name__ == "__main__":
    main()
