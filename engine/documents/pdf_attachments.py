"""Files embedded in a PDF (its attachments panel): text ones read, every other one named.

A PDF can carry whole files: the spreadsheet behind a report's table, the CSV of a form's data, a
contract's annexes (ISO 32000-1 7.11.4, the EmbeddedFiles name tree; PDF/A-3 invoices carry their
XML this way). No page shows them, so until now they were neither read nor mentioned and a
question about them was answered from the pages alone (issue 45).

In the PDF worker, after the last page, `attachments` lists them with PDFium and decodes the
text ones (by name: TEXT_SUFFIXES; read when at most MAX_ATTACHMENT_BYTES, MAX_READ in all;
PDFium decodes a stream to tell its size, so a flate bomb among them ends the worker under its
memory cap after every page has arrived, and the document says its embedded files could not be
listed). Nothing else is opened: a PDF
inside a PDF is not parsed (no recursion at all), an archive is not unpacked, nothing is run.
In the app, `attachment_parts` turns the worker's list into segments labelled "attachment NAME"
and one warning naming every attachment that was not read, with the reason and what to do.
"""

from __future__ import annotations

import ctypes
from typing import Any

from engine.documents.document import Segment
from engine.documents.encoding import UnclearEncodingError, decode_bytes
from engine.documents.names import display_name
from engine.documents.text import normalize_text

TEXT_SUFFIXES = (".txt", ".csv", ".tsv", ".md", ".markdown")
"""Attachments read as text, by the end of their name; any other kind is only named."""

MAX_ATTACHMENT_BYTES = 1 << 20
"""Largest attachment read (1 MiB, decoded size as PDFium reports it); larger ones are named."""

MAX_READ = 20
"""At most this many attachments are read; at most MAX_LISTED are listed in all (a hostile file
can embed thousands)."""

MAX_LISTED = 200
_SHOWN_NAMES = 8  # names a warning lists before "and N more"


def attachments(document: Any, pdfium: Any) -> list[dict[str, Any]]:
    """The embedded files of `document` (a pypdfium2 `PdfDocument`), in the worker:
    [{"name": str, "size": bytes or None, "text": str or None, "why": why it was not read or
    None}], at most MAX_LISTED. Never raises: an attachment PDFium cannot read is listed with why."""
    found: list[dict[str, Any]] = []
    try:
        count = min(document.count_attachments(), MAX_LISTED)
    except Exception:  # noqa: BLE001 - a broken name tree must not cost the pages
        return found
    for index in range(count):
        try:
            attachment = document.get_attachment(index)
            name = attachment.get_name() or f"attachment {index + 1}"
        except Exception:  # noqa: BLE001
            found.append({"name": f"attachment {index + 1}", "size": None, "text": None,
                          "why": "PDFium cannot read it"})
            continue
        if not name.lower().endswith(TEXT_SUFFIXES):
            # Not decoded at all, not even for its size: only text ones are worth the memory.
            found.append({"name": name, "size": None, "text": None, "why": "not a text file"})
            continue
        size = _size(attachment, pdfium)
        text, why = None, _why_not_read(size, sum(1 for item in found if item["text"] is not None))
        if why is None:
            text, why = _text(attachment)
        found.append({"name": name, "size": size, "text": text, "why": why})
    return found


def _size(attachment: Any, pdfium: Any) -> int | None:
    length = ctypes.c_ulong()
    try:
        if pdfium.raw.FPDFAttachment_GetFile(attachment.raw, None, 0, ctypes.byref(length)):
            return int(length.value)
        return int(length.value) or None
    except Exception:  # noqa: BLE001
        return None


def _why_not_read(size: int | None, already_read: int) -> str | None:
    if size is None:
        return "PDFium cannot read it"
    if size > MAX_ATTACHMENT_BYTES:
        return f"over {MAX_ATTACHMENT_BYTES >> 20} MiB"
    if already_read >= MAX_READ:
        return f"only {MAX_READ} attachments are read"
    return None


def _text(attachment: Any) -> tuple[str | None, str | None]:
    try:
        data = bytes(attachment.get_data())
    except Exception:  # noqa: BLE001 - includes an empty attachment
        return None, "PDFium cannot read it"
    if b"\x00" in data[:8192] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None, "not a text file"
    try:
        return decode_bytes(data).text, None
    except UnclearEncodingError:
        return None, "its encoding is unclear"


def attachment_parts(listed: list[dict[str, Any]], pdf_name: str) -> tuple[list[Segment], list[str]]:
    """(Segments of the attachments read, labelled "attachment NAME"; warnings) from the worker's
    list. `pdf_name`: the PDF's file name, for the warning."""
    segments: list[Segment] = []
    unread: list[str] = []
    for item in listed:
        name = display_name(str(item.get("name") or "attachment"))
        text = normalize_text(item["text"]) if item.get("text") else ""
        if text.strip():
            segments.append(Segment(text=text, label=f"attachment {name}", page=None, path=None))
        else:
            why = item.get("why") or "it is empty"
            unread.append(f"{name} ({_size_text(item.get('size'))}{why})")
    warnings = []
    if segments:
        warnings.append(f"{len(segments)} file{'s' if len(segments) > 1 else ''} embedded in {pdf_name} read as "
                        f"extra parts: " + ", ".join(segment.label[len('attachment '):] for segment in segments))
    if unread:
        shown = ", ".join(unread[:_SHOWN_NAMES]) + (f" and {len(unread) - _SHOWN_NAMES} more"
                                                  if len(unread) > _SHOWN_NAMES else "")
        warnings.append(f"{len(unread)} file{'s' if len(unread) > 1 else ''} embedded in {pdf_name} not read: "
                        f"{shown}; to read one, save it from a PDF viewer's attachments panel and open it on its own")
    return segments, warnings


def _size_text(size: Any) -> str:
    if not isinstance(size, int):
        return ""
    if size < 1024:
        return f"{size} B, "
    return f"{size / 1024:.1f} KiB, " if size < 1 << 20 else f"{size / (1 << 20):.1f} MiB, "
