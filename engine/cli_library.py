"""`halaman library add PATH…` and `halaman library list`: the app's library from the command line.

`add` reads each document whole once (its saved reading — snapshot, archive and full-text index —
goes to the prefix cache, as the window's read does) and lists it in the library the window shows,
so later questions about it, in the window or with `halaman ask`, start from that reading. A
document read before and unchanged is a prefix-cache hit: adding it again costs seconds. Ctrl-C
stops the read under way; the documents added before it stay. `list` shows the library with each
document's saved-reading status (cached / stale / not cached / missing, `engine.library`);
`remove` forgets documents by path or title, or every missing one (`--missing`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import Cancelled, HalamanError
from engine.library import STALE, Library, read_share
from engine.units import format_duration

if TYPE_CHECKING:
    from engine.workspace import OpenResult


def add_library_command(sub) -> None:
    """The `library` command with its `add` and `list` actions, on the CLI's subparsers `sub`."""
    library = sub.add_parser("library", help="the documents the app keeps, each read once and saved")
    actions = library.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="read documents whole once and list them in the app's library")
    add.add_argument("paths", nargs="+", metavar="PATH", help="PDFs, text files or folders")
    add.add_argument("--password", help="password of the encrypted PDFs among them (not kept: a library question "
                                        "skips them; ask one on its own with --password)")
    add.set_defaults(handler=_cmd_add)
    listing = actions.add_parser("list", help="the library's documents and whether their reading is saved")
    listing.add_argument("--json", action="store_true", help="one JSON object per document, for scripts")
    listing.set_defaults(handler=_cmd_list)
    remove = actions.add_parser("remove", help="forget documents (their chat history too; the files are not touched)")
    remove.add_argument("names", nargs="*", metavar="PATH_OR_TITLE", help="a document's path or title")
    remove.add_argument("--missing", action="store_true", help="every document whose file is gone (moved or deleted)")
    remove.set_defaults(handler=_cmd_remove)


def remember_document(library: Library, opened: OpenResult) -> int:
    """Make or refresh the library row of the document `opened`, as the window's open does: its
    title, size and prefix key (what tells cached from stale). Returns its id. Raises sqlite3.Error
    or OSError when the library file cannot be written."""
    report = opened.report
    files = len(opened.document.segments) if report.kind == "repo" else None
    return library.upsert_document(path=opened.path, title=report.title, kind=report.kind, pages=report.pages,
                                   files=files, tokens=report.document_tokens, prefix_key=opened.prefix_key,
                                   config_sig=opened.prefix_signature)


def _cmd_add(args: argparse.Namespace) -> int:
    """Exit status 0 when every document was added, 1 when one failed (each failure one line on
    stderr; the rest are added), 130 when Ctrl-C stopped it."""
    from engine.cli_report import ProgressBar
    from engine.documents import load_document
    from engine.progress import reading_progress
    from engine.settings import load_settings
    from engine.workspace import Workspace

    err = sys.stderr
    settings = load_settings()
    workspace = Workspace(settings)
    cancel = threading.Event()
    failed = added = 0
    try:
        for path in args.paths:
            bar = ProgressBar()
            try:
                if not Path(path).exists():
                    raise HalamanError(f"{path}: no such file or folder; check the path")
                document = load_document(path, password=args.password, progress=reading_progress(bar.update, path),
                                         include_generated=settings.include_generated_files)
                bar.close()

                def before_prefill(plan) -> bool:
                    bar.close()
                    print(f"halaman: {plan.describe()} — Ctrl-C stops.", file=err, flush=True)
                    return True

                opened = workspace.open(document, progress=bar.update, cancel=cancel, before_prefill=before_prefill,
                                        read_now=True)
            except HalamanError as exc:
                bar.close()
                print(f"halaman: {exc}", file=err)
                failed += 1
                continue
            finally:
                bar.close()
            library = Library(interrupt_streaming=False)  # the window may be streaming an answer right now
            try:
                remember_document(library, opened)
            finally:
                library.close()
            added += 1
            report = opened.report
            how = ("its saved reading is reused" if report.prefix_hit
                   else f"read in {format_duration(report.seconds)}")
            size = f"{report.pages} pages, " if report.pages else ""
            print(f"added {report.title} ({report.kind}, {size}{report.document_tokens:,} tokens): {how}")
    except (KeyboardInterrupt, Cancelled):
        cancel.set()
        print(f"\nhalaman: stopped; {added} of {len(args.paths)} added, the one being read was not", file=err)
        return 130
    finally:
        workspace.shutdown()
    return 1 if failed else 0


