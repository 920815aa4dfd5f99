"""Which saved answers name things their document does not contain (`engine.grounding`), by arm
and by hit: the check run over the answers `bench/doc_qa.py` already wrote, no model needed.

    python bench/grounding.py [--results doc_qa_evidence] [--name grounding]

Reads docs/bench/<results>.json (rows with set, arm, q, answer, hit) and the documents of their
question sets (docs/bench/questions/*.json, from the test corpus: $HALAMAN_CORPUS). Writes
docs/bench/<name>.json|csv (every answer the check marks, with the names it found nowhere in the
document) and docs/bench/<name>_summary.json|csv (per set and arm: answers, hits, answers marked,
marked among hits and among misses). A hit is doc_qa's: an accepted string in the answer, so a
"hit" may still state invented details beside the accepted one; the marked rows show which.
"""

from __future__ import annotations

import argparse
import json
import time

import common

QUESTIONS = common.DOCS / "bench" / "questions"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="doc_qa_evidence", help="a docs/bench/<name>.json of bench/doc_qa.py")
    parser.add_argument("--name", default="grounding")
    args = parser.parse_args()

    from engine.documents import load_document
    from engine.grounding import DocumentWords

    rows = json.loads((common.OUT / f"{args.results}.json").read_text())["rows"]
    words: dict[str, DocumentWords] = {}
    marked, cells = [], {}
    for row in rows:
        name = row["set"]
        if name not in words:
            spec = json.loads((QUESTIONS / f"{name}.json").read_text())
            words[name] = DocumentWords(load_document(common.corpus_dir() / spec["document"]).render())
        missing = words[name].unsupported(row["answer"], row["q"])
        cell = cells.setdefault((name, row["arm"]), {"set": name, "arm": row["arm"], "answers": 0, "hits": 0,
                                                     "marked": 0, "marked_hits": 0, "marked_misses": 0})
        cell["answers"] += 1
        cell["hits"] += bool(row["hit"])
        if missing:
            cell["marked"] += 1
            cell["marked_hits" if row["hit"] else "marked_misses"] += 1
            marked.append({"set": name, "arm": row["arm"], "hit": row["hit"], "q": row["q"],
                           "answer": " ".join(row["answer"].split())[:200], "not_in_document": "; ".join(missing)})
    meta = {"results": args.results, "when": time.strftime("%Y-%m-%d %H:%M"), **common.machine_info()}
    common.write_results(args.name, marked, ["set", "arm", "hit", "not_in_document", "answer"], meta)
    common.write_results(f"{args.name}_summary", list(cells.values()),
                         ["set", "arm", "answers", "hits", "marked", "marked_hits", "marked_misses"], meta)


if __name__ == "__main__":
    main()
