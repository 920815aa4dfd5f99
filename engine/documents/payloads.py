"""Embedded data in text files: what a reader sees as a picture, a font or an attachment, never as text.

A Markdown note with one pasted screenshot is a 1.2 MB `data:image/png;base64,…` URI around a page of
text (B22 in docs/REAL_WORLD_INPUTS.md: 969,966 tokens for 40 words); CSS carries its fonts, SVG its
bitmaps, JSON its icons, a saved e-mail its attachments the same way. Given to the model, base64
fills the budget and means nothing. `drop_payloads` replaces each with a short placeholder that says
what was there ("[image/png data left out, 878.9 KiB]"), as notebooks (B07) and web pages (B17) drop
their images, and counts them for the document's warnings:

- `data:` URIs (RFC 2397) whose data is at least MIN_URI_DATA characters: base64, also wrapped over
  lines, and percent-encoded or raw (an SVG in CSS: up to its closing quote);
- base64 without a `data:` prefix: one run of at least MIN_BLOB_CHARS characters, or at least
  MIN_BLOB_LINES lines of it as MIME and PEM wrap it, with capitals, small letters and digits mixed
  (DNA, hex digests and long words are not base64 by that test).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.units import format_bytes

MIN_URI_DATA = 100
"""Shorter data URIs stay (`data:,Hello%2C%20World`): a 1x1 GIF is 60-80 characters of base64."""

MIN_BLOB_CHARS = 1024
"""A run of base64 characters this long without a space is data (no word or identifier is)."""

MIN_BLOB_LINES = 8
"""...or this many consecutive lines of 60-120 base64 characters (MIME wraps at 76, PEM at 64)."""

_B64 = "A-Za-z0-9+/"
_MEDIA = r"(?P<media>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+(?:=[^;,\s\"'()<>]*)?)*)"
# The data runs to the closing quote when the URI is quoted (an SVG in CSS holds spaces and the other
# quote), else to a space, quote, bracket or parenthesis (Markdown's `](data:…)`, CSS's `url(data:…)`);
# base64 may go on over lines of 40+ characters.
_URI = re.compile(
    r"(?:(?P<dq>\")|(?P<sq>'))?(?<![\w.+-])data:" + _MEDIA + ","
    + r"(?P<data>(?(dq)[^\"\n]*|(?(sq)[^'\n]*|[^\s\"'()<>\[\]]*))"
    + rf"(?:[ \t]*\r?\n[ \t]*[{_B64}=]{{40,}})*)"
)
# JSON may escape the slash ("\\/"), as PHP's json_encode does.
_RUN = re.compile(rf"(?:[{_B64}]|\\/){{64,}}={{0,2}}")
_WRAPPED = re.compile(rf"(?:^[{_B64}]{{60,120}}={{0,2}}[ \t]*\n){{{MIN_BLOB_LINES - 1},}}^[{_B64}]*={{0,2}}[ \t]*$",
                      re.M)
_MIXED = (re.compile("[A-Z]"), re.compile("[a-z]"), re.compile("[0-9+/]"))


@dataclass(frozen=True)
class Dropped:
    """What `drop_payloads` left out: data URIs and bare base64 blocks, and their size in bytes
    (decoded size for base64, characters otherwise)."""

    uris: int = 0
    blocks: int = 0
    size_bytes: int = 0

    def __bool__(self) -> bool:
        return bool(self.uris or self.blocks)

    @property
    def note(self) -> str:
        """The warning phrase: "embedded data left out (1 data: URI, 878.9 KiB)"."""
        counts = ((self.uris, "data: URI"), (self.blocks, "base64 block"))
        parts = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in counts if n]
        return f"embedded data left out ({' and '.join(parts)}, {format_bytes(self.size_bytes)})"


def drop_payloads(text: str) -> tuple[str, Dropped]:
    """`text` with every data URI and base64 block replaced by a placeholder, and what was dropped.

    Linear in the length of `text` (a regex pass per kind); text without any is returned as is.
    """
    uris = blocks = size = 0

    def uri(match: re.Match[str]) -> str:
        nonlocal uris, size
        data = match.group("data")
        if len(data) < MIN_URI_DATA:
            return match.group()
        uris += 1
        base64 = ";base64" in (match.group("params") or "").lower()
        n_bytes = _decoded_size(data) if base64 else len(data)
        size += n_bytes
        quote = match.group("dq") or match.group("sq") or ""
        return f"{quote}[{match.group('media') or 'text/plain'} data left out, {format_bytes(n_bytes)}]"

    def block(match: re.Match[str]) -> str:
        nonlocal blocks, size
        found = match.group()
        wrapped = "\n" in found.strip()  # _WRAPPED's lines; a _RUN must be MIN_BLOB_CHARS long
        if not (wrapped or len(found) >= MIN_BLOB_CHARS) or not all(p.search(found) for p in _MIXED):
            return found
        blocks += 1
        n_bytes = _decoded_size(found)
        size += n_bytes
        return f"[base64 data left out, {format_bytes(n_bytes)}]" + ("\n" if found.endswith("\n") else "")

    if "data:" in text:
        text = _URI.sub(uri, text)
    text = _WRAPPED.sub(block, text)
    text = _RUN.sub(block, text)
    return text, Dropped(uris, blocks, size)


def _decoded_size(data: str) -> int:
    """Bytes that base64 `data` (whitespace and padding allowed) decodes to."""
    chars = sum(1 for char in data if char not in " \t\r\n=\\")
    return chars * 3 // 4
