"""A file's own line numbers for its text as Halaman read it.

Reading normalises a file's text (`engine.documents.text.normalize_text`): runs of blank lines
become one and leading blank lines go, so the read text's line 124 can be the file's line 127. A
viewer and the CLI number lines as the file on disk does, so that a person can find them in an
editor: `file_line_numbers` maps each line of the read text back to the file's line.
"""

from __future__ import annotations

from pathlib import Path

from engine.documents.encoding import UnclearEncodingError, decode_bytes
from engine.documents.plain import regular_file_bytes
from engine.documents.text import normalize_text


def align_lines(shown: str, original: str) -> list[int] | None:
    """For each line of `shown` (`original` as read: `normalize_text`), the 1-based line of
    `original` it comes from; None when the two cannot be aligned line by line (text made from
    markup, such as a notebook's cells or a web page's shown text, or a file changed since)."""
    lines = original.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    numbers: list[int] = []
    at = 0
    for line in shown.split("\n"):
        wanted = line.strip()
        # normalize_text trims the ends of its text: on one line that is the indentation, so both
        # sides are compared without it.
        while at < len(lines) and normalize_text(lines[at]) != wanted:
            at += 1
        if at == len(lines):
            return None
        numbers.append(at + 1)
        at += 1
    return numbers


def file_line_numbers(path: str | Path, shown: str) -> list[int] | None:
    """`align_lines(shown, the text of the file at path)`: None when the file cannot be read as
    text any more (gone, a link now, binary, an unclear encoding) or does not align. Never raises."""
    data = regular_file_bytes(Path(path))
    if data is None:
        return None
    try:
        original = decode_bytes(data).text
    except UnclearEncodingError:
        return None
    return align_lines(shown, original)
