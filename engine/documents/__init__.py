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
from pathlib import Path

# The types and errors live in engine.documents.document (the readers import them from there, not
# from this package, which imports the readers); re-exported here for everyone outside the package.
from engine.documents.document import (
    PDF_HEADER_WINDOW_BYTES, DamagedPdfError, Document, EmptyFileError, FileNotReadableError, NoTextFilesError, NoTextLayerError, NotPdfError,
    NotTextError, OutlineEntry, PasswordRequiredError, PointerFileError, ProgressCallback, Segment, SuspiciousPdfError,
    UnreadableTextError, UnsupportedEncryptionError, WrongPasswordError, os_reason, pointer_file_error,
)
from engine.errors import DocumentError  # noqa: F401 (re-exported: the base of every error above)

OPEN_DIALOG_SUFFIXES = (
    ".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".txt", ".md", ".markdown", ".rst", ".adoc", ".org", ".tex", ".csv", ".html", ".json", ".ipynb",
    ".toml", ".yaml", ".yml", ".ini", ".cfg", ".xml", ".sql", ".sh",
    ".py", ".js", ".jsx", ".ts", ".tsx", ".go", ".rs", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".java", ".kt",
    ".scala", ".swift", ".rb", ".php", ".lua", ".r", ".jl", ".dart", ".m", ".pl", ".hs", ".ex", ".erl", ".zig",
    # engine.documents.formats.FORMAT_SUFFIXES (written out: the dialog lists them without importing the readers)
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
            f"{display_name(source.name or source)}: not found or not reachable ({os_reason(exc)}): "
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


__all__ = [
    "Document", "Segment", "OutlineEntry", "load_document", "ProgressCallback", "FileNotReadableError",
    "EmptyFileError", "NotTextError", "NoTextFilesError", "NotPdfError", "PasswordRequiredError",
    "WrongPasswordError", "UnsupportedEncryptionError", "DamagedPdfError", "SuspiciousPdfError",
    "NoTextLayerError", "UnreadableTextError", "PointerFileError",
]
