"""Documents: turn a PDF, a code repository, a text file or a web page into page- or file-sized segments.

`load_document(path)` is the one entry point. Every segment's text is normalised by
`engine.documents.text.normalize_text`, so the same file always renders to the same string (and
therefore the same token ids and prefix-cache keys). Everything that was left out is listed in
`Document.warnings`; nothing is skipped silently. The case ids on the errors (P02, S05, …) are the
test-corpus inputs that raise them: docs/CORPUS.md.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from engine.errors import DocumentError

ProgressCallback = Callable[[int, int], None]
"""progress(units_done, units_total): pages for PDFs, files for repositories."""


class FileNotReadableError(DocumentError):
    """The path does not exist, is not a regular file or folder, or may not be read."""


class EmptyFileError(DocumentError):
    """The file has 0 bytes (S06: an interrupted download or copy)."""


class NotTextError(DocumentError):
    """A single file given as text is binary (NUL bytes) or holds no text after normalisation."""


class NoTextFilesError(DocumentError):
    """A folder contains no file that can be read as text."""


class NotPdfError(DocumentError):
    """A .pdf file has no %PDF header (S05: an HTML error page saved as .pdf)."""


class PasswordRequiredError(DocumentError):
    """The PDF needs a user password and none was given (P02, P04). Ask for one."""


class WrongPasswordError(DocumentError):
    """The password given does not open the PDF (P02, P04). Ask again."""


class UnsupportedEncryptionError(DocumentError):
    """The PDF uses a security handler the reader does not implement (e.g. certificates)."""


class DamagedPdfError(DocumentError):
    """The PDF cannot be parsed: truncated (S04), broken beyond repair (P08), bad page tree (S03)."""


class SuspiciousPdfError(DocumentError):
    """Pages needed more memory or time than allowed (S01 flate bomb) and nothing else was read."""


class NoTextLayerError(DocumentError):
    """No page has a text layer: a scan or photos (P09). Needs OCR first."""


class UnreadableTextError(DocumentError):
    """Every page's text is noise: fonts without a Unicode map. Needs OCR first."""


class PointerFileError(DocumentError):
    """The file is a Git LFS or git-annex pointer, not the file's content (B30): its tool fetches it."""


def pointer_file_error(path: Path, tool: str, fetch: str) -> PointerFileError:
    """The one-line error for a pointer file opened as a document (`pointers.PointerKind`'s fields)."""
    from engine.documents.names import display_name

    return PointerFileError(f"{display_name(path.name)} is a {tool} pointer, not the file: its content was not "
                            f"downloaded; run `{fetch}` in its repository, then open it again")


MAX_LABEL_CHARS = 24
"""A PDF's printed page label longer than this is cut: real ones are a few characters ("xiv",
"A-12"), and a hostile file could make one as long as a page."""


@dataclass(frozen=True)
class Segment:
    """One citable unit of a document: a PDF page or a repository file.

    text: normalised text (see `normalize_text`), never empty.
    label: what a citation shows, "page 12" or "src/app.py".
    page: 1-based physical page number for PDFs (not the printed page label), the unit's 1-based
    number for the formats of `engine.documents.formats` (slide 7 is 7), else None.
    path: repository-relative POSIX path for repository files, else None.
    printed: a PDF page's printed label from the file's /PageLabels ("iii", "48"), else None. Display
    only (`shown`): `label` and `page` stay the physical page, the key everywhere and the marker
    the model reads.
    """

    text: str
    label: str
    page: int | None
    path: str | None
    printed: str | None = None

    @property
    def shown(self) -> str:
        """How a reader is shown this unit: "page 48 (PDF page 68)" where the printed label differs
        from the physical number, "page iii (PDF page 3)" for a roman one, else `label`."""
        if not self.printed or self.page is None or self.printed == str(self.page):
            return self.label
        return f"page {self.printed} (PDF page {self.page})"


