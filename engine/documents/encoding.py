"""Text encodings of files: which one, and the text, never mojibake (B15 in docs/REAL_WORLD_INPUTS.md).

In order: a byte-order mark; UTF-16 without one (recognised by decoding, not by guessing); UTF-8;
UTF-8 with a few bad bytes (only those spans are replaced, R03 in docs/CORPUS.md); else a legacy
code page, detected by charset-normalizer (GBK / GB18030, Shift_JIS, cp1251, …), with
Windows-1252 kept where it gives the same text as the detector's guess or the detector has none
and every non-ASCII character it gives is a letter or cp1252 punctuation. When none of that is
sure, `UnclearEncodingError` names the guesses instead of handing the model a wrong decoding
(the B15 files were read as cp1252 mojibake before).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass

from charset_normalizer import from_bytes

# Longest first: the UTF-32-LE BOM starts with the UTF-16-LE one.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))

# Without a BOM, UTF-16/32 are found by decoding (`utf16_without_bom`); the detector guesses them
# for short Western files ("Café “q”" as UTF-16-BE: "䍡曩ₓ熔").
_NOT_GUESSED = ["utf_16", "utf_16_le", "utf_16_be", "utf_32", "utf_32_le", "utf_32_be"]

MAX_CHAOS = 0.1
"""charset-normalizer's "chaos" (share of odd characters in its decoding, 0..1) above which its
guess is not used. The B15 files and the test's cp1251 minutes score 0.0; wrong code pages for
them score 0.17 and more."""

WHITESPACE_EVERY = 200
"""UTF-16 text has at least one space, tab or line feed per this many characters (Chinese and
Japanese lines, without spaces, end within about 100)."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_CP1252_PUNCTUATION = frozenset("€‚„…†‡ˆ‰‹‘’“”•–—˜™›¡¢£¤¥¦§¨©«¬®¯°±²³´µ¶·¸¹»¼½¾¿×÷\xa0")


class UnclearEncodingError(ValueError):
    """No encoding decodes the bytes with confidence. `guesses`: the detector's best codecs (may
    be empty)."""

    def __init__(self, guesses: list[str]) -> None:
        super().__init__("encoding not clear" + (f", best guess {describe(guesses)}" if guesses else ""))
        self.guesses = guesses


def describe(guesses: list[str]) -> str:
    """'gb18030', 'cp1125 or cp1251', 'cp1125, cp1251 or cp1256'."""
    return guesses[0] if len(guesses) == 1 else ", ".join(guesses[:-1]) + " or " + guesses[-1]


@dataclass(frozen=True)
class Decoded:
    """A file's text (not normalised yet) and how it was decoded.

    fallback: the legacy codec used ("gb18030", "cp1252", …) when the file was not Unicode, else
    None. replaced: bytes of an otherwise UTF-8 file that were not UTF-8 and were replaced by
    U+FFFD (or read as cp1252 letters, see `decode_bytes`).
    """

    text: str
    fallback: str | None = None
    replaced: int = 0


def bom_encoding(data: bytes) -> str | None:
    """The codec named by a byte-order mark at the start of `data`, or None."""
    return next((codec for bom, codec in _BOMS if data.startswith(bom)), None)


def utf16_without_bom(data: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when `data`, which has no BOM, is UTF-16 text; else None.

    Only bytes with a NUL can be (text in UTF-16 without a NUL byte is rare and decodes badly as
    anything else, so the detector sees it). Both byte orders are decoded strictly; one counts
    when its text has no control characters but tab, line feed, form feed and carriage return,
    no unassigned code points, and a space or line break per WHITESPACE_EVERY characters (binary
    data read as UTF-16 is CJK-looking without any: R02's data/late-binary.dat). Where both
    count, the one with more ASCII characters wins: ASCII read in the wrong byte order is Han
    ("e" U+0065 → U+6500) and unassigned (U+0A00 for "\\n").
    """
    if b"\x00" not in data or len(data) % 2:
        return None
    best, best_ascii = None, -1
    for codec in ("utf-16-le", "utf-16-be"):
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            continue
        if (_CONTROL.search(text)
                or sum(text.count(ch) for ch in " \n\t") < max(1, len(text) // WHITESPACE_EVERY)
                or any(unicodedata.category(ch) == "Cn" for ch in text)):
            continue
        ascii_chars = sum(1 for ch in text if ch < "\x80")
        if ascii_chars > best_ascii:
            best, best_ascii = codec, ascii_chars
    return best


def decode_bytes(data: bytes) -> Decoded:
    """Decode a text file's bytes (see the module's docstring for the order).

    An otherwise UTF-8 file (at least twice as many valid non-ASCII characters as bad spans)
    keeps its UTF-8; each bad span becomes its cp1252 reading when that is only letters (an
    "é" typed in a Latin-1 editor), else one U+FFFD. Raises UnclearEncodingError.
    """
    codec = bom_encoding(data) or utf16_without_bom(data)
    if codec is not None:
        try:
            return Decoded(data.decode(codec))
        except UnicodeDecodeError:
            pass  # a stray BOM-like prefix: fall through to the guesses
    try:
        return Decoded(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    mostly = _mostly_utf8(data)
    if mostly is not None:
        return mostly
    return _legacy(data)


def _mostly_utf8(data: bytes) -> Decoded | None:
    escaped = data.decode("utf-8", errors="surrogateescape")  # a bad byte b → U+DC00 + b
    spans = re.findall("[\udc80-\udcff]+", escaped)
    valid = sum(1 for ch in escaped if "\x7f" < ch and not "\udc80" <= ch <= "\udcff")
    if not valid or valid < 2 * len(spans):
        return None

    def reread(match: re.Match[str]) -> str:
        raw = bytes(ord(ch) - 0xDC00 for ch in match.group())
        try:
            text = raw.decode("cp1252")
        except UnicodeDecodeError:
            return "\ufffd"
        return text if text.isalpha() else "\ufffd"

    return Decoded(re.sub("[\udc80-\udcff]+", reread, escaped), replaced=sum(map(len, spans)))


def _legacy(data: bytes) -> Decoded:
    matches = list(from_bytes(data, cp_exclusion=_NOT_GUESSED))
    matches = [match for match in matches if match.chaos <= MAX_CHAOS]
    cp1252 = _cp1252(data)
    if matches:
        best = matches[0]
        # Coherence: charset-normalizer recognised a language in its decoding (0 when the text
        # is too short to tell: "Привет, мир" fits eight code pages).
        if best.coherence > 0:
            if cp1252 is not None and "cp1252" in best.could_be_from_charset:
                return Decoded(cp1252, fallback="cp1252")  # the same text under its usual name
            return Decoded(str(best), fallback=best.encoding)
        if cp1252 is not None and any(m.chaos <= best.chaos and "cp1252" in m.could_be_from_charset
                                      for m in matches):
            return Decoded(cp1252, fallback="cp1252")
        raise UnclearEncodingError([m.encoding for m in matches[:3]])
    if cp1252 is not None and all(ch.isalpha() or ch in _CP1252_PUNCTUATION
                                  for ch in cp1252 if ch >= "\x80"):
        return Decoded(cp1252, fallback="cp1252")
    raise UnclearEncodingError([])


def _cp1252(data: bytes) -> str | None:
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # cp1252 leaves 0x81, 0x8d, 0x8f, 0x90, 0x9d undefined
        return None
