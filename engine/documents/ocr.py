"""Recognised text (OCR) of scanned pages: lines with boxes, in reading order, recognised once.

`recognise_pages` renders and recognises pages of a PDF or frames of an image in a child process
(`engine.documents.ocr_worker`: rapidocr-onnxruntime, PP-OCRv4 models shipped in its wheel, run on
the CPU with `OCR_THREADS` threads; nothing is downloaded). Each page's result is kept in the user
cache folder as JSON, keyed by the file's content hash, the page index and `ENGINE_VERSION`, so a
page is recognised once however often the file is opened. `RecognisedPage.text` is what becomes the
page's segment; `RecognisedPage.boxes` gives the source pane the rectangles of a character range
of it, as PDFium's character boxes do for a text layer. No Qt here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.documents.child_io import ChildWords, child_events

log = logging.getLogger(__name__)

ENGINE_VERSION = "rapidocr-onnxruntime-1.4.4/PP-OCRv4/2000px/spaces-2/batch-1"
"""Part of every cache key: a new engine, model or rendering rule recognises pages again."""

OCR_THREADS = 2
"""Threads the recogniser may use: ONNX Runtime's intra-op pool and OpenCV's."""

WORKER_MEMORY_BYTES = 4 << 30
"""Address-space cap of the OCR process (POSIX): ONNX Runtime reserves ~1.5 GB of address space;
a page takes ~300 MB more."""

PAGE_TIMEOUT_S = 180.0
"""Longest wait for the next page (or for the engine to load) before the page counts as failed."""

ROW_OVERLAP = 0.5
"""Two boxes are on the same row when their vertical overlap is at least this share of the
shorter one's height."""

_POLL_S = 0.1
_OCR_WORDS = ChildWords(
    cancelled="Recognising the scanned pages was cancelled.", timed_out="no page recognised within {timeout:g} s",
    died="the OCR process ran out of memory or crashed", stopped="the OCR process stopped early",
    garbled="the OCR process sent garbled output")

Box = tuple[float, float, float, float]
"""(left, bottom, right, top) in page units, y up from the bottom edge: PDF points for a PDF page
(PDFium's character boxes use the same), pixels for an image."""


class OcrUnavailable(Exception):
    """The OCR engine is not installed or could not start; str() says why."""


class OcrFailed(Exception):
    """The OCR process could not read a page (a broken frame, a crash); str() says why."""


@dataclass(frozen=True)
class OcrLine:
    """One recognised line: its text (one line, no newline), box and recogniser score (0..1)."""

    text: str
    box: Box
    score: float


@dataclass(frozen=True)
class RecognisedPage:
    """A page's recognised lines in reading order (rows top to bottom, left to right within a
    row); width and height of the page in its units."""

    lines: tuple[OcrLine, ...]
    width: float
    height: float

    @property
    def text(self) -> str:
        """The page's text: one line per row, a row's boxes joined by a space."""
        return "\n".join(" ".join(line.text for line in row) for row in self.rows())

    def rows(self) -> list[list[OcrLine]]:
        """The lines grouped into rows (see ROW_OVERLAP), in reading order."""
        rows: list[list[OcrLine]] = []
        for line in self.lines:
            if rows and _same_row(rows[-1][-1], line):
                rows[-1].append(line)
            else:
                rows.append([line])
        return rows

    def boxes(self, start: int, end: int) -> list[Box]:
        """Boxes of characters `start:end` of `text`: for each line they touch, the part of its
        box under those characters (characters taken as equally wide)."""
        found, at = [], 0
        for row in self.rows():
            for line in row:
                first, last = max(start, at), min(end, at + len(line.text))
                if first < last:
                    left, bottom, right, top = line.box
                    step = (right - left) / max(1, len(line.text))
                    found.append((left + (first - at) * step, bottom, left + (last - at) * step, top))
                at += len(line.text) + 1  # the space or newline after it
        return found


def _same_row(a: OcrLine, b: OcrLine) -> bool:
    overlap = min(a.box[3], b.box[3]) - max(a.box[1], b.box[1])
    shorter = min(a.box[3] - a.box[1], b.box[3] - b.box[1])
    return shorter > 0 and overlap >= ROW_OVERLAP * shorter and b.box[0] >= a.box[0]


def reading_order(lines: list[OcrLine]) -> tuple[OcrLine, ...]:
    """`lines` sorted into rows top to bottom, each row left to right."""
    ordered: list[list[OcrLine]] = []
    for line in sorted(lines, key=lambda item: -item.box[3]):
        for row in ordered:
            top = max(item.box[3] for item in row)
            bottom = min(item.box[1] for item in row)
            overlap = min(top, line.box[3]) - max(bottom, line.box[1])
            if overlap >= ROW_OVERLAP * min(top - bottom, line.box[3] - line.box[1]):
                row.append(line)
                break
        else:
            ordered.append([line])
    return tuple(line for row in ordered for line in sorted(row, key=lambda item: item.box[0]))


def page_from_event(event: dict[str, Any]) -> RecognisedPage:
    """A worker "page" event (or its cached copy) as a RecognisedPage, lines in reading order."""
    lines = [OcrLine(text=" ".join(str(text).split()), box=(float(l), float(b), float(r), float(t)), score=float(s))
             for text, l, b, r, t, s in event["lines"] if str(text).strip()]
    return RecognisedPage(lines=reading_order(lines), width=float(event["width"]), height=float(event["height"]))


