"""Text files (.txt, .md, source code, notebooks, web pages): safe reading, shared with repo.py.
Case ids (R02, R03, R06) are the repository cases of docs/CORPUS.md.

`read_text` never blocks on a device or FIFO, never reads more than `MAX_WITH_DATA_BYTES` (and
keeps no more than `MAX_FILE_BYTES` of text), and never follows a symlink; the reasons it refuses a file are returned as short phrases that the
repository loader lists in `Document.warnings` ("skipped (binary): assets/logo.png").
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.documents.document import (
    Document, EmptyFileError, FileNotReadableError, NotTextError, ProgressCallback, Segment,
    os_reason, pointer_file_error,
)
from engine.documents.encoding import (
    UnclearEncodingError, bom_encoding, decode_bytes, utf16_without_bom,
)
from engine.documents.html import HTML_SUFFIXES, html_text
from engine.documents.notebook import MAX_NOTEBOOK_BYTES, NOTEBOOK_SUFFIX, NotebookError, notebook_text
from engine.documents.payloads import Dropped, drop_payloads
from engine.documents.pointers import PointerKind, pointer_kind
from engine.documents.text import normalize_and_count
from engine.errors import Cancelled

MAX_FILE_BYTES = 2 * 1024 * 1024
"""Files larger than this are not read (checked with stat first; R06: a 480 MB file
committed by accident crashed repomix), unless base64 data is what makes them large
(MAX_WITH_DATA_BYTES). 2 MiB of text is ~500k tokens, beyond any budget."""

MAX_WITH_DATA_BYTES = 20 * 1024 * 1024
"""A text file over MAX_FILE_BYTES is still read, up to this size, when it holds base64 data
(`payloads`: a photo pasted into a Markdown note, a PDF attached to it, fonts in CSS), and its
text without that data fits MAX_FILE_BYTES."""

MAX_HTML_BYTES = 20 * 1024 * 1024
"""Web pages may be this large: a saved page carries its images as base64 (B17: 146 kB of 154 kB),
and they are dropped. A 17 MiB page (a 16 MiB image, 20,000 paragraphs) took 2.8 s to read."""

CONVERTED_SUFFIXES = HTML_SUFFIXES | {NOTEBOOK_SUFFIX}
"""Files whose text is made from markup (`read_file`): what the model sees is not their source."""

SNIFF_BYTES = 8 * 1024
"""Binary sniffing window: NULs anywhere in it mean binary (git also looks at 8000 bytes)."""

_BINARY_CONTROL_SHARE = 0.3


def looks_binary(window: bytes) -> bool:
    """Whether the first bytes of a file (8 KiB is enough) say it is not text.

    Binary: a NUL byte anywhere in the window, unless a UTF-16/32 byte-order mark explains it
    (R02: the fixture's data/late-binary.dat has its first NUL after 2.8 KB, so 512 B or 1 KB windows
    miss it), or over 30% control characters. The window is decoded with an incremental decoder,
    so a multi-byte character cut by the end of the window is not mistaken for binary
    (gitingest #578, docs/boundary.md in the fixture). UTF-16 without a BOM is recognised
    before this is asked (`encoding.utf16_without_bom`).
    """
    if bom_encoding(window) in ("utf-16", "utf-32"):
        return False
    if b"\x00" in window:
        return True
    try:
        sample = codecs.getincrementaldecoder("utf-8")().decode(window, final=False)
    except UnicodeDecodeError:
        sample = window.decode("latin-1")
    controls = sum(1 for ch in sample if ch < " " and ch not in "\t\n\r\f\x1b")
    return bool(sample) and controls / len(sample) > _BINARY_CONTROL_SHARE


# O_NOFOLLOW: never read through a link; O_NONBLOCK: opening a FIFO must not wait for a writer.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_BINARY", 0))


@dataclass(frozen=True)
class TextFile:
    """A decoded, normalised file, or why it was not read.

    text: normalised text (empty when skipped). skipped: reason phrase for warnings, e.g.
    "binary" or "too large: 60 MiB > 2 MiB", or None. code: the reason as one word ("special",
    "too_large", "binary", "unreadable", "empty", "encoding", "pointer"). fallback: legacy
    codec used when the file was not Unicode ("cp1252", "gb18030"), else None. replaced: bytes of
    a UTF-8 file that were not UTF-8 (`encoding.decode_bytes`). hidden: characters removed that
    can hide text from a reader (`text.normalize_and_count`). dropped: embedded data left out
    (`payloads.drop_payloads`). pointer: the tool whose pointer file this is (code "pointer").
    nul_padding: NUL bytes cut from the end of a text file (a log a crash left padded).
    """

    text: str
    skipped: str | None = None
    code: str | None = None
    fallback: str | None = None
    replaced: int = 0
    hidden: int = 0
    dropped: Dropped = Dropped()
    pointer: PointerKind | None = None
    nul_padding: int = 0  # NUL bytes cut from the end (`_without_nul_padding`)

    @property
    def notes(self) -> list[str]:
        """The warning phrases about what was done to the file's text: "decoded with fallback
        (gb18030)" or "3 bytes not UTF-8 replaced", "embedded data left out (1 data: URI, 1.2 MiB)",
        "96 invisible characters removed (they can hide text from a reader)"."""
        notes = []
        if self.fallback:
            notes.append(f"decoded with fallback ({self.fallback})")
        elif self.replaced:
            notes.append(f"{self.replaced} byte{'s' if self.replaced > 1 else ''} not UTF-8 replaced")
        if self.dropped:
            notes.append(self.dropped.note)
        if self.hidden:
            notes.append(f"{self.hidden} invisible character{'s' if self.hidden > 1 else ''} removed "
                         "(they can hide text from a reader)")
        if self.nul_padding:
            notes.append(f"{self.nul_padding:,} NUL bytes at the end left out (padding a crash or a "
                         "preallocating writer left)")
        return notes


def _skip(code: str, phrase: str) -> TextFile:
    return TextFile("", skipped=phrase, code=code)


def read_text(path: Path, max_bytes: int | None = None) -> TextFile:
    """Read one regular file as text without following symlinks or blocking on special files.

    Skip phrases: "not a regular file", "too large: 60 MiB > 2 MiB", "binary",
    "unreadable: permission denied", "empty", "encoding not clear, best guess cp1125 or cp1251",
    "Git LFS pointer", "git-annex pointer". Does not raise for any of them. Embedded data is
    dropped here only from a file over `max_bytes` (up to MAX_WITH_DATA_BYTES), to see whether
    the rest fits; else `read_file` drops it, after a notebook's or a page's text is made.
    `max_bytes` defaults to MAX_FILE_BYTES (read at call time, so tests can lower it).
    """
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    limit = max(max_bytes, MAX_WITH_DATA_BYTES)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return _skip("unreadable", f"unreadable: {os_reason(exc)}")
    try:
        info = os.fstat(fd)
        # fstat on the opened descriptor, not the name: the file cannot be swapped for a FIFO
        # or a device between the check and the read.
        if not stat.S_ISREG(info.st_mode):
            return _skip("special", "not a regular file")
        too_large = _skip("too_large", f"too large: {_size(info.st_size)} > {_size(max_bytes)}")
        if info.st_size > limit:
            return too_large
        data = _read_at_most(fd, limit + 1)
    except OSError as exc:
        return _skip("unreadable", f"unreadable: {os_reason(exc)}")
    finally:
        os.close(fd)
    if len(data) > limit:  # grew after fstat
        return _skip("too_large", f"too large: over {_size(max_bytes)}")
    oversize = len(data) > max_bytes
    if oversize and b"base64," not in data:
        return too_large
    pointer = pointer_kind(data)
    if pointer is not None:
        return TextFile("", skipped=f"{pointer.tool} pointer", code="pointer", pointer=pointer)
    data, nul_padding = _without_nul_padding(data)
    if not utf16_without_bom(data) and looks_binary(data[:SNIFF_BYTES]):
        return _skip("binary", "binary")
    try:
        decoded = decode_bytes(data)
    except UnclearEncodingError as error:
        return _skip("encoding", str(error))
    text, hidden = normalize_and_count(decoded.text)
    dropped = Dropped()
    if oversize:
        text, dropped = drop_payloads(text)
        if len(text.encode("utf-8")) > max_bytes:
            return too_large
    if not text:
        return _skip("empty", "empty")
    return TextFile(text, fallback=decoded.fallback, replaced=decoded.replaced, hidden=hidden, dropped=dropped,
                    nul_padding=nul_padding)


def _without_nul_padding(data: bytes) -> tuple[bytes, int]:
    """(`data` without the run of NUL bytes at its end, how many) when NUL appears nowhere else: a
    log whose writer crashed after the file was extended (ext4 and NTFS zero-fill the unwritten
    blocks; journald, syslog and Java loggers preallocate). A NUL before the run, or UTF-16/32 text
    (where NULs are half its bytes), leaves `data` as it is: binary sniffing decides."""
    if not data.endswith(b"\x00") or utf16_without_bom(data) or bom_encoding(data) in ("utf-16", "utf-32"):
        return data, 0
    text = data.rstrip(b"\x00")
    if not text.strip() or b"\x00" in text:
        return data, 0
    return text, len(data) - len(text)


def read_notebook(path: Path) -> TextFile:
    """A Jupyter notebook's cells as text (`notebook.notebook_text`), read like `read_text` but up
    to MAX_NOTEBOOK_BYTES. Extra skip phrase: "unreadable notebook: not valid JSON (...)"."""
    result = read_text(path, max_bytes=MAX_NOTEBOOK_BYTES)
    if result.skipped is not None:
        return result
    try:
        return _converted(result, notebook_text(result.text))
    except NotebookError as error:
        return _skip("unreadable", f"unreadable notebook: {error}")


def read_html(path: Path) -> TextFile:
    """A web page's text as a browser shows it (`html.html_text`), read like `read_text` but up to
    MAX_HTML_BYTES."""
    result = read_text(path, max_bytes=MAX_HTML_BYTES)
    if result.skipped is not None:
        return result
    return _converted(result, html_text(result.text))


def _converted(source: TextFile, text: str) -> TextFile:
    """The text made from a file's markup, normalised again: JSON escapes and HTML character
    references can spell characters that the source did not hold as such (\\udb40\\udc49, &#xE0049;)."""
    text, hidden = normalize_and_count(text)
    return (TextFile(text, fallback=source.fallback, replaced=source.replaced, hidden=source.hidden + hidden)
            if text else _skip("empty", "empty"))


def read_file(path: Path) -> TextFile:
    """The text of one file by its kind: a notebook's cells, a web page's shown text, else the
    file as text (`read_text`); embedded data (base64 images, fonts, attachments) replaced by a
    placeholder in each (`payloads.drop_payloads`)."""
    suffix = path.suffix.lower()
    if suffix == NOTEBOOK_SUFFIX:
        result = read_notebook(path)
    else:
        result = read_html(path) if suffix in HTML_SUFFIXES else read_text(path)
    if result.skipped is not None:
        return result
    text, dropped = drop_payloads(result.text)
    return dataclasses.replace(result, text=text, dropped=dropped) if dropped else result


def regular_file_bytes(path: Path, limit: int = MAX_WITH_DATA_BYTES) -> bytes | None:
    """The bytes of `path` read as `read_text` reads them (never through a link, never waiting on a
    special file); None when it is no regular file, cannot be read or holds more than `limit` bytes."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = _read_at_most(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n_bytes} bytes"


def load_text_file(path: Path, *, progress: ProgressCallback | None = None,
                   cancel: threading.Event | None = None) -> Document:
    """Load one text file (absolute `path`) as a one-segment document labelled with its name.

    Raises EmptyFileError (0 bytes or only whitespace/control characters), NotTextError (binary,
    too large, or an encoding that cannot be told: "minutes.txt: the text encoding is not clear
    (best guess cp1125 or cp1251): save it as UTF-8 and open it again"), PointerFileError,
    FileNotReadableError, or Cancelled.
    """
    if cancel is not None and cancel.is_set():
        raise Cancelled("Reading the file was cancelled.")
    if progress:
        progress(0, 1)
    result = read_file(path)
    from engine.documents.names import display_name  # names imports this module

    name = display_name(path.name)
    if result.pointer is not None:
        raise pointer_file_error(path, result.pointer.tool, result.pointer.fetch)
    if result.code == "empty":
        raise EmptyFileError(f"{name} is empty (no text in it): choose another file")
    if result.code == "binary":
        raise NotTextError(f"{name} is not a text file (it contains binary data): "
                           "open a PDF, a text file or a folder")
    if result.code == "too_large":
        size = (result.skipped or "").removeprefix("too large: ")
        raise NotTextError(f"{name} is too large ({size}): split it or open a smaller file")
    if result.code == "encoding":
        guess = (result.skipped or "").removeprefix("encoding not clear").removeprefix(", ") or "no guess"
        raise NotTextError(f"{name}: the text encoding is not clear ({guess}): "
                           "save it as UTF-8 and open it again")
    if (result.skipped or "").startswith("unreadable notebook: "):
        reason = result.skipped.removeprefix("unreadable notebook: ")
        raise NotTextError(f"{name} is not a readable notebook ({reason}): open and save it again in Jupyter")
    if result.code is not None:
        reason = (result.skipped or "").removeprefix("unreadable: ")
        raise FileNotReadableError(f"{name} cannot be read ({reason}): check the file's permissions")
    warnings = [f"{note}: {name}" for note in result.notes]
    if progress:
        progress(1, 1)
    return Document(title=name, source=str(path), kind="text",
                    segments=[Segment(text=result.text, label=name, page=None, path=None)],
                    warnings=warnings)
