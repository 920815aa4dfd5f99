"""Safe opening of the containers office documents come in: zip archives (DOCX, PPTX, XLSX, EPUB,
ODT, ODS, ODP) and OLE compound files (CFB: legacy .doc/.xls/.ppt, and encrypted OOXML files).

Every zip is checked from its central directory before any library opens it: at most
`MAX_ZIP_ENTRIES` entries and `MAX_UNCOMPRESSED_BYTES` declared uncompressed bytes (a zip bomb
declares gigabytes in a few kilobytes; Python's zipfile never inflates a member past its declared
size, so the declared sizes bound what is read). XML is parsed with `SAFE_XML_PARSER`: no DTD is
loaded, no entity is resolved (neither external ones, "XXE", nor internal ones, "billion laughs"),
and nothing is fetched from the network. Images and links a document names are never fetched:
nothing here follows a relationship whose target is outside the archive.

An encrypted Word, Excel or PowerPoint file is not a zip: Office wraps it in a CFB container with
an `EncryptionInfo` stream (MS-OFFCRYPTO 2.3.4), so the CFB signature on a .docx says "password".
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from lxml import etree

from engine.errors import DocumentError

MAX_ZIP_ENTRIES = 10_000
"""Entries a document's zip may hold: a 1,000-slide deck has ~5,000 parts; bombs hold millions."""

MAX_UNCOMPRESSED_BYTES = 1 << 30
"""Declared uncompressed bytes of all entries together (1 GiB): a 50 MB spreadsheet inflates to
~500 MB of XML; 42.zip declares 4.5 PB."""

MAX_PART_BYTES = 256 * 1024 * 1024
"""Declared uncompressed bytes of one entry of a format whose parts are parsed whole (Word,
PowerPoint, OpenDocument text, EPUB): lxml needs several times a part's size in memory.
Spreadsheets stream their sheets and are not held to it."""

MAX_DOCUMENT_FILE_BYTES = 200 * 1024 * 1024
"""Office, EPUB and OpenDocument files larger than this on disk are not opened (checked first)."""

CFB_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
"""The first 8 bytes of an OLE compound file (MS-CFB 2.2)."""

_ENCRYPTION_STREAM = "EncryptionInfo".encode("utf-16-le")

SAFE_XML_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                                  dtd_validation=False, huge_tree=False, remove_comments=True)
"""lxml parser for a document's XML: entities left unresolved, no DTD, no network."""

_LEGACY = {".doc": ("Word 97-2003", ".docx"), ".dot": ("Word 97-2003", ".docx"),
           ".xls": ("Excel 97-2003", ".xlsx"), ".xlt": ("Excel 97-2003", ".xlsx"),
           ".ppt": ("PowerPoint 97-2003", ".pptx"), ".pps": ("PowerPoint 97-2003", ".pptx"),
           ".pot": ("PowerPoint 97-2003", ".pptx")}
LEGACY_OFFICE_SUFFIXES = frozenset(_LEGACY)
"""Binary Office formats that are named, not read: the error says to save them as OOXML."""


class DamagedDocumentError(DocumentError):
    """An office, EPUB or OpenDocument file that cannot be read: truncated, not a zip, parts missing."""


class ProtectedDocumentError(DocumentError):
    """An Office file encrypted with a password (a CFB container with an EncryptionInfo stream)."""


class LegacyFormatError(DocumentError):
    """A binary Office 97-2003 file (.doc, .xls, .ppt): not read; save it as .docx, .xlsx, .pptx."""


class SuspiciousArchiveError(DocumentError):
    """A document's zip declares too many entries or too many uncompressed bytes (a zip bomb)."""


def legacy_error(name: str, suffix: str) -> LegacyFormatError:
    """The one-line error for a binary Office 97-2003 file called `name` with `suffix`."""
    what, modern = _LEGACY.get(suffix, ("older Office", ".docx, .xlsx or .pptx"))
    return LegacyFormatError(f"{name} is a {what} file, which Halaman does not read: open it in its program, "
                             f"save it as {modern} (File › Save As) and open that")


