"""Which reader opens an office document, an e-book, an OpenDocument file, RTF or a table.

`format_loader(path)` picks by the file's suffix (and, for the binary Office 97-2003 names, by its
first bytes: Word saves RTF and HTML under .doc too). Each reader lives in its own module and
returns a `Document` of labelled units (`parts.build_document`); every zip-based format is opened
through `containers.open_archive`'s checks first.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Callable

from engine.documents.document import Document, ProgressCallback

Loader = Callable[..., Document]

DOCX_SUFFIXES = (".docx", ".docm", ".dotx", ".dotm")
PPTX_SUFFIXES = (".pptx", ".pptm", ".ppsx", ".potx")
XLSX_SUFFIXES = (".xlsx", ".xlsm", ".xltx")
TABLE_SUFFIXES = (".csv", ".tsv")
ODF_SUFFIXES = (".odt", ".ods", ".odp")
EPUB_SUFFIXES = (".epub",)
RTF_SUFFIXES = (".rtf",)

FORMAT_SUFFIXES = (*DOCX_SUFFIXES, *PPTX_SUFFIXES, *XLSX_SUFFIXES, *TABLE_SUFFIXES, *ODF_SUFFIXES,
                   *EPUB_SUFFIXES, *RTF_SUFFIXES)
"""What the readers here open (a file dialog offers them under "Documents")."""


def format_loader(path: Path) -> Loader | None:
    """The reader for the file at `path`, called as `loader(path, name, progress=, cancel=)`, or
    None when it is none of these formats. A binary Office 97-2003 name (.doc, .xls, .ppt) gets a
    reader that says to save the file as .docx, .xlsx or .pptx (or reads it, when it is RTF or
    OOXML under the old name). Errors: the loaders' `DocumentError`s, and DamagedDocumentError for
    anything else a malformed file makes a library raise."""
    loader = _loader(path)
    return None if loader is None else functools.partial(_guarded, loader)


def _guarded(loader: Loader, path: Path, name: str, **kwargs) -> Document:
    """`loader(path, name, **kwargs)`, with any error that is not Halaman's (a library meeting a
    malformed part: AttributeError, IndexError, RecursionError …) turned into one line naming the
    file: a document is untrusted input, and a damaged one must not end in a traceback."""
    from engine.documents.containers import DamagedDocumentError
    from engine.errors import HalamanError

    try:
        return loader(path, name, **kwargs)
    except (HalamanError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        raise DamagedDocumentError(f"{name} is damaged or malformed ({type(exc).__name__}: {str(exc)[:120]}): "
                                   "open it in its program and save it again") from exc


def _loader(path: Path) -> Loader | None:
    from engine.documents.containers import LEGACY_OFFICE_SUFFIXES

    suffix = path.suffix.lower()
    if suffix in LEGACY_OFFICE_SUFFIXES:
        return _legacy_loader(path, suffix)
    if suffix in DOCX_SUFFIXES:
        from engine.documents.office_docx import load_docx
        return load_docx
    if suffix in PPTX_SUFFIXES:
        from engine.documents.office_pptx import load_pptx
        return load_pptx
    if suffix in XLSX_SUFFIXES:
        from engine.documents.sheets import load_xlsx
        return load_xlsx
    if suffix in TABLE_SUFFIXES:
        from engine.documents.sheets import load_delimited
        return load_delimited
    if suffix in ODF_SUFFIXES:
        from engine.documents.odf import load_odf
        return load_odf
    if suffix in EPUB_SUFFIXES:
        from engine.documents.epub import load_epub
        return load_epub
    if suffix in RTF_SUFFIXES:
        from engine.documents.rtf import load_rtf
        return load_rtf
    return None


def _legacy_loader(path: Path, suffix: str) -> Loader | None:
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError:
        return None  # the text reader reports it
    if head.startswith(b"{\\rtf"):
        from engine.documents.rtf import load_rtf
        return load_rtf
    if head.startswith(b"PK"):
        modern = {".doc": ".docx", ".dot": ".docx", ".xls": ".xlsx", ".xlt": ".xlsx"}.get(suffix, ".pptx")
        return _loader(path.with_suffix(modern))
    if head.startswith(b"\xd0\xcf\x11\xe0"):
        return _refuse_legacy
    return None  # HTML or text saved under an old name: the text reader opens it


def _refuse_legacy(path: Path, name: str, *, progress: ProgressCallback | None = None,
                   cancel: threading.Event | None = None) -> Document:
    from engine.documents.containers import CFB_SIGNATURE, ProtectedDocumentError, legacy_error

    with path.open("rb") as handle:
        data = handle.read(4 * 1024 * 1024)
    if data.startswith(CFB_SIGNATURE) and "EncryptionInfo".encode("utf-16-le") in data:
        raise ProtectedDocumentError(f"{name} is password-protected (encrypted): Halaman cannot open it; "
                                     "open it in its program, remove the password and open the saved copy")
    raise legacy_error(name, path.suffix.lower())
