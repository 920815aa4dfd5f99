"""Whole-document answers: the engine over the whole document against the same model given only
the part that answers (its ceiling) and against chunk retrieval (what desktop peers do).

    python bench/doc_qa.py --set P16-dev --set requests-dev [--arms whole oracle lexical union]

Question sets (docs/bench/questions/*.json, copied from the test corpus): each question names the
page(s) or file that state its answer and the strings accepted as a hit; a hit is an accepted string
in the answer as a whole word, case-insensitive ("10" does not match "1024"); with `groups`, one of
each group. A `follow_up` question continues the previous answer in every arm (the oracle and
lexical arms ask the previous question first in their own context, then the follow-up).

arms, on the same questions in one run, all with the app's default settings and model:
  whole    the engine over the whole document (a prefix-cache hit after the first read; the read is
           not timed here: bench/speed.py times reads)
  union    as whole, but the recalled spans are attended beside the whole snapshot (focus off)
  blocks   as whole, with block recall (the per-layer attention selection; slow at book length)
  off      as whole, recall off (the snapshot alone): the decode speed recall is compared with
  unread   index first: the document is not read; each question re-reads the spans it chooses from
           their token ids (what a question asked before the whole read ends gets)
  oracle   only the segment that states the answer: the page, or 3,000 characters around the
           question's `anchor` in the file
  lexical  only the top BM25 chunk of ~3,000 characters (chunks cut within pages / files), as
           GPT4All LocalDocs, AnythingLLM and Open WebUI feed their model
Per question: hit, the answer, the spans recalled and whether the answer's segment is among them,
the answer segment's rank in the sources, TTFT, decode tokens/s, recall seconds.
Results: docs/bench/doc_qa.json|csv (rows), docs/bench/doc_qa_summary.csv; tables printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import common

QUESTIONS = common.DOCS / "bench" / "questions"
WHOLE_ARMS = ("whole", "union", "blocks", "off", "unread")
ORACLE_CHARS = 3000
LEXICAL_CHARS = 3000


def hit(answer: str, question: dict) -> bool:
    """Whether one accepted string of every group (`groups`, else `accept` as one group) occurs in
    `answer` as a whole word (case-insensitive)."""
    groups = question.get("groups") or [question["accept"]]
    return all(any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", answer, flags=re.IGNORECASE) for a in group)
               for group in groups)


def answer_segments(document, question: dict) -> list[int]:
    """Indices of the segments that state the answer (the question's pages, or its file)."""
    pages = question.get("pages") or ([question["page"]] if "page" in question else [])
    found = [i for i, s in enumerate(document.segments)
             if (s.page is not None and s.page in pages) or ("file" in question and s.path == question["file"])]
    if not found:
        raise ValueError(f"no segment for {question}")
    return found


def answer_segment(document, question: dict) -> int:
    """Index of the first segment that states the answer."""
    return answer_segments(document, question)[0]


def part_document(document, segment, text: str, label: str | None = None):
    from engine.documents import Document, Segment

    return Document(title=document.title, source=document.source, kind=document.kind, pages=document.pages,
                    segments=[Segment(text=text, label=label or segment.label, page=segment.page, path=segment.path)])


def oracle_document(document, question: dict, previous: dict | None = None):
    """Only what states the answer: its pages in order (and the previous question's, for a
    follow-up), or ORACLE_CHARS of its file around its anchor."""
    from engine.documents import Document

    asked = [q for q in (previous, question) if q is not None]
    indices = sorted({i for q in asked for i in answer_segments(document, q)})
    segments = []
    for i in indices:
        segment = document.segments[i]
        text = segment.text
        anchors = [q["anchor"] for q in asked if q.get("anchor") and q.get("file") == segment.path and q["anchor"] in text]
        if anchors and len(text) > ORACLE_CHARS:
            middle = text.index(anchors[-1])
            start = max(0, middle - ORACLE_CHARS // 2)
            text = text[start:start + ORACLE_CHARS]
        segments.append(part_document(document, segment, text).segments[0])
    return Document(title=document.title, source=document.source, kind=document.kind, pages=document.pages, segments=segments)


def lexical_document(document, question: dict):
    """The best BM25 chunk of about LEXICAL_CHARS characters (chunks never cross a segment)."""
    from engine.evidence.text_index import rank, split_spans

    chunks = [(segment, segment.text[a:b]) for segment in document.segments
              for a, b in split_spans(segment.text, LEXICAL_CHARS)]
    scores = rank([f"{s.label}\n{text}" for s, text in chunks], question["q"])
    best = max(range(len(chunks)), key=scores.__getitem__)
    segment, text = chunks[best]
    return part_document(document, segment, text), segment


def arm_settings(base, arm: str):
    if arm == "union":
        return base.replace(recall=base.recall.replace(focus=False))
    if arm == "blocks":
        return base.replace(recall=base.recall.replace(selection="blocks"))
    if arm == "off":
        return base.replace(recall=base.recall.replace(recall_tokens=0))
    return base


def ask_row(session, question: dict, arm: str, answer_labels: list[str], max_new_tokens: int | None,
            follow_up: bool = False) -> dict:
    began = time.perf_counter()
    answer = session.ask(question["q"], max_new_tokens=max_new_tokens, follow_up=follow_up)
    stats = answer.recall
    sources = [s.label for s in answer.sources]
    spans = list(stats.spans) if stats else []
    answer_label = answer_labels[0]
    return {
        "arm": arm, "kind": question.get("kind", ""), "q": question["q"], "hit": hit(answer.text, question),
        "answer": answer.text.strip(), "answer_segment": "; ".join(answer_labels),
        "recalled": all(label in {s.split(" (characters")[0] for s in spans} for label in answer_labels) if spans else None,
        "spans": "; ".join(spans), "source_rank": sources.index(answer_label) + 1 if answer_label in sources else None,
        "sources": "; ".join(sources), "signals": "; ".join(stats.signals) if stats else "",
        "ttft_s": answer.time_to_first_token_s,
        "decode_tokens_per_s": answer.decode_tokens_per_s, "recall_s": stats.question_s if stats else 0.0,
        "answer_tokens": len(answer.token_ids), "seconds": time.perf_counter() - began,
    }


def run_set(name: str, arms: list[str], workspace_settings, store, model, limit: int | None, max_new_tokens) -> list[dict]:
    from engine.documents import load_document
    from engine.session import DocumentSession

    spec = json.loads((QUESTIONS / f"{name}.json").read_text())
    document = load_document(common.corpus_dir() / spec["document"])
    questions = spec["questions"][:limit]
    rows = []
    for arm in arms:
        if arm in WHOLE_ARMS:
            # unread: no prefix store, so no saved reading is found and none is written
            session = DocumentSession(model, arm_settings(workspace_settings, arm), None if arm == "unread" else store)
            report = session.open(document, read_now=arm != "unread")
            print(f"[{name}/{arm}] {report.document_tokens:,} tokens, prefix hit {report.prefix_hit}, "
                  f"open {report.seconds:.1f} s", flush=True)
        previous = None
        for question in questions:
            labels = [document.segments[i].label for i in answer_segments(document, question)]
            follow = bool(question.get("follow_up")) and previous is not None
            if arm in ("oracle", "lexical"):
                if arm == "oracle":
                    part, chosen = oracle_document(document, question, previous if follow else None), None
                else:
                    part, chosen = lexical_document(document, question)
                session = DocumentSession(model, workspace_settings, None)
                session.open(part)
                if follow:  # the conversation so far, in this arm's own context
                    session.ask(previous["q"], max_new_tokens=max_new_tokens)
            row = ask_row(session, question, arm, labels, max_new_tokens, follow_up=follow)
            previous = question
            if arm == "lexical":
                row["spans"], row["recalled"] = chosen.label, chosen.label in labels
            row["set"] = name
            rows.append(row)
            print(f"[{name}/{arm}] {'HIT ' if row['hit'] else 'miss'} {question['q'][:60]!r} -> {row['answer'][:70]!r} "
                  f"spans={row['spans'][:40]!r} rank={row['source_rank']} ttft={row['ttft_s']:.2f}s "
                  f"{row['decode_tokens_per_s']:.1f} tok/s", flush=True)
            if arm in ("oracle", "lexical"):
                session.close()
        if arm in WHOLE_ARMS:
            session.close()
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for (name, arm) in dict.fromkeys((r["set"], r["arm"]) for r in rows):
        cell = [r for r in rows if r["set"] == name and r["arm"] == arm]
        recalled = [r["recalled"] for r in cell if r["recalled"] is not None]
        out.append({
            "set": name, "arm": arm, "questions": len(cell), "hits": sum(r["hit"] for r in cell),
            "answer_segment_chosen": sum(recalled) if recalled else None,
            "first_in_sources": sum(r["source_rank"] == 1 for r in cell),
            "median_ttft_s": common.median([r["ttft_s"] for r in cell]),
            "median_decode_tokens_per_s": common.median([r["decode_tokens_per_s"] for r in cell]),
            "median_recall_s": common.median([r["recall_s"] for r in cell]),
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help="question set name (docs/bench/questions)")
    parser.add_argument("--arms", nargs="+", default=["whole", "oracle", "lexical"])
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the app's setting")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="doc_qa")
    parser.add_argument("--weights", default="auto", help="auto (the app's), int4, full, 4bit")
    common.selection_flags(parser)
    args = parser.parse_args()
    common.setup(args.threads)
    limits = common.apply_selection_flags(args)

    from engine.models.loader import load_model
    from engine.prefix_store import PrefixStore
    from engine.settings import EngineSettings
    from engine.workspace import prefix_store_dir

    settings = EngineSettings(threads=args.threads, weights=args.weights)
    model = load_model(settings.model, device=settings.device, weights=settings.weights)
    store = PrefixStore(prefix_store_dir(), disk_budget_bytes=settings.prefix_cache_disk_bytes)
    rows = []
    for name in args.sets or ["P16-dev", "requests-dev"]:
        rows += run_set(name, args.arms, settings, store, model, args.limit, args.max_new_tokens)
    meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "model": model.label, "weights": model.weights_label, "settings": "app defaults", **limits}
    columns = ["set", "arm", "kind", "q", "hit", "answer", "answer_segment", "spans", "signals", "recalled", "source_rank",
               "sources", "ttft_s", "decode_tokens_per_s", "recall_s", "answer_tokens"]
    common.write_results(args.name, rows, columns, meta)
    common.write_results(f"{args.name}_summary", summary(rows), list(summary(rows)[0]), meta)


if __name__ == "__main__":
    main()
