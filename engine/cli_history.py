"""`halaman history export PATH`: the conversation about a document, as the window keeps it, as
Markdown on stdout (`engine.history`); and `record_answer`, which puts a question asked with
`halaman ask` into the same history, so that the command line and the window show one record."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli_library import remember_document
from engine.documents import load_document
from engine.errors import HalamanError
from engine.history import conversation_markdown
from engine.library import Library
from engine.settings import load_settings

if TYPE_CHECKING:
    from engine.workspace import AnswerRecord, OpenResult


def add_history_command(sub) -> None:
    """The `history` command and its `export` action, on the CLI's subparsers `sub`."""
    history = sub.add_parser("history", help="the conversations kept by the desktop app")
    actions = history.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="a document's conversation as Markdown, on stdout, citations as "
                                               "[document, page N] with the attended sentences quoted")
    export.add_argument("path", help="the document (PDF, folder or text file) as it was opened")
    export.set_defaults(handler=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    """Raises HalamanError when the document has no conversation in the history, or when the path
    names nothing and no conversation either."""
    path = Path(args.path).expanduser()
    library = Library(interrupt_streaming=False)  # the window may be streaming an answer right now
    try:
        record = library.find(str(path.resolve()))
        # A document deleted since it was asked about still has its conversation: only a path that
        # names nothing at all is a mistyped one.
        if record is None and not path.exists():
            raise HalamanError(f"{args.path} does not exist: check the path (no such file or folder)")
        if record is None:
            raise HalamanError(f"{args.path}: no conversation about it in the history (open it in the app and ask)")
        try:
            document = load_document(record.path, include_generated=load_settings().include_generated_files)
        except HalamanError as exc:
            print(f"halaman: {exc}; citations are not checked", file=sys.stderr)
            document = None
        sys.stdout.write(conversation_markdown(record, library.messages(record.id), document))
    finally:
        library.close()
    return 0


def record_answer(opened: OpenResult, question: str, answer: AnswerRecord) -> None:
    """Keep `question` and its `answer` about the document `opened` in the app's history (its
    library row made or refreshed as the window's open does). Raises sqlite3.Error or OSError when the
    history file cannot be written."""
    library = Library(interrupt_streaming=False)
    try:
        document_id = remember_document(library, opened)
        library.add_message(document_id, "user", question)
        fields = answer.fields()
        library.add_message(document_id, "assistant", fields.pop("text"), state=fields.pop("state"), **fields)
    finally:
        library.close()