def _cmd_remove(args: argparse.Namespace) -> int:
    """Forget each named document (`Library.remove`); exit status 1 when a name matched nothing."""
    if not args.names and not args.missing:
        raise HalamanError("name the documents to remove (a path or a title), or pass --missing")
    library = Library(interrupt_streaming=False)
    unknown = 0
    try:
        for name in [*args.names, *([None] if args.missing else [])]:
            removed = library.remove(name)
            for record in removed:
                print(f"removed {record.title}  {record.path}")
            if not removed and name is not None:
                unknown += 1
                print(f"halaman: {name}: no document in the library has this path or title "
                      "(`halaman library list` shows them)", file=sys.stderr)
    finally:
        library.close()
    return 1 if unknown else 0


def _cmd_list(args: argparse.Namespace) -> int:
    """The library's documents, most recently opened first, with their saved-reading status (by
    the stored keys; without loading a model, a changed cache policy is not seen as stale)."""
    from engine.settings import load_settings
    from engine.workspace import Workspace

    settings = load_settings()
    workspace = Workspace(settings)
    library = Library(interrupt_streaming=False)
    try:
        cache = workspace.cache_status(set())
        records = sorted(library.documents(), key=lambda r: r.opened_s or r.added_s, reverse=True)
        if not records:
            print("the library is empty: add documents with `halaman library add PATH…` or open them in the app",
                  file=sys.stderr)
        for record in records:
            status = library.status(record, cache, settings)
            share = read_share(record, status, cache)
            if args.json:
                print(json.dumps({"title": record.title, "path": record.path, "kind": record.kind, "pages": record.pages,
                                  "files": record.files, "tokens": record.tokens, "status": status,
                                  "read_share": share}))
            else:
                size = (f"{record.pages} pages" if record.pages else f"{record.files} files" if record.files else record.kind)
                tokens = f", {record.tokens:,} tokens" if record.tokens else ""
                said = f"read {share:.0%}".replace("%", " %") if share is not None else status
                print(f"{said:<11} {record.title} ({size}{tokens})  {record.path}")
    finally:
        library.close()
        workspace.shutdown()
    return 0


def source_text(source) -> str:
    """How a library answer's source is cited: "[Think Python, page 5]", "[notes.md]" (`Source.cited_name`)."""
    return f"[{source.cited_name}]"


