"""How often the window's marks under an answer fall on wrong answers and on right ones
(`engine.answer_marks`): each mark names the answer's sentence it doubts, and is either on the
*direct answer* (the first sentence, the list it introduces, the sentence stating the asked figure,
a closing "So, ...") or a note on a side remark. The marks: the direct answer's figures missing
from the two passages it attended most (`engine.evidence_quotes.number_caution`'s rule), names found
nowhere in the document (`engine.grounding`, `Answer.unsupported`) on their sentence, and a yes/no
the quoted passages contradict (`engine.evidence.yes_no`).

    python bench/answer_marks.py [--set P16-dev --set financebench-dev] [--limit N] [--threads 1]
    python bench/answer_marks.py --summary-only     # recount the saved answers: judged file, mark rules

Each document is opened index first, as the window opens a new one (nothing read whole; each
question re-reads the pages it chooses), with the app's default settings and model; a question
marked `follow_up` continues the previous one. Right or wrong: P16-dev and window-trial by their
accepted strings (bench/doc_qa.py's rule); financebench-dev has analysts' free-text answers, so
each answer was judged by hand against the analyst's answer, counting the direct answer, and the
judgement kept in docs/bench/answer_marks_judged.json ({question: true|false}); a question not
judged there counts as unjudged, never as right or wrong.

The marks compare the quoted passages as the window has them (cut at
`engine.evidence_quotes.QUOTE_CHARACTERS`); `yes_no_whole` is the yes/no check on the same two
passages' whole text (kept as `evidence`), which the window does not have: it is reported, not
counted.

Writes docs/bench/answer_marks.json|csv (every answer: its text, right, the marks, the quoted
passages) and docs/bench/answer_marks_summary.json|csv (per set and both: wrong answers with a mark
on the direct answer and with any mark, right answers likewise).
"""

from __future__ import annotations

import argparse
import json
import os

import common
import doc_qa

QUESTIONS = common.DOCS / "bench" / "questions"
JUDGED = common.OUT / "answer_marks_judged.json"
EVIDENCE_CHARACTERS = 6000
"""The whole text of a quoted passage is kept up to this many characters (a balance sheet's page)."""


def marks_of(answer, question: str, document) -> dict:
    """The saved form of `answer` (an `engine.answer.Answer`) to `question`: the quoted passages as
    the window shows them, the whole text of the same passages (`evidence`), the names found
    nowhere in `document`; `mark_row` adds the marks."""
    from engine.evidence_quotes import quoted_passages

    quoted = quoted_passages(answer.passages)
    strongest = sorted((p for p in answer.passages if p.quote), key=lambda p: -p.share)[: len(quoted)]
    return {"unsupported": "; ".join(answer.unsupported),
            "quoted": " | ".join(f"{p.label}: {p.text}" for p in quoted),
            "evidence": [p.text(document)[:EVIDENCE_CHARACTERS] for p in strongest]}


def mark_row(row: dict) -> None:
    """Fill `row`'s marks (`direct_marked`, `marked`, `marks`: the notes, direct ones first) from
    its saved answer, quoted passages and unsupported names, and `yes_no_whole` from `evidence`."""
    from engine.answer_marks import answer_marks
    from engine.evidence.yes_no import contradiction
    from engine.evidence_quotes import QuotedPassage

    quoted = [QuotedPassage(*part.split(": ", 1), 0.0) for part in row["quoted"].split(" | ") if ": " in part]
    unsupported = [name for name in row["unsupported"].split("; ") if name]
    marks = answer_marks(row["answer"], row["q"], quoted, unsupported)
    row["direct_marked"] = any(m.direct for m in marks)
    row["marked"] = bool(marks)
    row["marks"] = " || ".join(("[answer] " if m.direct else "[side] ") + m.note for m in marks)
    whole = contradiction(row["q"], row["answer"], list(zip([q.label for q in quoted], row.get("evidence", []))))
    row["yes_no_whole"] = whole.note() if whole is not None else ""
    row.pop("caution", None)


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
                         "answer": answer.text.strip(), "right": right, **marks_of(answer, question["q"], document)})
            mark_row(rows[-1])
            print(f"[{name}] {'marked' if rows[-1]['marked'] else '      '} right={right} "
                  f"{question['q'][:50]!r} -> {answer.text.strip()[:70]!r}", flush=True)
            previous, asked = question, asked + 1
        session.close()
    return rows


def apply_judged(rows: list[dict]) -> None:
    """Fill `right` of hand-judged answers (docs/bench/answer_marks_judged.json) where no accepted
    strings decide it."""
    judged = json.loads(JUDGED.read_text()) if JUDGED.exists() else {}
    for row in rows:
        if row["right"] is None and row["q"] in judged:
            row["right"] = bool(judged[row["q"]])


def summary(rows: list[dict]) -> list[dict]:
    """Per set, then both sets together: answers, unjudged, wrong and right answers, and how many
    of each carry a mark on the direct answer (`*_marked`) and any mark (`*_any_mark`)."""
    out = []
    names = list(dict.fromkeys(r["set"] for r in rows))
    for name in [*names, "all"]:
        mine = [r for r in rows if name in (r["set"], "all")]
        wrong = [r for r in mine if r["right"] is False]
        right = [r for r in mine if r["right"] is True]
        out.append({"set": name, "answers": len(mine), "unjudged": sum(r["right"] is None for r in mine),
                    "wrong": len(wrong), "wrong_marked": sum(r["direct_marked"] for r in wrong),
                    "wrong_any_mark": sum(r["marked"] for r in wrong),
                    "right": len(right), "right_marked": sum(r["direct_marked"] for r in right),
                    "right_any_mark": sum(r["marked"] for r in right)})
    return out


COLUMNS = ["set", "document", "q", "answer", "right", "direct_marked", "marked", "marks", "unsupported",
           "yes_no_whole", "quoted"]


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
        for row in rows:
            mark_row(row)
    else:
        common.setup(args.threads)
        import engine.answer_marks  # noqa: F401  (imported before the long run: the rules measured are those at its start)
        from engine.models.loader import load_model
        from engine.settings import EngineSettings

        settings = EngineSettings(threads=args.threads)
        model = load_model(settings.model, device=settings.device, weights=settings.weights)
        rows = []
        for name in args.sets or ["P16-dev", "financebench-dev", "window-trial"]:
            rows += run_set(name, model, settings, args.limit)
        meta = {**common.machine_info(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                "model": model.label, "weights": model.weights_label, "opened": "index first (read_now=False)"}
    apply_judged(rows)
    common.write_results("answer_marks", rows, COLUMNS, meta)
    table = summary(rows)
    common.write_results("answer_marks_summary", table, list(table[0]), meta)


if __name__ == "__main__":
    main()