@dataclass(frozen=True)
class OutlineEntry:
    """One entry of a PDF's outline (its bookmarks, as a viewer's sidebar shows them), or of a
    format's headings (`page` is then the unit's number: `Segment.page`).

    title: the entry's text (normalised, one line; document text, so untrusted: shown as plain
    text only). level: 0 for top-level entries. page: the 1-based physical page it points to.
    """

    title: str
    level: int
    page: int


@dataclass
class Document:
    """A loaded document: its segments in reading order plus what the user should know.

    kind: "pdf" | "repo" | "text", or the format of an office document, e-book or table whose
    units are labelled ("docx", "pptx", "xlsx", "ods", "csv", "epub", "odt", "odp", "rtf":
    `engine.documents.formats`). source: absolute path of the file or folder.
    warnings: user-facing lines, e.g. "page 7: no text layer (scanned?)" or
    "skipped (minified): static/vendor.min.js". pages: PDFs only, total page count including
    blank pages and pages that were left out. outline: a PDF's bookmarks, or the headings,
    chapters or slide titles of the formats' units, in document order (empty when it has none); not part of `render()`, so of no prefix key.
    An image (PNG, JPEG, a multi-page TIFF) is kind "pdf" too: its frames are its pages.
    recognised_pages: 1-based pages whose text was recognised from the page image (OCR), not read
    from a text layer; `engine.documents.ocr.cached_page` gives their lines' boxes.
    """

    title: str
    source: str
    kind: str
    segments: list[Segment]
    warnings: list[str] = field(default_factory=list)
    pages: int | None = None
    outline: list[OutlineEntry] = field(default_factory=list)
    recognised_pages: list[int] = field(default_factory=list)

    def shown_labels(self) -> dict[str, str]:
        """{segment label: how a reader is shown it} for the units whose printed name differs
        (`Segment.shown`: "page 68" -> "page 48 (PDF page 68)"); empty for most documents."""
        return {s.label: s.shown for s in self.segments if s.shown != s.label}

    def marker(self, segment: Segment) -> str:
        """The line before `segment` in `render()`: "[page 12]" or "=== src/app.py ===". """
        return f"[{segment.label}]" if self.kind == "pdf" else f"=== {segment.label} ==="

    def render(self) -> str:
        """The text fed to the model: each segment after its marker line, separated by a blank line.

        Deterministic: the same document always renders to the same string.
        """
        return "\n\n".join(f"{self.marker(s)}\n{s.text}" for s in self.segments) + "\n"

    def offsets(self) -> list[tuple[int, int]]:
        """Where each segment lies in `render()`: (its marker line's first character, its text's
        first character), in segment order."""
        found, char = [], 0
        for segment in self.segments:
            text = char + len(self.marker(segment)) + 1
            found.append((char, text))
            char = text + len(segment.text) + 2  # the blank line between segments
        return found


OPEN_DIALOG_SUFFIXES = (
    ".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".txt", ".md", ".markdown", ".rst", ".adoc", ".org", ".tex", ".csv", ".html", ".json", ".ipynb",
    ".toml", ".yaml", ".yml", ".ini", ".cfg", ".xml", ".sql", ".sh",
    ".py", ".js", ".jsx", ".ts", ".tsx", ".go", ".rs", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".java", ".kt",
    ".scala", ".swift", ".rb", ".php", ".lua", ".r", ".jl", ".dart", ".m", ".pl", ".hs", ".ex", ".erl", ".zig",
    # engine.documents.formats.FORMAT_SUFFIXES (not imported here: that module imports this one)
    ".docx", ".docm", ".dotx", ".dotm", ".pptx", ".pptm", ".ppsx", ".potx", ".xlsx", ".xlsm", ".xltx", ".tsv",
    ".odt", ".ods", ".odp", ".epub", ".rtf",
)
"""What a file dialog offers under "Documents": PDFs, office documents, e-books, tables, notebooks,
prose and the source files a folder is read for. `load_document` opens any other text file too (the dialog's "All files")."""