def _print_library_answer(question: str, args: argparse.Namespace, answered, asking, workspace, settings,
                          open_s: float, skipped: list[str]) -> int:
    """`halaman ask --library`'s report after the answer (or, with `--json`, one JSON object):
    `answered` is the `LibraryAnswer`, `asking` the `OpenLibrary` it came from. Returns 0."""
    from engine.cli_report import answer_cautions
    from engine.open_library import unmatched_note
    from engine.units import format_bytes

    answer = answered.answer
    saved = sum(not opened.unread for opened in asking.documents)
    read = [{"title": pick.title, "score": round(pick.score, 2),
             "spans": [asking.documents[pick.document].span_label(span) for span in pick.selection.chosen]}
            for pick in answered.picks]
    recall = answer.recall
    how = (f"re-read {recall.tokens_recalled // max(1, workspace.model.profile.num_layers * workspace.model.profile.kv_heads):,}"
           " tokens from their token ids (a document not read whole yet)" if recall.reread
           else f"read {format_bytes(recall.bytes_read)} from the saved readings")
    cautions = [note for note in [unmatched_note(answered.picks)] if note] + answer_cautions(answer, settings)
    if args.json:
        print(json.dumps({
            "question": question, "answer": answer.text, "stop_reason": str(answer.stop_reason),
            "sources": [{"document": s.document, "file": s.document_source, "label": s.label, "page": s.page, "path": s.path,
                         "share": round(s.share, 4)} for s in answer.sources],
            "documents_read": read,
            "library": {"documents": len(asking.documents), "saved_readings": saved, "skipped": skipped},
            "timings": {"open_s": round(open_s, 3), "ttft_s": round(answer.time_to_first_token_s, 3),
                        "decode_tokens_per_s": round(answer.decode_tokens_per_s, 2)},
            "recall": {"reread": recall.reread, "bytes_read": recall.bytes_read},
            "check": cautions,
        }, ensure_ascii=False))
        return 0
    print("\n\n--- report ---")
    print(f"library         {len(asking.documents)} documents ({saved} with a saved reading, "
          f"{len(asking.documents) - saved} answered from their index), opened in {format_duration(open_s)}")
    print("read            " + "; ".join(f"{r['title']}: {', '.join(r['spans'])}" for r in read))
    print(f"recall          {how}")
    print(f"TTFT            {answer.time_to_first_token_s:.2f} s")
    print(f"decode          {answer.decode_tokens_per_s:.1f} tokens/s, {len(answer.token_ids)} tokens, stop: {answer.stop_reason}")
    if answer.sources:
        print("sources         " + "; ".join(f"{source_text(s)} {s.share:.0%}" for s in answer.sources))
    for caution in cautions:
        print(f"check           {caution}")
    return 0


def ask_library(question: str, args: argparse.Namespace, settings) -> int:
    """`halaman ask --library QUESTION`: open every document of the library index first (a saved
    reading is reused, others are answered from their index), answer from the ones the question
    picks (`engine.open_library`), print the answer and a report (or, with `--json`, one JSON
    object). Exit status 0; 130 when Ctrl-C stopped it. Raises HalamanError for an empty library
    or question."""
    from engine.cli_report import ProgressBar
    from engine.prompt import check_question
    from engine.workspace import Workspace

    check_question(question, "the documents")
    library = Library(interrupt_streaming=False)
    try:
        records = library.documents()
        if not records:
            raise HalamanError("the library is empty: add documents with `halaman library add PATH…` or open them in the app")
        err = sys.stderr
        print(f"Loading {settings.model} ...", file=err, flush=True)
        workspace = Workspace(settings)
        workspace.ensure_model()
        cache = workspace.cache_status({record.tokens for record in records if record.tokens})
        stale = {record.path for record in records if library.status(record, cache, settings) == STALE}
    finally:
        library.close()
    cancel = threading.Event()
    missing = [f"{record.title}: {record.path} is no longer there" for record in records if not Path(record.path).exists()]
    titles = {record.path: record.title for record in records}
    bars: list[ProgressBar] = []

    def progress_for(k: int, n: int, path: str):
        for bar in bars:
            bar.close()
        if path in stale:
            print(f"warning: {titles[path]} changed since its reading was saved: the pages a question picks in it "
                  "are read again each time, until `halaman library add` reads it anew", file=err)
        print(f"opening {k} of {n}: {titles[path]}", file=err, flush=True)
        bars.append(ProgressBar())
        return bars[-1].update

    try:
        began = time.perf_counter()
        try:
            asking = workspace.open_library([r.path for r in records if Path(r.path).exists()], cancel=cancel,
                                            progress_for=progress_for)
        finally:
            for bar in bars:
                bar.close()
            skipped = missing + workspace.library_skipped
            for line in skipped:
                print(f"warning: skipped {line}", file=err)
        open_s = time.perf_counter() - began
        answered = asking.ask(question, cancel=cancel,
                              on_text=None if args.json else (lambda piece: print(piece, end="", flush=True)))
        return _print_library_answer(question, args, answered, asking, workspace, settings, open_s, skipped)
    except (KeyboardInterrupt, Cancelled):
        cancel.set()
        print("\nhalaman: stopped", file=err)
        return 130
    finally:
        workspace.shutdown()
