"""The document library and the chat history, in one SQLite file (sqlite-utils) under the data dir.

    library.sqlite
      documents   id, path (unique), title, kind, pages, files, tokens, prefix_key, config_sig,
                  file_sig, added_s, opened_s
      messages    id, document_id, role ("user" | "assistant"), text, state, created_s and, for
                  answers, where it came from and what it cost (source, endpoint, model, reason,
                  ttft_s, tokens_per_s, tokens, prefix_hit, stop_reason), since schema 2 what recall
                  did (sources_json: the attention-grounded sources, recall_json: recall's cost), and
                  since schema 3 the passages it attended to (passages_json, the source pane's highlights),
                  since schema 4 how sure the local model was (mean_logprob, low_confidence),
                  since schema 5 the names it stated that the document does not contain (unsupported_json)

Schemas 2 to 5 only add columns to `messages`; an older file is migrated in place when it is opened
(ALTER TABLE ... ADD COLUMN: old rows read back with those fields None, nothing is rewritten).

The window's history and the command line's are one record: it lives in the engine (no Qt, no
model), the window uses it from its GUI thread only (its worker never touches it), and `halaman
history export` reads it (`engine.history`). Every change is committed at once, so closing the
window, or a crash, loses at most the answer being streamed — and that is written as it streams
(`update_message`).

Prefix-cache status of a document, as the sidebar shows it:
    cached       the prefix store holds the key recorded when it was last opened, the file is
                 unchanged, and the key's other fields are what the model and settings give now
    stale        a saved cache exists but opening would miss it: the file changed since, or the
                 key would be made of other fields now (another model or weights, cache policy,
                 dtype, transformers version, device type; opening it will prefill again)
    not cached   no saved cache (never opened, evicted, cleared, or prefix caching is off)
    missing      the file or folder is no longer at its path (deleted, renamed, moved, or its
                 drive is not connected): `Library.remove` forgets it

Whether a file changed is told by its size, modification time and, for files up to
HASHED_FILE_BYTES, a hash of its content: `cp -p` and backup restores keep size and time while
the content differs. The hash is computed again only when the file's inode or change time
(ctime, which no copy can set) moves, so a sidebar refresh does not read every file.

The key's fields but the token ids are `engine.prefix_store.PrefixConfig`; `config_sig` keeps their
signature from when the document was opened, and `engine.workspace.CacheStatus` gives the signature
each document length would get now, so "stale" follows the prefix cache's own rule: an exact key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import paths
from engine.answer import Source
from engine.attended import AttendedSpan
from engine.settings import EngineSettings

if TYPE_CHECKING:  # the library is read before the engine (and torch) is loaded
    from engine.workspace import CacheStatus

SCHEMA_VERSION = 6
CACHED, STALE, NOT_CACHED, MISSING = "cached", "stale", "not cached", "missing"
HASHED_FILE_BYTES = 256 << 20  # larger files are told by size and time only
_hashes: dict[tuple, str] = {}  # (path, size, mtime, ctime, inode) -> content hash, this process


@dataclass
class DocumentRecord:
    id: int
    path: str
    title: str
    kind: str
    pages: int | None
    files: int | None
    tokens: int | None
    prefix_key: str | None
    config_sig: str | None
    file_sig: str | None
    added_s: float
    opened_s: float | None

    @property
    def size_text(self) -> str:
        """'18 pages', '42 files', '1 file', 'text file' or the format of an office document ('PPTX file')."""
        if self.kind == "text":
            return "text file"
        if self.kind == "pdf" and self.pages is not None:
            return f"{self.pages} page{'s' if self.pages != 1 else ''}"
        if self.files is not None:
            return f"{self.files} file{'s' if self.files != 1 else ''}"
        if self.kind != "repo":  # an office document, e-book or table (engine.documents.formats)
            return f"{self.kind.upper()} file"
        return ""


def _rows(text: str | None, kind: type) -> list:
    """`kind(**item)` for each item of the JSON list `text`; [] when none was stored or the row is
    damaged (a damaged row must not stop the history or the source pane from showing)."""
    if not text:
        return []
    try:
        return [kind(**item) for item in json.loads(text)]
    except (ValueError, TypeError):
        return []


@dataclass
class MessageRecord:
    id: int
    document_id: int
    role: str
    text: str
    state: str                      # "done" | "streaming" | "cancelled" | "interrupted" | "error"
    created_s: float
    source: str | None = None       # "local" | "cloud"
    endpoint: str | None = None
    model: str | None = None
    reason: str | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    tokens: int | None = None
    prefix_hit: int | None = None
    stop_reason: str | None = None
    sources_json: str | None = None  # [{"label", "share", "page", "path"}]: engine.answer.Source, as JSON
    recall_json: str | None = None   # `engine.workspace.recall_record`; None for cloud answers and rows from before recall
    passages_json: str | None = None  # `engine.workspace.passages_json`; None for cloud answers and rows from before schema 3
    mean_logprob: float | None = None    # `Answer.mean_logprob`; None for cloud answers and rows from before schema 4
    low_confidence: int | None = None    # 1: below the escalation threshold (`engine.cloud.policy.low_confidence`)
    unsupported_json: str | None = None  # `Answer.unsupported` as JSON; None when empty, for cloud answers and older rows
    instructions_json: str | None = None  # `Answer.instructions` as JSON; None when empty and for rows before schema 6

    @property
    def sources(self) -> list[Source]:
        """The answer's attention-grounded sources (`engine.answer.Source`), [] when none were stored."""
        return _rows(self.sources_json, Source)

    @property
    def passages(self) -> list[AttendedSpan]:
        """The passages the answer attended to (`engine.attended.AttendedSpan`), [] when none were stored."""
        return _rows(self.passages_json, AttendedSpan)

    @property
    def instructions(self) -> list[str]:
        """Phrases of the document written as instructions to the model (`engine.grounding`), []
        when none were stored or the column holds something else than a list of strings."""
        try:
            value = json.loads(self.instructions_json) if self.instructions_json else []
        except ValueError:
            return []
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    @property
    def unsupported(self) -> list[str]:
        """Names the answer stated that its document does not contain (`engine.grounding`), [] when
        none were stored or the column holds something else than a list of strings."""
        try:
            value = json.loads(self.unsupported_json) if self.unsupported_json else []
        except ValueError:
            return []
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    @property
    def read_labels(self) -> set[str] | None:
        """The pages or files the answer read: the spans recall brought back ("page 12", a part of a
        file as its file's label) and the attended sources; None when no spans were recorded (a
        document kept whole, which the model read entirely; block recall; an older row; a cloud
        answer): then every page counts as read."""
        recall = self.recall or {}
        spans = recall.get("spans") if isinstance(recall.get("spans"), list) else []
        if not spans:
            return None
        return {str(span).split(" (characters ")[0] for span in spans} | {source.label for source in self.sources}

    @property
    def recall(self) -> dict | None:
        """What recall did for the answer (see `engine.workspace.recall_record`), None when not recorded."""
        if not self.recall_json:
            return None
        try:
            value = json.loads(self.recall_json)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


