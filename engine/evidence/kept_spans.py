"""A document's spans kept between two `halaman find` runs: its token offsets and its full-text index.

Tokenizing a 288-page book for its character offsets (0.36 s of CPU) and indexing its spans
(0.18 s) were half of what a `find` on a document opened before still cost (issue 42). Both are
kept in the cache folder, keyed by the tokenizer and the rendered text:

    find/<key>.tokens   head tokens, text tokens, prefix tokens (3 × uint32), then the character
                        offset of each text token (uint32 each), little-endian
    find/<key>.index    the spans' FTS5 index (`engine.evidence.text_index`: checked against the
                        spans' digest and SQLite's integrity check when opened, rebuilt when not)

Key: SHA-256 over FORMAT, the tokenizer's own key (`engine.tokenizer_cache`), and the text the
model reads (`Document.render()`). The newest KEPT_DOCUMENTS documents are kept; `clear` (with
`halaman cache clear`) deletes them all. A damaged or unreadable file is a miss; one that cannot be
written costs the next run its work, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import sys
from array import array
from collections.abc import Callable
from pathlib import Path

from engine import paths
from engine.documents import Document
from engine.evidence.spans import DocumentSpans

CACHE_FOLDER = "find"
FORMAT = 1
KEPT_DOCUMENTS = 16
"""Documents whose spans are kept (the least recently used go first): about 1 MB for a 288-page book."""
_HEADER = struct.Struct("<III")

# (token_chars, head_tokens, text_tokens, n_tokens): what `DocumentSpans.build` needs of an encoding
Encoded = tuple[list[int], int, int, int]


def kept_spans(document: Document, tokenizer_key: str | None, encode: Callable[[], Encoded]) -> DocumentSpans:
    """`document`'s spans (`DocumentSpans.build`), from the kept offsets and index when this text was
    seen with this tokenizer before, else from `encode()` (kept for the next time). Without a
    `tokenizer_key` nothing is kept. Raises what `encode` raises."""
    if tokenizer_key is None:
        return DocumentSpans.build(document, *encode(), None)
    folder = paths.cache_dir() / CACHE_FOLDER
    digest = hashlib.sha256(f"{FORMAT}\0{tokenizer_key}\0".encode())
    digest.update(document.render().encode("utf-8", errors="surrogatepass"))
    stem = folder / digest.hexdigest()[:32]
    tokens, index = stem.with_suffix(".tokens"), stem.with_suffix(".index")
    encoded = _read(tokens)
    if encoded is None:
        encoded = encode()
        _write(folder, tokens, encoded)
    else:
        with contextlib.suppress(OSError):
            os.utime(tokens)  # recently used: kept longest
    return DocumentSpans.build(document, *encoded, index if tokens.is_file() else None)


def clear() -> int:
    """Delete every kept document's spans. Returns how many files; one that cannot be deleted is left."""
    removed = 0
    for entry in (paths.cache_location() / CACHE_FOLDER).glob("*"):
        with contextlib.suppress(OSError):
            entry.unlink()
            removed += 1
    return removed


def _read(path: Path) -> Encoded | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % 4:
        return None
    head, text, total = _HEADER.unpack_from(data)
    chars = array("I")
    chars.frombytes(data[_HEADER.size:])
    if sys.byteorder == "big":
        chars.byteswap()
    return (chars.tolist(), head, text, total) if len(chars) == text else None


def _write(folder: Path, path: Path, encoded: Encoded) -> None:
    chars, head, text, total = encoded
    values = array("I", chars)
    if sys.byteorder == "big":
        values.byteswap()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        paths.write_bytes_atomic(path, _HEADER.pack(head, text, total) + values.tobytes())
        path.with_suffix(".index").unlink(missing_ok=True)  # an index of other spans would be rebuilt anyway
        _forget_oldest(folder)
    except OSError:
        pass  # not kept: the next run tokenizes again


def _forget_oldest(folder: Path) -> None:
    """Keep the KEPT_DOCUMENTS most recently used documents' files."""
    kept = sorted(folder.glob("*.tokens"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[KEPT_DOCUMENTS:]:
        for part in (old, old.with_suffix(".index")):
            with contextlib.suppress(OSError):
                part.unlink()


__all__ = ["CACHE_FOLDER", "KEPT_DOCUMENTS", "clear", "kept_spans"]