def open_archive(path: Path, name: str, *, streamed: bool = False) -> zipfile.ZipFile:
    """The zip at `path` after its central directory passed the bomb checks; `name` is what errors
    call it; `streamed`: its reader streams its large parts (no MAX_PART_BYTES check).

    Raises ProtectedDocumentError (an encrypted Office file), LegacyFormatError (a CFB file that is
    not encrypted: a binary Office file renamed), DamagedDocumentError (not a zip, truncated, too
    large on disk), SuspiciousArchiveError (over MAX_ZIP_ENTRIES or MAX_UNCOMPRESSED_BYTES).
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
            if head == CFB_SIGNATURE:
                window = head + handle.read(4 * 1024 * 1024)  # the directory sectors of a small CFB
                raise _cfb_error(name, path.suffix.lower(), _ENCRYPTION_STREAM in window)
    except OSError as exc:
        raise DamagedDocumentError(f"{name} cannot be read ({exc.strerror or type(exc).__name__}): "
                                   "check the file's permissions") from None
    if size > MAX_DOCUMENT_FILE_BYTES:
        raise DamagedDocumentError(f"{name} is too large ({size / (1 << 20):.0f} MiB > "
                                   f"{MAX_DOCUMENT_FILE_BYTES >> 20} MiB): split it or open a smaller file")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise DamagedDocumentError(f"{name} is damaged ({_zip_problem(head, exc)}): "
                                   "open it in its program and save it again") from None
    try:
        check_archive(archive, name, None if streamed else MAX_PART_BYTES)
    except SuspiciousArchiveError:
        archive.close()
        raise
    return archive


def check_archive(archive: zipfile.ZipFile, name: str, max_part_bytes: int | None = None) -> None:
    """Raise SuspiciousArchiveError when `archive`'s central directory declares more than
    MAX_ZIP_ENTRIES entries, MAX_UNCOMPRESSED_BYTES uncompressed bytes in all, or (given
    `max_part_bytes`) one entry larger than that."""
    entries = archive.infolist()
    if len(entries) > MAX_ZIP_ENTRIES:
        raise SuspiciousArchiveError(f"{name} was not opened: its zip holds {len(entries):,} entries "
                                     f"(more than {MAX_ZIP_ENTRIES:,}; a zip bomb?)")
    largest = max(entries, key=lambda entry: entry.file_size, default=None)
    if max_part_bytes is not None and largest is not None and largest.file_size > max_part_bytes:
        raise SuspiciousArchiveError(f"{name} was not opened: its part {largest.filename} unpacks to "
                                     f"{largest.file_size / (1 << 20):,.0f} MiB (more than {max_part_bytes >> 20} MiB; "
                                     "a zip bomb?)")
    total = sum(entry.file_size for entry in entries)
    if total > MAX_UNCOMPRESSED_BYTES:
        raise SuspiciousArchiveError(f"{name} was not opened: its zip unpacks to {total / (1 << 30):,.1f} GiB "
                                     f"(more than {MAX_UNCOMPRESSED_BYTES >> 30} GiB; a zip bomb?)")


def read_member(archive: zipfile.ZipFile, member: str, name: str) -> bytes:
    """The bytes of `member` of `archive`; DamagedDocumentError naming `name` when it is missing or broken."""
    try:
        return archive.read(member)
    except KeyError:
        raise DamagedDocumentError(f"{name} is damaged (its part {member} is missing): "
                                   "open it in its program and save it again") from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise DamagedDocumentError(f"{name} is damaged (part {member}: {exc}): "
                                   "open it in its program and save it again") from None


def parse_xml(data: bytes, member: str, name: str) -> etree._Element:
    """`data` parsed with SAFE_XML_PARSER; DamagedDocumentError naming `name` and `member` when it is not XML."""
    try:
        root = etree.fromstring(data, SAFE_XML_PARSER)
    except etree.XMLSyntaxError as exc:
        raise DamagedDocumentError(f"{name} is damaged (part {member} is not well-formed XML: {exc.msg}): "
                                   "open it in its program and save it again") from None
    if root is None:
        raise DamagedDocumentError(f"{name} is damaged (part {member} is empty): open it in its program and save it again")
    return root


def _cfb_error(name: str, suffix: str, encrypted: bool) -> DocumentError:
    if encrypted or suffix not in LEGACY_OFFICE_SUFFIXES:
        return ProtectedDocumentError(f"{name} is password-protected (encrypted): Halaman cannot open it; "
                                      "open it in its program, remove the password and open the saved copy")
    return legacy_error(name, suffix)


def _zip_problem(head: bytes, exc: BaseException) -> str:
    if not head:
        return "the file is empty"
    if not head.startswith(b"PK"):
        return "it is not a zip archive, as this format must be"
    return f"an incomplete or broken zip archive, truncated? ({exc})"