# Columns added after schema 1 (name -> type), added in place to an older file's messages table.
MESSAGE_COLUMNS_ADDED = {"sources_json": str, "recall_json": str, "passages_json": str, "mean_logprob": float,
                         "low_confidence": int, "unsupported_json": str, "instructions_json": str}


_BYTES_PREFIX = "fsbytes:"


def _stored(path: str) -> str:
    """`path` as an SQLite value: itself, or for a name that is not UTF-8 (a str with lone
    surrogates, which SQLite refuses) its bytes in base64 after "fsbytes:", which no absolute
    path starts with."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return _BYTES_PREFIX + base64.urlsafe_b64encode(os.fsencode(path)).decode("ascii")


def _record(row: dict) -> DocumentRecord:
    path = row["path"]
    if path.startswith(_BYTES_PREFIX):
        path = os.fsdecode(base64.urlsafe_b64decode(path[len(_BYTES_PREFIX):]))
    return DocumentRecord(**{**row, "path": path})


def library_path() -> Path:
    return paths.data_dir() / "library.sqlite"


def file_signature(path: str | Path) -> str | None:
    """Size, modification time and content hash of a file ("file:SIZE:MTIME_NS:SHA256-16", no hash
    over HASHED_FILE_BYTES), or the newest modification time of a folder's top level ("dir:NS").
    None if it is gone or cannot be read."""
    p = Path(path)
    try:
        st = p.stat()
        if p.is_dir():
            newest = max((c.stat().st_mtime_ns for c in p.iterdir()), default=st.st_mtime_ns)
            return f"dir:{max(newest, st.st_mtime_ns)}"
        signature = f"file:{st.st_size}:{st.st_mtime_ns}"
        if st.st_size > HASHED_FILE_BYTES:
            return signature
        key = (str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if key not in _hashes:
            digest = hashlib.sha256()
            with p.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            _hashes[key] = digest.hexdigest()[:16]
        return f"{signature}:{_hashes[key]}"
    except OSError:
        return None


def same_file(stored: str | None, now: str | None) -> bool:
    """Whether a stored `file_signature` and today's name the same content; a signature stored
    before hashes were kept ("file:SIZE:MTIME") is compared by size and time."""
    if stored is None or now is None:
        return stored == now
    if stored.startswith("file:") and stored.count(":") == 2:
        return now.rsplit(":", 1)[0] == stored if now.count(":") == 3 else now == stored
    return stored == now


class Library:
    """The library and chat history. `path` defaults to `library.sqlite` in the data dir.
    `interrupt_streaming`: mark answers left "streaming" as "interrupted" (the window, at its
    start; not a reader such as `halaman history export`, which may run beside a window that streams)."""

    def __init__(self, path: Path | None = None, *, interrupt_streaming: bool = True) -> None:
        self.path = Path(path or library_path())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        import sqlite_utils  # here, not at the top: it imports numpy, which `halaman find` never needs (0.15 s of CPU)

        conn = sqlite3.connect(self.path, timeout=10)
        self.db = sqlite_utils.Database(conn, execute_plugins=False)
        self.db.enable_wal()
        self._ensure_schema()
        if interrupt_streaming:  # an answer that was streaming when the app died is kept, marked as interrupted
            self.db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")
            conn.commit()

    def close(self) -> None:
        self.db.conn.close()

    # ------------------------------------------------------------- documents
    def upsert_document(self, *, path: str, title: str, kind: str, pages: int | None = None, files: int | None = None,
                        tokens: int | None = None, prefix_key: str | None = None, config_sig: str | None = None) -> int:
        """Add or update the document at `path` (marked as opened now). Returns its id."""
        now = time.time()
        row = {
            "path": _stored(path), "title": title, "kind": kind, "pages": pages, "files": files, "tokens": tokens,
            "prefix_key": prefix_key, "config_sig": config_sig, "file_sig": file_signature(path), "opened_s": now,
        }
        existing = self._document_row(path)
        with self.db.conn:
            if existing is None:
                return int(self.db["documents"].insert({**row, "added_s": now}).last_pk)
            self.db["documents"].update(existing["id"], row)
            return int(existing["id"])

    def documents(self) -> list[DocumentRecord]:
        """Most recently opened first."""
        rows = self.db.query("SELECT * FROM documents ORDER BY COALESCE(opened_s, added_s) DESC, id DESC")
        return [_record(row) for row in rows]

    def document(self, document_id: int) -> DocumentRecord | None:
        rows = list(self.db.query("SELECT * FROM documents WHERE id = ?", [document_id]))
        return _record(rows[0]) if rows else None

    def find(self, path: str) -> DocumentRecord | None:
        row = self._document_row(path)
        return _record(row) if row else None

    def remove_document(self, document_id: int) -> None:
        """Forget a document and its chat history (the file itself is not touched)."""
        with self.db.conn:
            self.db.execute("DELETE FROM messages WHERE document_id = ?", [document_id])
            self.db.execute("DELETE FROM documents WHERE id = ?", [document_id])

    def remove(self, path_or_title: str | None = None) -> list[DocumentRecord]:
        """Forget the documents whose path (as given, or made absolute) or title is `path_or_title`,
        with their chat history, or with None every document whose file is gone (`MISSING`); the
        files are not touched. Returns what was removed, newest first ([] when nothing matched)."""
        if path_or_title is None:
            found = [r for r in self.documents() if file_signature(r.path) is None]
        else:
            absolute = os.path.abspath(os.path.expanduser(path_or_title))
            found = [r for r in self.documents() if r.path in (path_or_title, absolute)]
            found = found or [r for r in self.documents() if r.title == path_or_title]
        for record in found:
            self.remove_document(record.id)
        return found

    def status(self, record: DocumentRecord, cache: CacheStatus | None, settings: EngineSettings) -> str:
        """missing / cached / stale / not cached (see the module docstring). `cache`: the store's
        keys and the signatures keys would have now, None when unknown yet (then only what the
        library itself knows is used; without signatures, only the file is compared)."""
        now = file_signature(record.path)
        if now is None:
            return MISSING
        if not record.prefix_key or not settings.prefix_cache:
            return NOT_CACHED
        if cache is not None and record.prefix_key not in cache.keys:
            return NOT_CACHED
        if not same_file(record.file_sig, now):
            return STALE
        if cache is not None and cache.signatures is not None and record.config_sig != cache.signatures.get(record.tokens):
            return STALE
        return CACHED

    # -------------------------------------------------------------- messages
    def add_message(self, document_id: int, role: str, text: str, *, state: str = "done", **meta) -> int:
        with self.db.conn:
            return int(self.db["messages"].insert(
                {"document_id": document_id, "role": role, "text": text, "state": state, "created_s": time.time(), **meta}
            ).last_pk)

    def update_message(self, message_id: int, **fields) -> None:
        with self.db.conn:
            self.db["messages"].update(message_id, fields)

    def messages(self, document_id: int) -> list[MessageRecord]:
        rows = self.db.query("SELECT * FROM messages WHERE document_id = ? ORDER BY id", [document_id])
        return [MessageRecord(**row) for row in rows]

    def message(self, message_id: int) -> MessageRecord | None:
        rows = list(self.db.query("SELECT * FROM messages WHERE id = ?", [message_id]))
        return MessageRecord(**rows[0]) if rows else None

    # --------------------------------------------------------------- helpers
    def _document_row(self, path: str) -> dict | None:
        rows = list(self.db.query("SELECT * FROM documents WHERE path = ?", [_stored(path)]))
        return rows[0] if rows else None

    def _ensure_schema(self) -> None:
        with self.db.conn:
            if "documents" not in self.db.table_names():
                self.db["documents"].create(
                    {"id": int, "path": str, "title": str, "kind": str, "pages": int, "files": int, "tokens": int,
                     "prefix_key": str, "config_sig": str, "file_sig": str, "added_s": float, "opened_s": float},
                    pk="id", not_null={"path", "title", "kind", "added_s"},
                )
                self.db["documents"].create_index(["path"], unique=True)
            if "messages" not in self.db.table_names():
                self.db["messages"].create(
                    {"id": int, "document_id": int, "role": str, "text": str, "state": str, "created_s": float,
                     "source": str, "endpoint": str, "model": str, "reason": str, "ttft_s": float,
                     "tokens_per_s": float, "tokens": int, "prefix_hit": int, "stop_reason": str, **MESSAGE_COLUMNS_ADDED},
                    pk="id", not_null={"document_id", "role", "text", "state", "created_s"},
                    foreign_keys=[("document_id", "documents", "id")],
                )
                self.db["messages"].create_index(["document_id"])
            else:
                # A file from an older version: add the missing columns (old rows get NULL there).
                have = set(self.db["messages"].columns_dict)
                for name, kind in MESSAGE_COLUMNS_ADDED.items():
                    if name not in have:
                        self.db["messages"].add_column(name, kind)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def read_share(record: DocumentRecord, status: str, cache: CacheStatus | None) -> float | None:
    """How much of a document not cached whole a stopped read has kept (0..1, from its checkpoint's
    tokens, `CacheStatus.read_tokens`), or None when nothing was kept or it is cached. A partly read
    document said "not cached", as one never read does."""
    if status != NOT_CACHED or cache is None or not record.tokens:
        return None
    tokens = cache.read_tokens(record.prefix_key)
    return min(tokens / record.tokens, 0.99) if tokens else None  # "100 %" only once the read is saved whole
