"""The document a reader hands back (`Document`: its `Segment`s, its outline) and the errors a
reader raises: defined here, below the readers and the package's `load_document`, so that every
reader imports them from this module and none imports the package that dispatches to it.
"""

from __future__ import annotations

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


PDF_HEADER_WINDOW_BYTES = 1024
"""Where a `%PDF-` header may start (ISO 32000 implementation note; PDFium and pypdf accept it)."""


def os_reason(exc: BaseException) -> str:
    """A short, lower-case reason for an OS error, without the path Python appends."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__


def page_ranges(numbers: list[int]) -> str:
    """'page 7' or 'pages 3-5, 9': consecutive pages as ranges so a scan does not flood the list."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    text = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)
    return f"page {text}" if len(numbers) == 1 else f"pages {text}"
