"""Documents parsed once: the `Document` of a file kept in the cache folder, keyed by the file's
bytes, so a library question, `halaman find` or the source pane showing another document's page
does not parse a 300-page PDF again (every CLI library question parsed every PDF of the library:
issue 45; the page of a library answer's citation took ~35 s to show: issue 44).

Key: SHA-256 over the file's bytes and name, the reading options (`include_generated`) and `parser_version`,
a digest of the source files of `engine.documents` (a change to any reader is a new parse). Value:
the `Document` as JSON (its segments, outline, warnings and every other field), written atomically
(`engine.paths.write_text_atomic`). A file opened with a password is never kept (its text would sit
decrypted on disk); folders are not kept (their bytes are many files: git and the .gitignore rules
decide what is read). A damaged or unreadable entry is a miss; one that cannot be written costs the
next parse only, never an error.

Opt-in (`load_reusing`): the parse with its progress and cancel stays the default of
`load_document`, which the window's open uses and the reader tests exercise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from functools import lru_cache
from pathlib import Path

from engine import paths
from engine.documents import load_document
from engine.documents.document import Document, OutlineEntry, ProgressCallback, Segment

log = logging.getLogger(__name__)

CACHE_FOLDER = "parsed"
_FORMAT = 1


@lru_cache(maxsize=1)
def parser_version() -> str:
    """A digest of the readers' source files (`engine/documents/*.py`), read once per process."""
    digest = hashlib.sha256(str(_FORMAT).encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def document_key(path: Path, include_generated: bool) -> str:
    """The cache key of the file at `path` read with these options (module docstring)."""
    # The name too: a file without a title is named by it, and a single text file is labelled by it.
    digest = hashlib.sha256(f"{parser_version()}\0{int(include_generated)}\0{path.name}\0".encode(errors="surrogateescape"))
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entry(key: str) -> Path:
    return paths.cache_dir() / CACHE_FOLDER / f"{key}.json"


def _to_json(document: Document) -> str:
    return json.dumps(dataclasses.asdict(document), ensure_ascii=False)


def _from_json(text: str) -> Document:
    data = json.loads(text)
    data["segments"] = [Segment(**segment) for segment in data["segments"]]
    data["outline"] = [OutlineEntry(**entry) for entry in data.get("outline", [])]
    return Document(**data)


def _key_or_none(source: Path, include_generated: bool) -> str | None:
    try:
        return document_key(source, include_generated)
    except OSError:  # unreadable: load_document says why
        return None


def _cached(key: str, source: Path) -> Document | None:
    try:
        return _from_json(_entry(key).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as error:  # damaged: parse again
        log.info("parsed copy of %s not used: %s", source.name, error)
        return None


def load_reusing(path: str | os.PathLike[str], *, password: str | None = None,
                 progress: ProgressCallback | None = None, cancel: threading.Event | None = None,
                 include_generated: bool = False) -> Document:
    """`load_document` (same arguments, same errors), from the cache when this file's bytes were
    parsed before by these readers; a file's new parse is kept for the next time. `source` is set
    to this path (the same bytes may sit elsewhere). `progress` hears (1, 1) for a cache hit."""
    source = Path(path).expanduser()
    if password is not None or not source.is_file():
        return load_document(source, password=password, progress=progress, cancel=cancel,
                             include_generated=include_generated)
    key = _key_or_none(source, include_generated)
    document = _cached(key, source) if key is not None else None
    if document is not None:
        if progress is not None:
            progress(1, 1)
        return dataclasses.replace(document, source=str(source.resolve()))
    document = load_document(source, password=password, progress=progress, cancel=cancel,
                             include_generated=include_generated)
    if key is not None:
        try:
            _entry(key).parent.mkdir(parents=True, exist_ok=True)
            paths.write_text_atomic(_entry(key), _to_json(document))
        except OSError as error:
            log.info("parsed copy of %s not kept: %s", source.name, error)
    return document


def clear() -> int:
    """Delete every parsed copy (with the prefix cache: clearing forgets the documents' text too).
    Returns how many; a file that cannot be deleted is left, never an error."""
    removed = 0
    try:
        entries = list((paths.cache_dir() / CACHE_FOLDER).glob("*.json"))
    except OSError:
        return 0
    for entry in entries:
        try:
            entry.unlink()
            removed += 1
        except OSError as error:
            log.info("parsed copy %s not deleted: %s", entry.name, error)
    return removed


__all__ = ["clear", "document_key", "load_reusing", "parser_version"]
