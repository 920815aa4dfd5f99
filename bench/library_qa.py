"""Asking the library against asking the question's own document, side by side.

    python bench/library_qa.py [--answers] [--limit N]
    python bench/library_qa.py --archives

The library: the 19 filings of financebench-dev, P16 (the 288-page book), the requests 2.34.2
repository, and every other corpus PDF that opens without a password (the bug-report PDFs), each
opened index first as `halaman ask --library` opens them (`engine.open_library.OpenLibrary.add`; no
document is read whole, so every answer re-reads its spans). Questions: financebench-dev, P16-dev
and requests-dev (docs/bench/questions). Arms:
  library  the question asked of the whole library
  own      the same question asked of its own document alone (the same code with one document,
           which gives a single document's selection: tests/test_library_ask.py)
Per question and arm: the documents read, whether its own document is read first, whether the
evidence (bench/evidence.py's `evidence_of`) is among the recalled spans, the tokens recalled.
With --answers (P16-dev and requests-dev, which have accepted answers): the answer's hit
(bench/doc_qa.py's `hit`), TTFT, decode tokens/s, archive bytes read. Results:
docs/bench/library_qa.{json,csv}, docs/bench/library_qa_summary.{json,csv}.

--archives: the time to the first answer when the documents a question picks were read whole. The
five short filings with questions (four 8-Ks and an earnings release) are read whole into a prefix
store in bench/.work (once; kept between runs), the other documents of the same library stay
unread, and their 10 financebench-dev questions are asked of the whole library twice each: TTFT,
decode tokens/s, archive bytes read, whether anything was re-read. Results:
docs/bench/library_qa_archives.{json,csv}.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import common
from doc_qa import hit
from evidence import QUESTIONS, covered, documents_code_key, evidence_of, load

SETS = ("financebench-dev", "P16-dev", "requests-dev")
ANSWER_SETS = ("P16-dev", "requests-dev")
READ_WHOLE = ("AMCOR_2022_8K_dated-2022-07-01", "FOOTLOCKER_2022_8K_dated-2022-05-20",
              "JOHNSON_JOHNSON_2023_8K_dated-2023-08-30", "PEPSICO_2023_8K_dated-2023-05-05", "ULTABEAUTY_2023Q4_EARNINGS")


def library_paths() -> list:
    """Every document of the library: the sets' documents, then the other corpus PDFs."""
    corpus = common.corpus_dir()
    paths = sorted((corpus / "financebench-dev" / "pdfs").glob("*.pdf"))
    paths += [corpus / "pdf" / "P16_thinkpython2.pdf", corpus / "repos" / "requests-2.34.2"]
    paths += [p for p in sorted((corpus / "pdf").glob("P*.pdf")) if p.name != "P16_thinkpython2.pdf"]
    return paths


def questions() -> list[tuple[str, dict, str]]:
    """(set, question, its document's file or folder name), every question but follow-ups (a
    library question has no conversation yet)."""
    out = []
    for name in SETS:
        spec = json.loads((QUESTIONS / f"{name}.json").read_text())
        for q in spec["questions"]:
            if q.get("follow_up"):
                continue
            own = f"{q['doc']}.pdf" if "doc" in q else spec["document"].rsplit("/", 1)[-1]
            out.append((name, q, own))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", action="store_true", help="also answer P16-dev and requests-dev in both arms")
    parser.add_argument("--limit", type=int, help="questions per set (default all)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--archives", action="store_true", help="TTFT with the picked documents read whole (see above)")
    args = parser.parse_args()
    if args.archives:
        return archives(args)

    from engine.documents import load_document
    from engine.open_library import OpenLibrary
    from engine.settings import load_settings
    from engine.workspace import load_for

    settings = load_settings().replace(prefix_cache=False)
    model = load_for(settings)
    library = OpenLibrary(model, settings, None)
    doc_key = documents_code_key()
    names, open_s, skipped = [], [], []
    for path in library_paths():
        began = time.perf_counter()
        try:
            document = load(path, doc_key) if path.suffix == ".pdf" else load_document(path)
            library.add(document)
        except Exception as error:  # a bug-report PDF that needs a password, or has no text: not in the library
            skipped.append(f"{path.name}: {str(error)[:80]}")
            continue
        open_s.append(time.perf_counter() - began)
        names.append(path.name)
        print(f"opened {path.name} in {open_s[-1]:.1f} s", flush=True)
    by_name = {name: k for k, name in enumerate(names)}

    rows = []
    counts: dict[str, int] = {}
    for name, question, own_name in questions():
        counts[name] = counts.get(name, 0) + 1
        if args.limit and counts[name] > args.limit:
            continue
        own_index = by_name[own_name]
        session = library.documents[own_index]
        evidence = evidence_of(session.document, question)
        own = OpenLibrary(model, settings, None)
        own.documents = [session]
        for arm, asking in (("library", library), ("own", own)):
            began = time.perf_counter()
            picks = asking.choose(question["q"])
            choose_s = time.perf_counter() - began
            mine = [p for p in picks if asking.documents[p.document] is session]
            ranges = [(s.segment, s.char_start, s.char_end) for p in mine for s in p.selection.chosen]
            row = {
                "set": name, "arm": arm, "document": own_name, "q": question["q"],
                "read": "; ".join(p.title for p in picks), "own_first": bool(picks) and asking.documents[picks[0].document] is session,
                "evidence_found": any(covered(e, ranges) for e in evidence),
                "tokens": sum(s.tokens for p in picks for s in p.selection.chosen), "choose_s": round(choose_s, 4),
            }
            if args.answers and name in ANSWER_SETS:
                answered = asking.ask(question["q"], max_new_tokens=args.max_new_tokens)
                answer = answered.answer
                row.update(hit=hit(answer.text, question), answer=answer.text, ttft_s=round(answer.time_to_first_token_s, 2),
                           decode_tokens_per_s=round(answer.decode_tokens_per_s, 1), reread=answer.recall.reread,
                           bytes_read=answer.recall.bytes_read,
                           first_source=f"{answer.sources[0].document}, {answer.sources[0].label}" if answer.sources else "")
            rows.append(row)
            print(f"[{name}/{arm}] own_first={row['own_first']} evidence={row['evidence_found']} "
                  f"hit={row.get('hit', '-')} read={row['read'][:70]!r} q={question['q'][:50]!r}", flush=True)
        own.documents = []
    library.close()

    summary = []
    for name in SETS:
        for arm in ("library", "own"):
            part = [r for r in rows if r["set"] == name and r["arm"] == arm]
            if not part:
                continue
            answered = [r for r in part if "hit" in r]
            summary.append({
                "set": name, "arm": arm, "questions": len(part),
                "own_first": sum(r["own_first"] for r in part), "evidence_found": sum(r["evidence_found"] for r in part),
                "hits": sum(r["hit"] for r in answered) if answered else None,
                "median_ttft_s": common.median([r["ttft_s"] for r in answered]) if answered else None,
                "median_decode_tokens_per_s": common.median([r["decode_tokens_per_s"] for r in answered]) if answered else None,
                "median_choose_ms": round(1000 * common.median([r["choose_s"] for r in part]), 1),
            })
    meta = {"documents": len(names), "skipped": skipped, "median_open_s": round(common.median(open_s), 2),
            "total_open_s": round(sum(open_s), 1), "load_average": os.getloadavg(), "machine": common.machine_info()}
    common.write_results("library_qa", rows, ["set", "arm", "document", "own_first", "evidence_found", "tokens", "hit",
                                              "ttft_s", "decode_tokens_per_s", "reread", "first_source", "read", "q",
                                              "answer"], meta)
    common.write_results("library_qa_summary", summary, list(summary[0]), meta)
    print(meta["documents"], "documents;", "skipped:", skipped)


