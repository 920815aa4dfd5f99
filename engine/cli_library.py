"""`halaman library add PATH…` and `halaman library list`: the app's library from the command line.

`add` reads each document whole once (its saved reading — snapshot, archive and full-text index —
goes to the prefix cache, as the window's read does) and lists it in the library the window shows,
so later questions about it, in the window or with `halaman ask`, start from that reading. A
document read before and unchanged is a prefix-cache hit: adding it again costs seconds. Ctrl-C
stops the read under way; the documents added before it stay. `list` shows the library with each
document's saved-reading status (cached / stale / not cached, `engine.library`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import Cancelled, HalamanError
from engine.library import Library
from engine.units import format_duration

if TYPE_CHECKING:
    from engine.workspace import OpenResult


def add_library_command(sub) -> None:
    """The `library` command with its `add` and `list` actions, on the CLI's subparsers `sub`."""
    library = sub.add_parser("library", help="the documents the app keeps, each read once and saved")
    actions = library.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="read documents whole once and list them in the app's library")
    add.add_argument("paths", nargs="+", metavar="PATH", help="PDFs, text files or folders")
    add.set_defaults(handler=_cmd_add)
    listing = actions.add_parser("list", help="the library's documents and whether their reading is saved")
    listing.add_argument("--json", action="store_true", help="one JSON object per document, for scripts")
    listing.set_defaults(handler=_cmd_list)


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
    from engine.cli import _ProgressBar as ProgressBar
    from engine.documents import load_document
    from engine.session import reading_progress
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
                document = load_document(path, progress=reading_progress(bar.update, path),
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
            if args.json:
                print(json.dumps({"title": record.title, "path": record.path, "kind": record.kind, "pages": record.pages,
                                  "files": record.files, "tokens": record.tokens, "status": status}))
            else:
                size = (f"{record.pages} pages" if record.pages else f"{record.files} files" if record.files else record.kind)
                tokens = f", {record.tokens:,} tokens" if record.tokens else ""
                print(f"{status:<11} {record.title} ({size}{tokens})  {record.path}")
    finally:
        library.close()
        workspace.shutdown()
    return 0
