"""Spreadsheets and tables as rows with their header: XLSX (openpyxl), ODS (the zip's content.xml,
streamed), CSV and TSV (the standard csv module).

Each sheet is a unit, "sheet Revenue"; a long sheet is cut into row ranges of about
`SHEET_PART_CHARS` characters, "sheet Revenue, rows 2–40". Each unit starts with the sheet's
header (its first row with a value: "columns: Region | Revenue") and holds one line per row with
a value, "row 7: North | 1200", cells in column order with " | " between them, empty rows left out.
Formulas give their cached values (what Excel last showed: openpyxl's data_only; a file never
recalculated by a spreadsheet program has none, and those cells read empty). A workbook is read
streaming (openpyxl's read_only mode parses a sheet's XML as it goes), so a 50 MB sheet does not
load whole, and at most `MAX_SHEET_CELLS` cells are read, with a warning naming where it stopped.
A hidden sheet is read, labelled "sheet Rates (hidden)". Left out: charts, pictures, comments, number formats
(values are shown plainly: 0.125, not 12.5 %), external links (never fetched, never refreshed).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import threading
import warnings
from pathlib import Path
from typing import Iterable, Iterator

from lxml import etree

from engine.documents.document import Document, NotTextError, ProgressCallback
from engine.documents.containers import DamagedDocumentError, open_archive
from engine.documents.parts import Part, build_document, check_cancel

SHEET_PART_CHARS = 4_000
"""About one PDF page of rows per unit."""

MAX_SHEET_CELLS = 200_000
"""Cells with a value read from one workbook or table (~1M tokens, beyond any budget); the rest is
left out with a warning."""

MAX_TABLE_BYTES = 20 * 1024 * 1024
"""CSV and TSV files up to this size are read (the cell cap applies too)."""

_MAX_REPEAT = 1_000  # ODS repeats a cell or row n times; an empty run of 1,048,576 is not expanded

Row = tuple[int, list[str]]


class _Cells:
    """Counts the cells read from one file against MAX_SHEET_CELLS."""

    def __init__(self):
        self.read = 0
        self.stopped_at: str | None = None

    def take(self, cells: list[str], where: str) -> bool:
        if self.stopped_at is not None:
            return False
        self.read += sum(1 for c in cells if c)
        if self.read > MAX_SHEET_CELLS:
            self.stopped_at = where
            return False
        return True


def sheet_parts(label: str, rows: Iterable[Row], cells: _Cells, cancel: threading.Event | None = None) -> list[Part]:
    """The units of one sheet or table: `rows` are (1-based row number, cell texts) in order;
    `label` is "sheet Revenue" (or "" for a CSV file, whose units are "rows 2–40")."""
    parts: list[Part] = []
    header, lines, first, last, size = "", [], 0, 0, 0

    def flush() -> None:
        if lines:
            parts.append(Part(f"{label}, rows {first}–{last}" if label else f"rows {first}–{last}",
                              "\n".join([f"columns: {header}", *lines])))

    for number, values in rows:
        while values and not values[-1]:
            values.pop()
        if not values:
            continue
        if not cells.take(values, f"{label or 'the table'}, row {number}"):
            break
        if number % 1000 == 0:
            check_cancel(cancel)
        line = " | ".join(values)
        if not header:
            header = line
            continue
        if size > SHEET_PART_CHARS:
            flush()
            lines, size = [], 0
        if not lines:
            first = number
        lines.append(f"row {number}: {line}")
        last, size = number, size + len(line)
    if not lines and header:
        return [Part(label or "table", f"columns: {header}")]
    flush()
    if len(parts) == 1 and label:
        parts[0].label = label
    return parts


def cell_text(value) -> str:
    """A cell's value as a reader reads it: integral floats without ".0", dates in ISO form, text on one line."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.10g}"
    if isinstance(value, dt.datetime):
        return value.date().isoformat() if value.time() == dt.time() else value.isoformat(sep=" ", timespec="minutes")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return " ".join(str(value).split())


def load_xlsx(path: Path, name: str, *, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None) -> Document:
    """The workbook at `path` (shown as `name`): each worksheet's rows (`sheet_parts`), streamed.
    Raises the `containers` errors, EmptyFileError (no cell has a value), Cancelled."""
    import openpyxl

    open_archive(path, name, streamed=True).close()
    try:
        with warnings.catch_warnings():  # "no stylesheet", "extension not supported": about styles, not text
            warnings.simplefilter("ignore", UserWarning)
            workbook = openpyxl.load_workbook(path, read_only=True, data_only=True, keep_links=False)
    except Exception as exc:  # openpyxl raises KeyError, ValueError, zip and XML errors for broken files
        raise DamagedDocumentError(f"{name} is damaged ({type(exc).__name__}: {str(exc)[:120]}): "
                                   "open it in Excel and save it again") from None
    cells, parts = _Cells(), []
    try:
        sheets = workbook.worksheets
        for k, sheet in enumerate(sheets):
            check_cancel(cancel)
            if progress:
                progress(k, len(sheets))
            sheet.reset_dimensions()  # some writers declare A1:A1: read every row and column there is
            rows = ((n, [cell_text(v) for v in values])
                    for n, values in enumerate(sheet.iter_rows(values_only=True), start=1))
            # A hidden sheet is read (a workbook's lookup tables often are) and says so in its label.
            hidden = " (hidden)" if getattr(sheet, "sheet_state", "visible") != "visible" else ""
            parts += sheet_parts(f"sheet {sheet.title}{hidden}", rows, cells, cancel)
    except (KeyError, ValueError, TypeError, etree.LxmlError, OSError, EOFError) as exc:
        raise DamagedDocumentError(f"{name} is damaged ({type(exc).__name__}: {str(exc)[:120]}): "
                                   "open it in Excel and save it again") from None
    finally:
        workbook.close()
    return build_document(path, name, "xlsx", parts, warnings=_cap_warning(cells, name), progress=progress)


