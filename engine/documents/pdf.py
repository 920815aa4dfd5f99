"""PDF loading: one segment per page with text, extracted in a bounded child process.

The parsers run in `engine.documents.pdf_worker` (see there for the extractor choice) under an
address-space cap and a per-page time limit, so a hostile file costs at most
`WORKER_MEMORY_BYTES` and `PAGE_TIMEOUT_S` per page, never the app. A page that crashes or stalls
the worker is skipped with a warning and the worker restarts after it, at most `MAX_FAILED_PAGES`
times. Policy decisions (what is a warning, what is an error, what is left out) live here.
Case ids (P16, S01, …) name the test-corpus PDFs of docs/CORPUS.md.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Iterator

from engine.documents.document import (
    MAX_LABEL_CHARS, DamagedPdfError, Document, EmptyFileError, FileNotReadableError, NoTextLayerError,
    NotPdfError, OutlineEntry, PasswordRequiredError, ProgressCallback, Segment, SuspiciousPdfError,
    PDF_HEADER_WINDOW_BYTES, UnreadableTextError, UnsupportedEncryptionError, WrongPasswordError,
    os_reason, page_ranges,
)
from engine.documents.child_io import ChildWords, child_events
from engine.documents.hyphenation import join_hyphenated_lines
from engine.documents.names import display_name, shown_title
from engine.documents.pdf_attachments import attachment_parts
from engine.documents.pdf_xfa import form_text
from engine.documents.text import is_unreliable, measure, normalize_and_count, normalize_text

log = logging.getLogger(__name__)

WORKER_MEMORY_BYTES = 1 << 30
"""Address-space cap of the extraction process (POSIX only). Extracting P16 peaks at ~70 MB RSS;
the S01 bomb aborts under this cap after ~2 s instead of taking 7.6 GB."""

PAGE_TIMEOUT_S = 30.0
"""Longest wait for the worker's next event (open or page) before the page counts as hostile.
pypdf #2790 took 1:45 min on one 127 MiB page; normal pages take milliseconds."""

MAX_FAILED_PAGES = 3
"""After this many crashed or stalled pages the file is refused as suspicious."""

STAMP_IMAGE_SHARE = 0.5
"""A page with a short text (`pdf_worker.STAMP_MAX_CHARS`) over images covering at least this share
of it is a scan with a stamp (an e-signature envelope ID, a Bates number, a fax header): its text
is recognised from the page image, not read as the stamp alone (docling#3464, ocrmypdf#1563)."""

STAMP_GAIN_CHARS = 40
"""The recognised text replaces such a page's text layer only when it is longer by this many
characters: a slide or poster whose picture holds no more words than its title keeps its own text
(exact, in any script), not the recogniser's reading of it."""

_POLL_S = 0.1  # how often cancel is checked while waiting for the worker
_READER_WORDS = ChildWords(
    cancelled="Reading the PDF was cancelled.", timed_out="no result within {timeout:g} s",
    died="it exhausted the reader's memory or crashed it", stopped="the reader stopped early",
    garbled="the reader sent garbled output")
_HEADER_WINDOW_BYTES = PDF_HEADER_WINDOW_BYTES


def load_pdf(path: Path, *, password: str | None = None, progress: ProgressCallback | None = None,
             cancel: threading.Event | None = None) -> Document:
    """Read the text of every page of the PDF at `path` (absolute).

    Pages without text are not segments: blank pages are silent, pages whose text is noise are
    left out with a warning. Pages with images and no text (a scan), or mostly image with only a
    stamp of text, are rendered and their text recognised (`engine.documents.ocr`, cached per
    page) after the text layer is read; a warning names them ("recognised text (OCR)"), and
    `Document.recognised_pages` lists them. Where OCR is not available they get a "no text layer
    (scanned?)" warning.
    Text that no viewer shows (outside the page box, invisible, white on white: B14; in a layer
    the default view switches off: B24) is never page text; "pages 1-3: text no viewer shows
    (outside the page) left out" says where. Form values and annotations a viewer draws are page
    text, also without an appearance stream (B03, B27). Words hyphenated at line ends are joined
    (`engine.documents.hyphenation`, B28). Embedded text files are extra segments labelled
    "attachment NAME", every other embedded file is named in a warning (`pdf_attachments`).
    Raises EmptyFileError, NotPdfError, PasswordRequiredError, WrongPasswordError,
    UnsupportedEncryptionError, DamagedPdfError, SuspiciousPdfError, NoTextLayerError,
    UnreadableTextError, FileNotReadableError, or Cancelled.
    """
    _check_header(path)
    state = _Collected(path)
    start_page = 0
    while True:
        try:
            # closing(): an error raised while handling an event must still end the worker now.
            with closing(_run_worker(path, password, start_page, cancel)) as events:
                for event in events:
                    state.apply(event, progress)
            break
        except _WorkerLost as lost:
            if state.total is None:
                raise SuspiciousPdfError(
                    f"{display_name(path.name)} could not be opened safely ({lost.reason}): it may be hostile "
                    "or broken; check where the file came from") from None
            if state.next_page > state.total:
                state.lost_after_pages(lost.reason)
                break  # every page arrived; it failed on the way out
            state.fail_page(lost.reason, progress)
            if state.next_page > state.total:
                break
            start_page = state.next_page - 1
    state.recognise(password, progress, cancel)
    return state.document()