def archives(args) -> None:
    from engine.documents import load_document
    from engine.open_library import OpenLibrary
    from engine.prefix_store import PrefixStore
    from engine.session import DocumentSession
    from engine.settings import load_settings
    from engine.workspace import load_for

    settings = load_settings()
    model = load_for(settings)
    store = PrefixStore(common.WORK / "library-store", disk_budget_bytes=8 * 1024**3)
    doc_key = documents_code_key()
    corpus = common.corpus_dir() / "financebench-dev" / "pdfs"
    read_rows = []
    for name in READ_WHOLE:
        reader = DocumentSession(model, settings, store)
        report = reader.open(load(corpus / f"{name}.pdf", doc_key))  # read whole, or its saved reading
        read_rows.append({"document": name, "tokens": report.document_tokens, "hit": report.prefix_hit,
                          "read_s": round(report.prefill_seconds, 1), "archive": reader.opened.archive is not None})
        print(read_rows[-1], flush=True)
        reader.close()
    library = OpenLibrary(model, settings, store)
    for path in library_paths():
        try:
            library.add(load(path, doc_key) if path.suffix == ".pdf" else load_document(path))
        except Exception as error:  # the password / no-text bug-report PDFs, as above
            print(f"skipped {path.name}: {str(error)[:60]}")
    began = time.perf_counter()
    library.prepare()  # as `halaman ask --library` does before its first question
    index_s = time.perf_counter() - began
    asked = [(q, own) for name, q, own in questions() if name == "financebench-dev" and own[:-4] in READ_WHOLE]
    rows = []
    for run in (1, 2):
        for question, own in asked:
            answered = library.ask(question["q"], max_new_tokens=args.max_new_tokens)
            answer = answered.answer
            rows.append({"run": run, "document": own, "q": question["q"], "read": "; ".join(p.title for p in answered.picks),
                         "reread": answer.recall.reread, "bytes_read": answer.recall.bytes_read,
                         "ttft_s": round(answer.time_to_first_token_s, 3), "decode_tokens_per_s": round(answer.decode_tokens_per_s, 1),
                         "tokens": len(answer.token_ids)})
            print(rows[-1], flush=True)
    opened = len(library.documents)
    library.close()
    meta = {"documents": opened, "read_whole": read_rows, "library_index_s": round(index_s, 2), "load_average": os.getloadavg(),
            "machine": common.machine_info(), "median_ttft_s": common.median([r["ttft_s"] for r in rows]),
            "max_ttft_s": max(r["ttft_s"] for r in rows), "reread": sum(r["reread"] for r in rows),
            "median_decode_tokens_per_s": common.median([r["decode_tokens_per_s"] for r in rows])}
    common.write_results("library_qa_archives", rows, ["run", "document", "reread", "bytes_read", "ttft_s",
                                                       "decode_tokens_per_s", "tokens", "read", "q"], meta)
    print({k: v for k, v in meta.items() if k != "machine"})


if __name__ == "__main__":
    main()