def load_document(path: str | os.PathLike[str], *, password: str | None = None,
                  progress: ProgressCallback | None = None,
                  cancel: threading.Event | None = None,
                  include_generated: bool = False) -> Document:
    """Load a folder (as a repository), a PDF (scanned pages recognised by OCR), an image (PNG,
    JPEG, TIFF …: its text recognised, `engine.documents.image`), or a single text file (a
    notebook's cells, a web page's shown text: `plain.read_file`).

    A PDF is recognised by its `.pdf` suffix or a `%PDF-` header anywhere in the first 1,024 bytes
    (junk or a byte-order mark before it is allowed, as readers allow). `password` is used for
    PDFs only.
    `progress(done, total)` is called from this thread as pages or files are read; setting
    `cancel` stops the work. `include_generated` also reads a repository's lock files and
    generated or vendored files (see `engine.documents.generated`).

    Raises a `DocumentError` subclass whose `str()` is one line naming the file, the problem and
    what to do (see `engine.documents.pdf` for the PDF ones), or `engine.errors.Cancelled`.
    """
    from engine.documents.names import display_name  # it imports this package

    source = Path(path).expanduser()
    try:
        source = source.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on older Pythons
        raise FileNotReadableError(
            f"{display_name(source.name or source)}: not found or not reachable ({_reason(exc)}): "
            "check the path") from None
    if source.is_dir():
        from engine.documents.repo import load_repository

        return load_repository(source, progress=progress, cancel=cancel, include_generated=include_generated)
    if not source.is_file():
        raise FileNotReadableError(
            f"{display_name(source.name)}: not a regular file or folder: choose a file or a folder")
    pointer = _pointer_kind(source)
    if pointer is not None:  # before the suffix decides: `report.pdf` may be one
        raise pointer_file_error(source, pointer.tool, pointer.fetch)
    # Office documents, e-books, OpenDocument, RTF and tables, by suffix (engine.documents.formats).
    from engine.documents.formats import format_loader

    loader = format_loader(source)
    if loader is not None:
        return loader(source, display_name(source.name), progress=progress, cancel=cancel)
    # (end of the formats branch)
    if source.suffix.lower() == ".pdf" or _has_pdf_header(source):
        from engine.documents.pdf import load_pdf

        return load_pdf(source, password=password, progress=progress, cancel=cancel)
    # Images: their text is recognised (OCR), each frame a page.
    from engine.documents.image import is_image, load_image

    if is_image(source):
        return load_image(source, progress=progress, cancel=cancel)
    from engine.documents.plain import load_text_file

    return load_text_file(source, progress=progress, cancel=cancel)


PDF_HEADER_WINDOW_BYTES = 1024
"""Where a `%PDF-` header may start (ISO 32000 implementation note; PDFium and pypdf accept it)."""


# The header starts the file or a line, or follows a byte-order mark or binary junk; a text file
# that mentions "%PDF-1.7" inside a sentence stays a text file.
_PDF_HEADER = re.compile(rb"(?:\A|[\r\n]|\xef\xbb\xbf|[\x00-\x08])%PDF-\d")


def _has_pdf_header(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return _PDF_HEADER.search(handle.read(PDF_HEADER_WINDOW_BYTES)) is not None
    except OSError:
        return False  # the loader that runs next reports the read error with its own wording


def _pointer_kind(path: Path):
    """`pointers.pointer_kind` of a small file, else None."""
    from engine.documents.pointers import MAX_POINTER_BYTES, pointer_kind

    try:
        if path.stat().st_size >= MAX_POINTER_BYTES:
            return None
        with path.open("rb") as handle:
            return pointer_kind(handle.read(MAX_POINTER_BYTES))
    except OSError:
        return None  # the loader that runs next reports the read error


def _reason(exc: BaseException) -> str:
    """A short, lower-case reason for an OS error, without the path Python appends."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__


__all__ = [
    "Document", "Segment", "OutlineEntry", "load_document", "ProgressCallback", "FileNotReadableError",
    "EmptyFileError", "NotTextError", "NoTextFilesError", "NotPdfError", "PasswordRequiredError",
    "WrongPasswordError", "UnsupportedEncryptionError", "DamagedPdfError", "SuspiciousPdfError",
    "NoTextLayerError", "UnreadableTextError", "PointerFileError",
]