class _Collected:
    """What the worker has sent so far, across restarts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.total: int | None = None
        self.title = ""
        self.next_page = 1  # 1-based number of the page the worker is expected to send next
        self.segments: list[Segment] = []
        self.printed: dict[int, str] = {}  # page -> its printed label (/PageLabels), where it has one
        self.scanned: list[int] = []
        self.stamped: dict[int, str] = {}  # page -> its stamp's text, kept if OCR cannot run
        self.recognised: dict[int, str] = {}  # page -> recognised text (OCR)
        self.ocr_problem = ""
        self.stamp_kept: list[int] = []  # stamped pages whose recognised text added nothing
        self.unreadable: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.notes: list[str] = []
        self.hidden: dict[str, list[int]] = {}
        self.outline: list[OutlineEntry] = []  # reason -> pages where text no viewer shows was left out
        self.attachments: list[dict[str, Any]] = []  # embedded files (pdf_attachments)
        self.attachments_listed = False
        self.xfa: dict | None = None  # an XFA form's values or why not (`pdf_xfa.xfa_values`)

    def apply(self, event: dict[str, Any], progress: ProgressCallback | None) -> None:
        kind = event.get("event")
        if kind == "open":
            if self.total is None:
                self.total, self.title = int(event["pages"]), normalize_text(event["title"] or "")
                self.outline = _outline_entries(event.get("outline") or [])
                self.xfa = event.get("xfa")
                if event.get("repaired"):
                    self.notes.append("the file is damaged (broken cross-reference table) and was "
                                      "repaired while reading: text may be missing")
                if event.get("layers_unchecked"):
                    self.notes.append(f"its layers could not be checked ({event['layers_unchecked']}): "
                                      "the text of every layer was left out")
                if progress:
                    progress(0, self.total)
        elif kind == "page":
            self._add_page(int(event["page"]), event["text"], int(event.get("images", 0)),
                           float(event.get("image_share", 0.0)))
            printed = " ".join(normalize_text(str(event.get("label") or "")).split())[:MAX_LABEL_CHARS]
            if printed:
                self.printed[int(event["page"])] = printed
            for reason in event.get("hidden") or {}:
                self.hidden.setdefault(str(reason), []).append(int(event["page"]))
            self.next_page = int(event["page"]) + 1
            if progress and self.total:
                progress(self.next_page - 1, self.total)
        elif kind == "attachments":
            self.attachments, self.attachments_listed = list(event.get("files") or []), True
        elif kind == "error":
            if event["code"] == "page_too_large":
                raise _WorkerLost("too much text")
            raise _error_for(self.path, event)

    def _add_page(self, number: int, raw: str, images: int, image_share: float = 0.0) -> None:
        text, hidden = normalize_and_count(raw)
        if hidden:  # Unicode tags and the like (B25): nothing a viewer draws
            self.hidden.setdefault("invisible characters", []).append(number)
        if not text:
            if images:
                self.scanned.append(number)
            return  # a blank page is not a failure (P16 has 12)
        if image_share >= STAMP_IMAGE_SHARE:
            self.stamped[number] = text
            return
        if is_unreliable(measure(raw)):
            # Left out, not kept with a marker: noise would take budget and could be quoted
            # as if the document said it; the warning names the page so the user can look.
            self.unreadable.append(number)
            return
        self.segments.append(Segment(text=text, label=f"page {number}", page=number, path=None))

    def lost_after_pages(self, reason: str) -> None:
        """The worker was lost after the last page: while listing the embedded files."""
        if not self.attachments_listed:
            self.notes.append(f"its embedded files could not be listed safely ({reason}): open the "
                              "attachments panel of a PDF viewer to see them")

    def fail_page(self, reason: str, progress: ProgressCallback | None) -> None:
        self.failed.append((self.next_page, reason))
        if len(self.failed) > MAX_FAILED_PAGES:
            raise SuspiciousPdfError(
                f"{display_name(self.path.name)}: {len(self.failed)} pages are too large or malformed to read "
                "safely (suspicious file): check where the file came from")
        self.next_page += 1
        if progress and self.total:
            progress(min(self.next_page - 1, self.total), self.total)

    def recognise(self, password: str | None, progress: ProgressCallback | None,
                  cancel: threading.Event | None) -> None:
        """Recognise the text of the scanned and stamped pages (OCR); where it cannot run, say
        why in the warnings. Raises Cancelled."""
        from engine.documents.ocr import OcrFailed, OcrUnavailable, recognise_pages

        numbers = sorted(self.scanned + list(self.stamped))
        if not numbers:
            return
        failed: dict[int, str] = {}
        try:
            pages = recognise_pages(self.path, "pdf", [n - 1 for n in numbers], password=password,
                                    progress=progress, cancel=cancel, failed=failed)
        except (OcrUnavailable, OcrFailed) as exc:
            self.ocr_problem = str(exc)
            return
        self.failed += [(index + 1, f"recognising its text: {why}") for index, why in sorted(failed.items())]
        for number in numbers:
            text = normalize_text(pages[number - 1].text) if number - 1 in pages else ""
            if number in self.stamped and len(text) < len(self.stamped[number]) + STAMP_GAIN_CHARS:
                self.stamp_kept.append(number)  # the picture adds nothing: its own text layer stands
            elif text:
                self.recognised[number] = text

    def _page_segments(self) -> list[Segment]:
        """The text-layer pages, the recognised ones and the stamps OCR could not replace, in page order."""
        segments = list(self.segments)
        segments += [Segment(text=text, label=f"page {n}", page=n, path=None) for n, text in self.recognised.items()]
        segments += [Segment(text=text, label=f"page {n}", page=n, path=None)
                     for n, text in self.stamped.items() if n not in self.recognised]
        return sorted(segments, key=lambda segment: segment.page)

    def _ocr_warnings(self) -> list[str]:
        warnings = []
        if self.recognised:
            warnings.append(f"{page_ranges(sorted(self.recognised))}: recognised text (OCR) of a scanned page: "
                            "words may be misread")
        stamped = sorted(n for n in self.stamped if n in self.recognised)
        if stamped:
            warnings.append(f"{page_ranges(stamped)}: a scan with a short line of text over it (a stamp?): "
                            "the whole page was recognised")
        why = f" ({self.ocr_problem})" if self.ocr_problem else ""
        unread = [n for n in self.stamped if n not in self.recognised and n not in self.stamp_kept]
        if unread:
            outcome = f"the image's text could not be recognised{why}" if why else "no other text was recognised"
            warnings.append(f"{page_ranges(unread)}: mostly an image with only a short line of text (a stamp over a "
                            f"scan?): only that line was read, {outcome}")
        failed = {page for page, _ in self.failed}
        scanned = [n for n in self.scanned if n not in self.recognised and n not in failed]
        if scanned:
            warnings.append(f"{page_ranges(scanned)}: no text layer (scanned?)"
                            + (f", its text could not be recognised{why}" if why else ", no text found"))
        return warnings

    def document(self) -> Document:
        page_segments = self._page_segments()
        if not page_segments:
            raise self._no_text_error()
        warnings = list(self.notes)
        warnings += [f"page {page}: too large or malformed to read safely ({reason}), skipped"
                     for page, reason in self.failed]
        warnings += self._ocr_warnings()
        if self.unreadable:
            warnings.append(f"{page_ranges(self.unreadable)}: text unreadable (font without a Unicode "
                            "map?), left out")
        warnings += [f"{page_ranges(pages)}: text no viewer shows ({reason}) left out"
                     for reason, pages in sorted(self.hidden.items())]
        # Joined once all pages are in: whether a line-end hyphen is a compound's is told by the
        # whole document (B28).
        texts = join_hyphenated_lines([segment.text for segment in page_segments])
        segments = [replace(segment, text=text, printed=self.printed.get(segment.page))
                    for segment, text in zip(page_segments, texts)]
        form, note = form_text(self.xfa)  # a dynamic form's values are in its XML, not on its pages
        if form:
            segments[0] = replace(segments[0], text=f"{segments[0].text}\n\n{form}")
        if note:
            warnings.append(note.format(page=segments[0].page))
        embedded, notes = attachment_parts(self.attachments, display_name(self.path.name))
        segments += embedded
        warnings += notes
        return Document(title=shown_title(self.title, self.path),
                        source=str(self.path), kind="pdf", segments=segments,
                        warnings=warnings, pages=self.total, outline=self.outline,
                        recognised_pages=sorted(self.recognised))

    def _no_text_error(self) -> Exception:
        name = display_name(self.path.name)
        if self.failed:
            page, reason = self.failed[0]
            return SuspiciousPdfError(
                f"{name}: page {page} is too large or malformed to read safely ({reason}); "
                "suspicious file: check where it came from")
        if self.unreadable:
            return UnreadableTextError(
                f"{name}: the text of every page is unreadable (fonts without a Unicode map): "
                "run OCR on it first (e.g. ocrmypdf --force-ocr)")
        why = f" ({self.ocr_problem})" if self.ocr_problem else ""
        return NoTextLayerError(
            f"{name} has no text layer (scanned?) and no text could be recognised in its pages{why}: "
            "check that the pages show text")


def _outline_entries(raw: list) -> list[OutlineEntry]:
    """The worker's [level, title, 0-based page] rows as entries: titles normalised to one line,
    empty ones dropped."""
    entries = []
    for level, title, index in raw:
        text = " ".join(normalize_text(str(title)).split())
        if text:
            entries.append(OutlineEntry(title=text, level=int(level), page=int(index) + 1))
    return entries


def _check_header(path: Path) -> None:
    """Refuse empty files and non-PDFs before starting a process (corpus cases S05, S06)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(_HEADER_WINDOW_BYTES)
    except OSError as exc:
        raise FileNotReadableError(
            f"{display_name(path.name)} cannot be read ({os_reason(exc)}): check the file's permissions") from None
    if size == 0:
        raise EmptyFileError(f"{display_name(path.name)} is empty (0 bytes): the download or copy was probably "
                             "interrupted; get the file again")
    if b"%PDF-" not in head:
        lowered = head.lower()
        what = ("an HTML web page saved with a .pdf name" if b"<html" in lowered
                or b"<!doctype" in lowered else "it has no %PDF header")
        raise NotPdfError(
            f"{display_name(path.name)} is not a PDF ({what}): download or export the real PDF again")


