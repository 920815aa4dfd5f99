"""RTF files as their text, not their control words (issue 45, item 6).

A memo with a pasted logo is mostly picture data: Word writes the PNG as hex inside
`{\\*\\shppict{\\pict … \\pngblip 89504e47…}}` (RTF 1.9.1, "Pictures"), and read as text that hex
was 326,532 tokens for two lines. The text is read by striprtf (`rtf_to_text`), which skips the
destination groups a reader never sees — pictures (\\pict, \\shppict, \\nonshppict), embedded
objects (\\object, \\objdata), the font, colour and style tables, document properties (\\info),
field instructions (\\fldinst, keeping the field's shown result) — and decodes \\'hh escapes in
the document's code page (\\ansicpg) and \\uN characters. Raw binary picture data (\\binN, N bytes
that are not hex) is cut out first, as striprtf only removes it from \\pict groups, and so is
text in the hidden font (\\v), which Word does not show (striprtf keeps it).
"""

from __future__ import annotations

import codecs
import re
import threading
from pathlib import Path

from striprtf.striprtf import rtf_to_text

from engine.documents.document import Document, EmptyFileError, NotTextError, ProgressCallback
from engine.documents.parts import Part, build_document, check_cancel

MAX_RTF_BYTES = 50 * 1024 * 1024
"""RTF files up to this size are read: pictures as hex double their size (a 20 MB photo is 40 MB)."""

_CODE_PAGE = re.compile(rb"\\ansicpg(\d+)")
_BIN = re.compile(rb"\\bin(\d+) ?")


def load_rtf(path: Path, name: str, *, progress: ProgressCallback | None = None,
             cancel: threading.Event | None = None) -> Document:
    """The RTF file at `path` (shown as `name`) as one unit of text labelled with its name.
    Raises NotTextError (not RTF, too large, unreadable), EmptyFileError, Cancelled."""
    from engine.documents.plain import regular_file_bytes

    check_cancel(cancel)
    data = regular_file_bytes(path, MAX_RTF_BYTES)
    if data is None:
        raise NotTextError(f"{name} cannot be read (not a regular file, unreadable, or over "
                           f"{MAX_RTF_BYTES >> 20} MiB): open a smaller file")
    if not data.strip():
        raise EmptyFileError(f"{name} is empty (no text in it): choose another file")
    if not data.lstrip().startswith(b"{\\rtf"):
        raise NotTextError(f"{name} is not an RTF file (it does not start with {{\\rtf): "
                           "open it in its program and save it again")
    text, hidden = rtf_text(data)
    check_cancel(cancel)
    warnings = [f"{name}: {hidden:,} characters of hidden text (\\v: not shown) left out"] if hidden else []
    return build_document(path, name, "rtf", [Part(name, text)], warnings=warnings, progress=progress)


def rtf_text(data: bytes) -> tuple[str, int]:
    """The text of the RTF document `data`: destinations (pictures, objects, tables of fonts,
    colours and styles, properties) left out, hidden text (`\\v`) left out, escapes decoded; and
    the number of hidden characters left out. Never raises for malformed RTF."""
    data = _without_binary(data)
    match = _CODE_PAGE.search(data[:4096])
    encoding = f"cp{match.group(1).decode()}" if match else "cp1252"
    try:
        codecs.lookup(encoding)
    except LookupError:
        encoding = "cp1252"
    # RTF is 7-bit: Latin-1 maps each byte to one character; \'hh escapes are decoded by striprtf.
    source, hidden = _without_hidden(data.decode("latin-1"))
    return rtf_to_text(source, encoding=encoding, errors="replace"), hidden


# A hex escape, a control word with its parameter (and the space that ends it), a control symbol,
# a brace, or a run of text.
_TOKEN = re.compile(r"\\'[0-9a-fA-F]{2}|\\([a-zA-Z]{1,32})(-?\d{1,10})? ?|\\.|[{}]|[^\\{}]+", re.S)


def _without_hidden(source: str) -> tuple[str, int]:
    """`source` without the text in Word's hidden font (`\\v` … `\\v0`, to the end of its group or
    a `\\plain`), which a reader does not see (striprtf keeps it); and how many characters went."""
    if "\\v" not in source:
        return source, 0
    out: list[str] = []
    stack: list[bool] = []
    hidden, dropped = False, 0
    for match in _TOKEN.finditer(source):
        token, word = match.group(), match.group(1)
        if token == "{":
            stack.append(hidden)
        elif token == "}":
            hidden = stack.pop() if stack else False
        elif word == "v":
            hidden = match.group(2) != "0"
            continue
        elif word == "plain":
            hidden = False
        elif hidden and (word is None or word == "u"):  # text, a hex escape, a Unicode character
            if not token.startswith("\\") or token.startswith(("\\'", "\\u")):
                dropped += len(token.strip()) if not token.startswith("\\") else 1
                continue
        out.append(token)
    return "".join(out), dropped


def _without_binary(data: bytes) -> bytes:
    """`data` with each `\\binN` and the N raw bytes after it removed."""
    if b"\\bin" not in data:
        return data
    out, at = [], 0
    for match in _BIN.finditer(data):
        if match.start() < at:
            continue  # inside the previous binary run
        out.append(data[at:match.start()])
        at = match.end() + int(match.group(1))
    out.append(data[at:])
    return b"".join(out)