# ---------------------------------------------------------------------------------------- cache
def content_hash(path: Path) -> str:
    """SHA-256 of the file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_HASHES: dict[tuple[str, int, int], str] = {}


def _file_key(path: Path) -> str:
    """content_hash, remembered per (path, size, mtime) in this process."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = content_hash(path)
    return _HASHES[key]


def cache_folder() -> Path:
    """Where recognised pages are kept: `ocr/` in the user cache folder (HALAMAN_HOME/cache)."""
    from engine.paths import cache_dir

    folder = cache_dir() / "ocr"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _cache_file(file_key: str, index: int) -> Path:
    engine = hashlib.sha256(ENGINE_VERSION.encode()).hexdigest()[:12]
    return cache_folder() / file_key[:2] / f"{file_key}-{index}-{engine}.json"


def cached_page(path: Path, index: int) -> RecognisedPage | None:
    """The recognised page `index` (0-based) of the file at `path` from the cache, or None."""
    try:
        with _cache_file(_file_key(path), index).open(encoding="utf-8") as handle:
            return page_from_event(json.load(handle))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not recognised yet, or a damaged entry: recognised again


def _store(file_key: str, event: dict[str, Any]) -> None:
    target = _cache_file(file_key, int(event["index"]))
    from engine.paths import write_text_atomic

    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, json.dumps(event, ensure_ascii=False))  # a reader never sees half a page


# -------------------------------------------------------------------------------------- running
def worker_command() -> list[str]:
    """The command line that starts the OCR process (tests count its runs through it)."""
    return [sys.executable, "-m", "engine.documents.ocr_worker"]


MAX_FAILED_PAGES = 3
"""After this many pages that crashed, stalled or could not be decoded, the rest is not tried."""


def recognise_pages(path: Path, kind: str, indices: list[int], *, password: str | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cancel: threading.Event | None = None,
                    failed: dict[int, str] | None = None) -> dict[int, RecognisedPage]:
    """Recognised text of pages `indices` (0-based) of the PDF (`kind` "pdf") or image ("image")
    at `path`: {index: RecognisedPage}. Cached pages are not recognised again; the others are
    rendered and recognised one at a time in the OCR process, each stored as it arrives (a
    cancelled read keeps the pages done). `progress(done, len(indices))` after each page. A page
    that crashes or stalls the OCR process, or cannot be decoded, is left out and put in `failed`
    (index → why) and the process restarts after it.

    Raises OcrUnavailable (engine not installed), OcrFailed (more than MAX_FAILED_PAGES pages
    failed), Cancelled when `cancel` is set (checked every 0.1 s; the process is killed)."""
    file_key = _file_key(path)
    found: dict[int, RecognisedPage] = {}
    missing = []
    for index in indices:
        page = cached_page(path, index)
        if page is None:
            missing.append(index)
        else:
            found[index] = page
    if progress and indices:
        progress(len(found), len(indices))
    failures = failed if failed is not None else {}
    while missing:
        request = {"path": str(path), "kind": kind, "password": password, "pages": missing,
                   "threads": OCR_THREADS, "memory_bytes": WORKER_MEMORY_BYTES}
        try:
            for event in _run_worker(request, cancel):
                if event.get("event") == "error":
                    raise (OcrUnavailable if event.get("code") == "unavailable" else OcrFailed)(str(event.get("detail")))
                if event.get("event") == "page":
                    _store(file_key, event)
                    found[int(event["index"])] = page_from_event(event)
                    if progress:
                        progress(len(found) + len(failures), len(indices))
            return found
        except OcrFailed as failure:
            missing = [index for index in missing if index not in found]
            failures[missing[0]] = str(failure)  # the page it was on
            if len(failures) > MAX_FAILED_PAGES:
                raise OcrFailed(f"{len(failures)} pages could not be recognised ({failure})") from None
            missing = missing[1:]
            if progress:
                progress(len(found) + len(failures), len(indices))
    return found


def _run_worker(request: dict[str, Any], cancel: threading.Event | None) -> Iterator[dict[str, Any]]:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=stderr, env=env, text=True, encoding="utf-8")
        except OSError as exc:
            raise OcrUnavailable(f"the OCR process could not be started ({exc})") from None
        try:
            try:
                process.stdin.write(json.dumps(request) + "\n")  # the password never goes in argv
                process.stdin.close()
            except OSError:
                pass  # it died at once; its empty output says so
            yield from child_events(process, cancel, timeout_s=PAGE_TIMEOUT_S, poll_s=_POLL_S, lost=OcrFailed,
                                    words=_OCR_WORDS)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
            if process.returncode:
                stderr.seek(0)
                log.debug("ocr worker exited with %s: %s", process.returncode,
                          stderr.read()[-2000:].decode("utf-8", "replace"))




def recognised_note(recognised_pages: list[int], cited_pages: list[int | None]) -> str | None:
    """The caution for an answer whose evidence includes recognised text: "page 3 is recognised
    text (OCR): check the wording against the page image", or None when none of `cited_pages`
    (an answer's sources' pages, `Source.page`) is in `recognised_pages` (`Document.recognised_pages`)."""
    cited = sorted({page for page in cited_pages if page is not None and page in set(recognised_pages)})
    if not cited:
        return None
    from engine.documents.document import page_ranges

    verb = "is" if len(cited) == 1 else "are"
    return f"{page_ranges(cited)} {verb} recognised text (OCR): check the wording against the page image"
