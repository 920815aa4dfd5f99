"""File and folder names as people read them, and the valid-Unicode check at the model's boundary.

POSIX names are bytes. Python hands a name that is not UTF-8 (Latin-1 from an old zip or a
Windows share: b"caf\\xe9-menu.txt") over as a str with lone surrogates ("caf\\udce9-menu.txt",
PEP 383), which every encoder refuses: the tokenizer, SQLite, a terminal. Such a str stays the
right thing to open the file with; what is shown, cited or stored goes through `display_name`,
which decodes the original bytes the way file contents are decoded.

A name may also hold characters that act instead of showing: a line break (a label then looks
like two files and splits the CLI's report), an ANSI escape (`\x1b]0;…\x07` retitles the
terminal, `\x1b[2J` clears it), a right-to-left override (U+202E makes "evil\u202etxt.exe" read
"evilexe.txt", the Trojan Source trick, CVE-2021-42574), a Unicode tag character (U+E0049 shows
nothing and spells "I" to a model: B25). `display_name` writes those as visible
escapes ("a\\nb.txt"), as git does for such paths (core.quotePath) and ls does with -b.
"""

from __future__ import annotations

import os
import re

from engine.errors import DocumentError

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 controls, DEL, and the bidirectional embeddings, overrides, isolates and marks; the
# characters that show nothing and can spell hidden text (B25: Unicode tags, invisible operators,
# zero-width characters, fillers, variation selectors 17-256: `text.normalize_and_count` removes
# them from text); and runs of joiners or variation selectors (one after an emoji is spelling:
# "❤️ notes.txt" stays).
_ACTING = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200e\u200f\u202a-\u202e"
                     "\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff0-\ufffb\U0001bca0-\U0001bca3"
                     "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
                     "|[\u034f\u180b-\u180d\u180f\u200c\u200d\ufe00-\ufe0f]{2,}")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    return "".join(_escape(char) for char in match.group())


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_name(name: str | os.PathLike[str]) -> str:
    """`name` (a file name, a relative or absolute path) as valid Unicode: unchanged when it
    already is; else its bytes decoded as UTF-8, cp1252 or Latin-1, so b"caf\\xe9-menu.txt"
    reads "café-menu.txt"; control and bidirectional-control characters written as escapes
    ("\\n", "\\x1b", "\\u202e"). Never raises. (Not charset-normalizer, as file contents are: a name
    is too short for a detector, and the same bytes must always give the same name.)"""
    return _ACTING.sub(_visible, _decoded(os.fspath(name)))


def _decoded(text: str) -> str:
    if not _SURROGATE.search(text):
        return text
    try:
        raw = os.fsencode(text)  # surrogateescape gives back the bytes the OS had
    except UnicodeEncodeError:  # surrogates that did not come from the file system
        return _SURROGATE.sub("\ufffd", text)
    for codec in ("utf-8", "cp1252"):
        try:
            return raw.decode(codec)
        except UnicodeDecodeError:
            continue
    return raw.decode("latin-1")


# Metadata titles that name no document (issue 44: a filing listed as "0001065280-18-000069"): an
# SEC accession number or any other run of digits and separators, a file name or path, or the
# placeholder a producing program writes ("Microsoft Word - draft.docx", "Untitled", "Document1").
_NOT_A_TITLE = re.compile(
    r"[\d\W_]*"                                                   # digits and separators only
    r"|(?:[a-z]:)?[/\\]?(?:[^\s/\\]+[/\\])+[^\s/\\]*"                # a path (dates have spaces around)
    r"|.*\.(?:pdf|docx?|dotx?|odt|rtf|txt|tex|dvi|ps|indd|qxd|pptx?|xlsx?|html?|md)"  # a file name
    r"|(?:microsoft\s+(?:word|powerpoint|excel)|adobe\s+\w+|pdf\s*creator)\b.*"
    r"|untitled.*|document\s*\d*|title|slide\s*\d*|(?:powerpoint\s+)?presentation\s*\d*|\S{1,2}",
    re.IGNORECASE)


def shown_title(metadata_title: str, path: str | os.PathLike[str]) -> str:
    """The name a document is shown and cited by: the title a file's metadata gives (first line)
    when it names the document, else the file name without its extension (`display_name`).
    Accession numbers, paths, file names and producers' placeholders are not titles."""
    title = " ".join(metadata_title.split("\n", 1)[0].split()) if metadata_title else ""
    if not title or _NOT_A_TITLE.fullmatch(title):
        return display_name(os.path.splitext(os.path.basename(os.fspath(path)))[0])
    return title


def check_unicode(text: str, what: str) -> None:
    """Raise DocumentError (one line naming `what`) if `text` cannot be encoded as UTF-8.

    Called where text enters the tokenizer and the prefix store: loaders produce valid Unicode
    by construction, so a failure here is a bug reported in words, not a TypeError from deep
    inside the tokenizer after the document was read.
    """
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise DocumentError(
            f"{display_name(what)}: the text contains an invalid character (U+{ord(bad.group()):04X} at "
            f"position {bad.start()}) and was not sent to the model: please report this file")