def load_delimited(path: Path, name: str, *, progress: ProgressCallback | None = None,
                   cancel: threading.Event | None = None) -> Document:
    """A CSV or TSV file as a table: units "rows 2–40" under its header row. The delimiter is tab
    for .tsv, else sniffed among , ; tab | (comma when unclear). Raises NotTextError (binary, too
    large, unclear encoding), EmptyFileError, Cancelled."""
    from engine.documents.plain import read_text

    result = read_text(path, max_bytes=MAX_TABLE_BYTES)
    if result.code == "empty":
        from engine.documents.document import EmptyFileError
        raise EmptyFileError(f"{name} is empty (no text in it): choose another file")
    if result.skipped is not None:
        raise NotTextError(f"{name} cannot be read as a table ({result.skipped}): save it as UTF-8 text and open it again")
    delimiter = "\t" if path.suffix.lower() == ".tsv" else _sniff(result.text[:8192])
    reader = csv.reader(io.StringIO(result.text), delimiter=delimiter)
    # Numbered by record, as a spreadsheet program shows the rows (a quoted cell may span lines).
    rows = ((n, [" ".join(c.split()) for c in values]) for n, values in enumerate(reader, start=1))
    cells = _Cells()
    try:
        parts = sheet_parts("", rows, cells, cancel)
    except csv.Error as exc:
        raise NotTextError(f"{name} is not a readable table ({exc}): check its quotes") from None
    return build_document(path, name, "csv", parts, warnings=[*(f"{n}: {name}" for n in result.notes),
                                                             *_cap_warning(cells, name)], progress=progress)


def _sniff(sample: str) -> str:
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _cap_warning(cells: _Cells, name: str) -> list[str]:
    if cells.stopped_at is None:
        return []
    return [f"{name}: read the first {MAX_SHEET_CELLS:,} cells; from {cells.stopped_at} on left out "
            "(split the workbook to read the rest)"]


_TABLE = "{urn:oasis:names:tc:opendocument:xmlns:table:1.0}"
_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
_OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"


def ods_parts(archive, name: str, cancel: threading.Event | None = None) -> tuple[list[Part], list[str]]:
    """The sheets of an OpenDocument spreadsheet (its open zip `archive`) as units, streaming its
    content.xml; and the warnings. Raises DamagedDocumentError."""
    cells, parts = _Cells(), []
    try:
        with archive.open("content.xml") as stream:
            events = etree.iterparse(stream, events=("start", "end"), resolve_entities=False, no_network=True,
                                     load_dtd=False, huge_tree=False)
            for sheet_name, rows in _ods_tables(events):
                parts += sheet_parts(f"sheet {sheet_name}", rows, cells, cancel)
    except KeyError:
        raise DamagedDocumentError(f"{name} is damaged (its part content.xml is missing): "
                                   "open it in its program and save it again") from None
    except (etree.XMLSyntaxError, OSError, EOFError) as exc:
        raise DamagedDocumentError(f"{name} is damaged (content.xml: {exc}): open it in its program and save it again") from None
    return parts, _cap_warning(cells, name)


def _ods_tables(events) -> Iterator[tuple[str, Iterator[Row]]]:
    for event, element in events:
        if event == "start" and element.tag == _TABLE + "table":
            yield element.get(_TABLE + "name") or "", _ods_rows(events)


def _ods_rows(events) -> Iterator[Row]:
    number = 0
    for event, element in events:
        if event != "end":
            continue
        if element.tag == _TABLE + "table":
            element.clear()
            return
        if element.tag != _TABLE + "table-row":
            continue
        values = _ods_cells(element)
        repeat = int(element.get(_TABLE + "number-rows-repeated") or 1)
        for _ in range(min(repeat, _MAX_REPEAT) if any(values) else 0):
            number += 1
            yield number, list(values)
        number += repeat if not any(values) else max(0, repeat - _MAX_REPEAT)
        element.clear()  # streaming: the parsed rows do not pile up
        while element.getprevious() is not None:
            del element.getparent()[0]


def _ods_cells(row) -> list[str]:
    values: list[str] = []
    for cell in row:
        if cell.tag not in (_TABLE + "table-cell", _TABLE + "covered-table-cell"):
            continue
        text = "\n".join("".join(p.itertext()) for p in cell.iter(_TEXT + "p"))
        if not text:
            text = cell.get(_OFFICE + "value") or cell.get(_OFFICE + "date-value") or ""
        repeat = int(cell.get(_TABLE + "number-columns-repeated") or 1)
        values += [" ".join(text.split())] * (min(repeat, _MAX_REPEAT) if text else min(repeat, 64))
    return values