def _ends_like_pdf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - _HEADER_WINDOW_BYTES))
            return b"%%EOF" in handle.read()
    except OSError:
        return True


def _error_for(path: Path, event: dict[str, Any]) -> Exception:
    name, code = display_name(path.name), event.get("code")
    if code == "password_required":
        return PasswordRequiredError(
            f"{name} is password-protected: open it with its password (--password)")
    if code == "wrong_password":
        return WrongPasswordError(
            f"{name}: wrong password: check it (passwords are case-sensitive) and try again")
    if code == "unsupported_security":
        return UnsupportedEncryptionError(
            f"{name} uses an encryption this reader does not support (e.g. certificates): "
            "save an unencrypted copy from the app that made it")
    if code == "page_unreadable":
        return DamagedPdfError(
            f"{name} is damaged: page {event.get('page')} cannot be loaded (broken or cyclic page "
            "tree): open it in a PDF viewer and print it to a new PDF")
    if not _ends_like_pdf(path):
        return DamagedPdfError(
            f"{name} is incomplete (it stops before the end of the PDF, e.g. an interrupted "
            "download): download it again")
    return DamagedPdfError(
        f"{name} is damaged and cannot be read: open it in a PDF viewer and save or print it to a "
        "new PDF, or get the file again")


class _WorkerLost(Exception):
    """The worker died, stalled or refused a page before finishing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def worker_command() -> list[str]:
    """The command line that starts the extraction process (tests replace it)."""
    return [sys.executable, "-m", "engine.documents.pdf_worker"]


def _run_worker(path: Path, password: str | None, start_page: int,
                cancel: threading.Event | None) -> Iterator[dict[str, Any]]:
    """Yield the worker's events until "done"; raise _WorkerLost if it dies or stalls."""
    request = {"path": str(path), "password": password, "start_page": start_page,
               "memory_bytes": WORKER_MEMORY_BYTES}
    package_root = str(Path(__file__).resolve().parents[2])
    # PYTHONSAFEPATH: `-m` (and `-c`) would put the current directory first on sys.path, and a
    # `json.py` in the folder Halaman was started from would then run in the worker.
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                env=env, text=True, encoding="utf-8")
        except OSError as exc:
            raise FileNotReadableError(
                f"{display_name(path.name)}: the PDF reader could not be started ({os_reason(exc)}): "
                "reinstall Halaman") from None
        try:
            try:
                # The password goes through stdin, never argv, which other users can list.
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.close()
            except OSError:
                pass  # it died at once; reading its (empty) output reports that
            yield from child_events(process, cancel, timeout_s=PAGE_TIMEOUT_S, poll_s=_POLL_S, lost=_WorkerLost,
                                    words=_READER_WORDS)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
            _log_stderr(stderr, process.returncode)




def _log_stderr(stderr: IO[bytes], status: int | None) -> None:
    if status:
        stderr.seek(0)
        tail = stderr.read()[-2000:].decode("utf-8", "replace")
        log.debug("pdf worker exited with %s: %s", status, tail)
