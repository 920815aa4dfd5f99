"""How often the window's marks under an answer fall on wrong answers and on right ones: the
caution that the answer's number is not in the passages it attended most
(`engine.evidence_quotes.number_caution`) and the note that it names things the document does not
contain (`engine.grounding`, `Answer.unsupported`).

    python bench/answer_marks.py [--set P16-dev --set financebench-dev] [--limit N] [--threads 1]
    python bench/answer_marks.py --summary-only     # recount the saved answers: judged file, caution rule

Each document is opened index first, as the window opens a new one (nothing read whole; each
question re-reads the pages it chooses), with the app's default settings and model; a question
marked `follow_up` continues the previous one. Right or wrong: P16-dev by its accepted strings
(bench/doc_qa.py's rule); financebench-dev has analysts' free-text answers, so each answer was
judged by hand against the analyst's answer and the judgement kept in
docs/bench/answer_marks_judged.json ({question: true|false}); a question not judged there counts
as unjudged, never as right or wrong.

Writes docs/bench/answer_marks.json|csv (every answer: its text, right, the marks, the quoted
passages) and docs/bench/answer_marks_summary.json|csv (per set: wrong answers marked, right
answers marked).
"""

from __future__ import annotations

import argparse
import json
import os

import common
import doc_qa

QUESTIONS = common.DOCS / "bench" / "questions"
JUDGED = common.OUT / "answer_marks_judged.json"


def marks_of(answer, question: str) -> dict:
    """The window's marks for `answer` (an `engine.answer.Answer`) to `question`."""
    from engine.evidence_quotes import number_caution, quoted_passages

    quoted = quoted_passages(answer.passages)
    caution = number_caution(answer.text, question, quoted)
    return {"caution": caution or "", "unsupported": "; ".join(answer.unsupported),
            "marked": bool(caution or answer.unsupported),
            "quoted": " | ".join(f"{p.label}: {p.text}" for p in quoted)}


def documents_of(spec: dict) -> list[tuple[str, list[dict]]]:
    """(corpus-relative path, its questions in order) for a question set."""
    if "document_folder" not in spec:
        return [(spec["document"], spec["questions"])]
    grouped: dict[str, list[dict]] = {}
    for question in spec["questions"]:
        grouped.setdefault(f"{spec['document_folder']}/{question['doc']}.pdf", []).append(question)
    return list(grouped.items())


def run_set(name: str, model, settings, limit: int | None) -> list[dict]:
    from engine.documents import load_document
    from engine.session import DocumentSession

    spec = json.loads((QUESTIONS / f"{name}.json").read_text())
    rows, asked = [], 0
    for path, questions in documents_of(spec):
        if limit is not None and asked >= limit:
            break
        document = load_document(common.corpus_dir() / path)
        session = DocumentSession(model, settings, None)
        session.open(document, read_now=False)
        previous = None
        for question in questions[: None if limit is None else limit - asked]:
            follow = bool(question.get("follow_up")) and previous is not None
            answer = session.ask(question["q"], follow_up=follow)
            right = doc_qa.hit(answer.text, question) if "accept" in question else None
            rows.append({"set": name, "document": path.rsplit("/", 1)[-1], "q": question["q"],
                         "answer": answer.text.strip(), "right": right, **marks_of(answer, question["q"])})
            print(f"[{name}] {'marked' if rows[-1]['marked'] else '      '} right={right} "
                  f"{question['q'][:50]!r} -> {answer.text.strip()[:70]!r}", flush=True)
            previous, asked = question, asked + 1
        session.close()
    return rows


def recount_cautions(rows: list[dict]) -> None:
    """The number caution of saved answers again, from their quoted passages (the same cut text
    the window compares), after a change of the rule."""
    from engine.evidence_quotes import QuotedPassage, number_caution

    for row in rows:
        quoted = [QuotedPassage(*part.split(": ", 1), 0.0) for part in row["quoted"].split(" | ") if ": " in part]
        row["caution"] = number_caution(row["answer"], row["q"], quoted) or ""
        row["marked"] = bool(row["caution"] or row["unsupported"])


def apply_judged(rows: list[dict]) -> None:
    """Fill `right` of hand-judged answers (docs/bench/answer_marks_judged.json) where no accepted
    strings decide it."""
    judged = json.loads(JUDGED.read_text()) if JUDGED.exists() else {}
    for row in rows:
        if row["right"] is None and row["q"] in judged:
            row["right"] = bool(judged[row["q"]])


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["set"] for r in rows):
        mine = [r for r in rows if r["set"] == name]
        wrong = [r for r in mine if r["right"] is False]
        right = [r for r in mine if r["right"] is True]
        out.append({"set": name, "answers": len(mine), "unjudged": sum(r["right"] is None for r in mine),
                    "wrong": len(wrong), "wrong_marked": sum(r["marked"] for r in wrong),
                    "right": len(right), "right_marked": sum(r["marked"] for r in right)})
    return out


COLUMNS = ["set", "document", "q", "answer", "right", "marked", "caution", "unsupported", "quoted"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help="question set (docs/bench/questions)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--summary-only", action="store_true", help="recount docs/bench/answer_marks.json")
    args = parser.parse_args()
    if args.summary_only:
        saved = json.loads((common.OUT / "answer_marks.json").read_text())
        rows, meta = saved["rows"], saved["meta"]
        recount_cautions(rows)
    else:
        common.setup(args.threads)
        from engine.models.loader import load_model
        from engine.settings import EngineSettings

        settings = EngineSettings(threads=args.threads)
        model = load_model(settings.model, device=settings.device, weights=settings.weights)
        rows = []
        for name in args.sets or ["P16-dev", "financebench-dev"]:
            rows += run_set(name, model, settings, args.limit)
        meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                "model": model.label, "weights": model.weights_label, "opened": "index first (read_now=False)"}
    apply_judged(rows)
    common.write_results("answer_marks", rows, COLUMNS, meta)
    table = summary(rows)
    common.write_results("answer_marks_summary", table, list(table[0]), meta)


if __name__ == "__main__":
    main()
