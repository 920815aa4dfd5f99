"""PrefixStore: prefilled (compressed) KV caches on disk, one safetensors file per prefix, an SQLite index.

A snapshot is reused only for the exact same computation ("Prefix identity" among the decisions
in the repository's architecture doc, docs/), so the lookup is by exact key, never by longest common prefix: `prefix_key`
hashes everything that changes the cached tensors. Deciding *which* token ids to cache (so that no
logits are ever served from a longer or shorter cached prompt: cases L01/L02) is the session's job;
the store only guarantees that different token ids, models or policies never share an entry (L03,
L04). The case ids are the prefix-cache pitfalls listed in docs/CORPUS.md.

Layout under `root`:

    index.sqlite                       table `prefixes`: key, file, n_tokens, size_bytes, created_s,
                                       last_used_s, label, sha256 (WAL mode, sqlite-utils)
    <key>.safetensors                  one entry: tensors + header metadata (see `PrefixStore.put`)
    <key>.archive.safetensors          optional: the entry's archive of every token (table `archives`:
                                       key, size_bytes, sha256: the archive's digest, which covers
                                       its per-block digests; `put_archive`), evicted with its entry
    .<key>.<pid>.<random>.tmp          a write in progress (or left by a crashed writer)

A read in progress keeps its checkpoint (`engine.read_checkpoint`) as an ordinary entry under
`checkpoint_key(key)`, whose archive (digest "partial") is the file the read is writing: counted in
the budget, evicted and cleared like any entry (`begin_checkpoint`, `save_checkpoint`, `checkpoint`,
`release_checkpoint`).

Every entry is checksummed (SHA-256 of the whole file) and verified before it is parsed; a bad entry
is deleted and reported as a miss, so a poisoned cache never survives a restart (L04). An archive is
too large to hash at every open: its digest covers a digest per block, and a block is checked when
it is read (`engine.kvcache.archive`). A snapshot and its archive share one disk-budget rule
(`engine.disk_budget`).

The store holds only recomputable data, so it heals itself rather than asking the user to: a damaged
index (not a database, or failing SQLite's quick check) is moved aside to `index.sqlite.damaged` (kept
for inspection, replacing an older one) and a new, empty index is started, whose opening deletes the
now orphaned entry files; `clear_files` frees the space even when SQLite cannot run at all (a full disk);
`open_store` turns a store that cannot be used into (None, one readable line) for callers that go on
without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import sqlite_utils
import torch

from engine.disk_budget import parts_fit
from engine.errors import CacheStoreError, SettingsError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Version of both the key encoding and the file layout; bump it when either changes (old entries then
simply miss and age out through LRU eviction)."""

INDEX_NAME = "index.sqlite"
DAMAGED_SUFFIX = ".damaged"
"""The damaged index is kept as `index.sqlite.damaged` (one copy: the newest)."""
BUSY_TIMEOUT_S = 30.0
"""How long an SQLite call waits for another process's write transaction before giving up."""
STALE_TEMP_S = 3600.0
"""Temp files older than this are a crashed writer's leftovers; younger ones may be another process's
write in progress, so opening a store leaves them alone (`clear` removes them regardless)."""

SCHEMA_VERSION = 1
_TABLE = "prefixes"
_RESERVED_PREFIX = "halaman."
_META_FORMAT = "halaman.format_version"
_META_KEY = "halaman.key"
_META_N_TOKENS = "halaman.n_tokens"
_KEY_DOMAIN = b"halaman.prefix_key\x00"
_CHECKPOINT_DOMAIN = b"halaman.read_checkpoint\x00"
_CHECKPOINT_ARCHIVE_DIGEST = "partial"  # a checkpoint's archive is being written: it has no digest yet
_CONFIG_DOMAIN = b"halaman.prefix_config\x00"
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_SURROGATES = re.compile("[\ud800-\udfff]")
_ENTRY_RE = re.compile(r"([0-9a-f]{64})\.safetensors")
_ARCHIVE_RE = re.compile(r"([0-9a-f]{64})\.archive\.safetensors")
_ARCHIVES = "archives"
_SPANS_RE = re.compile(r"([0-9a-f]{64})\.spans\.sqlite")
_TEMP_RE = re.compile(r"\.([0-9a-f]{64})(?:\.spans\.sqlite)?\.\d+\.[0-9a-f]+\.tmp")


# SQLite's verdicts on the file itself, as opposed to locks, I/O errors or a full disk.
_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_NEARLY_FULL_BYTES = 1 << 20  # less free space than this: report a full disk, not SQLite's I/O error


class PrefixTooLargeError(CacheStoreError):
    """An entry is larger than the store's whole disk budget, so it was not stored."""


@dataclass(frozen=True)
class PrefixConfig:
    """Everything a prefix key hashes except the token ids: the computation a cache was made with.

    model_fingerprint / tokenizer_fingerprint: the loaded model's; policy: every cache-policy field
    (position mode resolved); dtype: compute / store dtypes; extra: whatever else changes the cached
    tensors (snapshot format, transformers version, RoPE base and scaling, device type; L03).
    `extra=None` and `extra={}` are the same. `key(token_ids)` is the prefix key; `signature` is the
    same hash without the token ids, which the library keeps to tell a stale cache (one the current
    model and settings would not make again) without tokenizing the document."""

    model_fingerprint: str
    tokenizer_fingerprint: str
    policy: Mapping[str, object]
    dtype: str
    extra: Mapping[str, str] | None = None

    def header_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces, ASCII only, NaN/inf refused) of
        `{"format_version", "model_fingerprint", "tokenizer_fingerprint", "policy", "dtype", "extra"}`.
        Raises TypeError for a non-string fingerprint, dtype, policy key or extra item, or a policy
        value JSON cannot encode; ValueError for NaN/inf."""
        for name in ("model_fingerprint", "tokenizer_fingerprint", "dtype"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        if not all(isinstance(name, str) for name in self.policy):
            raise TypeError("policy keys must be str")
        extra = dict(self.extra or {})
        if not all(isinstance(name, str) and isinstance(value, str) for name, value in extra.items()):
            raise TypeError("extra must map str to str")
        header = {
            "format_version": FORMAT_VERSION,
            "model_fingerprint": self.model_fingerprint,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "policy": dict(self.policy),
            "dtype": self.dtype,
            "extra": extra,
        }
        return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")

    @property
    def signature(self) -> str:
        """SHA-256 hex of the domain tag `b"halaman.prefix_config\\0"`, an 8-byte little-endian
        length and `header_bytes()`: equal for two keys exactly when all but their token ids are."""
        header = self.header_bytes()
        return hashlib.sha256(_CONFIG_DOMAIN + len(header).to_bytes(8, "little") + header).hexdigest()

    def key(self, token_ids: Sequence[int]) -> str:
        """The prefix key of `token_ids` made with this configuration (`prefix_key`)."""
        header_bytes = self.header_bytes()
        # A tensor or array would otherwise be unpacked one 0-d element at a time.
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
        try:
            ids_bytes = struct.pack(f"<{len(ids)}q", *ids)
        except struct.error as error:
            raise ValueError(f"token ids must be integers in the int64 range ({error})") from error
        digest = hashlib.sha256(_KEY_DOMAIN)
        digest.update(len(header_bytes).to_bytes(8, "little"))
        digest.update(header_bytes)
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids_bytes)
        return digest.hexdigest()


def checkpoint_key(key: str) -> str:
    """The key of the checkpoint of a read of `key` in progress (`engine.read_checkpoint`): SHA-256
    hex of a domain tag and `key`, so it is an ordinary entry's key that no prefix key can equal.
    Raises ValueError for a malformed key."""
    _check_key(key)
    return hashlib.sha256(_CHECKPOINT_DOMAIN + key.encode("ascii")).hexdigest()


def prefix_key(
    *,
    model_fingerprint: str,
    tokenizer_fingerprint: str,
    token_ids: Sequence[int],
    policy: Mapping[str, object],
    dtype: str,
    extra: Mapping[str, str] | None = None,
) -> str:
    """SHA-256 hex (64 lowercase characters) naming one prefilled cache (L03, L04).

    Hashed input, in this order:
      1. the domain tag `b"halaman.prefix_key\\0"`;
      2. an 8-byte little-endian length, then `PrefixConfig.header_bytes()`: canonical JSON of
         `{"format_version", "model_fingerprint", "tokenizer_fingerprint", "policy", "dtype", "extra"}`;
      3. an 8-byte little-endian token count, then every token id as a little-endian **int64**.

    Both variable-length parts are length-prefixed, so no two different inputs produce the same
    byte string. `extra` should carry whatever else changes the cached tensors (transformers version,
    RoPE base and scaling; L03). `extra=None` and `extra={}` are the same key. Policy values are
    compared as JSON, so `1` and `1.0` (or `1` and `True`) give different keys: a spurious miss, never
    a wrong hit. Raises TypeError for a non-string fingerprint, dtype, policy key or extra item, or a
    policy value JSON cannot encode; ValueError for NaN/inf or a token id outside int64.
    """
    return PrefixConfig(model_fingerprint, tokenizer_fingerprint, policy, dtype, extra).key(token_ids)


@dataclass(frozen=True)
class PrefixEntry:
    """One row of the index.

    `path` is always `root / f"{key}.safetensors"`; `size_bytes` and `sha256` describe that whole
    file; `created_s` and `last_used_s` are wall-clock seconds since the epoch (`time.time()`);
    `label` is for people (`halaman cache list`), e.g. document title and model name.
    """

    key: str
    path: Path
    n_tokens: int
    size_bytes: int
    created_s: float
    last_used_s: float
    label: str
    sha256: str
    archive_bytes: int = 0  # size of the entry's archive file, 0 if it has none


class PrefixStore:
    """Prefilled caches on disk under `root`, evicted least-recently-used beyond `disk_budget_bytes`.

    Files are safetensors (never pickle). The header's `__metadata__` holds the caller's metadata
    (str → str) plus three reserved fields (L04):

        halaman.format_version   str(FORMAT_VERSION)
        halaman.key              the entry's key, so a file renamed or swapped under another key misses
        halaman.n_tokens         the number of prefix tokens cached; must equal the index row's n_tokens

    Caller metadata keys starting with "halaman." are refused. The store does not know tensor
    shapes: checking them against the model (L04: validate the shapes on load) is the caller's job.

    Several processes (and threads) may use one root at once. Every change to files or rows runs
    inside one SQLite write transaction (`BEGIN IMMEDIATE`, waiting up to BUSY_TIMEOUT_S for other
    writers), so a row and its file change together; files appear only by `os.replace` of a fully
    written and fsynced temp file, so a reader sees a whole old file, a whole new file, or none.
    Readers work without the lock and only take it to confirm a failed check before deleting, so an
    entry replaced or evicted by another process mid-read is a miss or a retry, never a crash.

    Raises CacheStoreError if `root` cannot be created or the index cannot be opened (its message
    says what to do), SettingsError if `disk_budget_bytes` is negative. On open, rows whose file is
    gone are dropped, entry files without a row and stale temp files are deleted, and entries are
    evicted down to the budget (which may have been lowered since the last run).
    """

    def __init__(self, root: Path, *, disk_budget_bytes: int) -> None:
        if disk_budget_bytes < 0:
            raise SettingsError(f"The prefix cache disk budget must be >= 0 bytes, got {disk_budget_bytes}.")
        self.root = Path(root)
        self.disk_budget_bytes = int(disk_budget_bytes)
        self._index_path = self.root / INDEX_NAME
        self.notice: str | None = None  # one line for the user when opening had to heal the index
        self.evicted: list[str] = []  # labels of entries evicted for the budget, until `take_evicted`
        # One connection per store, shared by threads (the GUI may open the store on one thread and
        # prefill on the worker thread); the lock keeps its transactions from interleaving.
        self._lock = threading.RLock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CacheStoreError(
                f"Cannot create the prefix cache folder {self.root} ({error.strerror or error}); "
                "check its permissions or choose another cache location."
            ) from error
        try:
            self._open_index()
        except CacheStoreError as error:
            if not _is_damage(error.__cause__):
                raise
            self._set_aside(error.__cause__)
            self._open_index()

    def _open_index(self) -> None:
        self._db = None
        with self._index_errors("opened"):
            conn = sqlite3.connect(self._index_path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            self._db = sqlite_utils.Database(conn, execute_plugins=False)
            # WAL lets readers proceed while another process writes.
            _enable_wal(self._db)
            self._db.execute("PRAGMA synchronous=NORMAL")
            # A truncated file can open and answer simple queries; the quick check reads every page.
            verdict = self._db.execute("PRAGMA quick_check").fetchall()
            if verdict != [("ok",)]:
                raise sqlite3.DatabaseError(f"quick check: {verdict[0][0] if verdict else 'no answer'}")
            with self._write():
                self._ensure_schema()
                self._clean(stale_temp_s=STALE_TEMP_S)
                self._evict_to_budget(keep=None)

    def _set_aside(self, cause: BaseException | None) -> None:
        """Move a damaged index to index.sqlite.damaged (its WAL beside it) for inspection."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        kept = self.root / (INDEX_NAME + DAMAGED_SUFFIX)
        try:
            os.replace(self._index_path, kept)
            for suffix in ("-wal", "-shm"):
                side = self.root / (INDEX_NAME + suffix)
                if side.exists():
                    os.replace(side, self.root / (INDEX_NAME + DAMAGED_SUFFIX + suffix))
        except OSError as error:
            raise CacheStoreError(
                f"The prefix cache index {self._index_path} is damaged ({cause}) and could not be moved "
                f"aside ({error.strerror or error}); delete the folder {self.root} (it only holds re-computable caches)."
            ) from error
        log.info("prefix cache index %s was damaged (%s); moved to %s, starting a new one", self._index_path, cause, kept)
        self.notice = (f"the prefix cache index was damaged ({cause}); it was moved to {kept} and the cache "
                       "starts empty (documents are prefilled again)")

    # -- public API ----------------------------------------------------------------------------

    def get(self, key: str) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
        """Load the entry for `key`: `(tensors, metadata)` on a hit (CPU tensors, dtypes as stored;
        metadata exactly as given to `put`, without the reserved "halaman." fields), None on a miss.

        The whole file is read once, its size and SHA-256 checked against the index, then its header
        (format version, key, n_tokens) and tensors parsed. A missing, truncated, corrupt or
        mismatched entry is deleted (file and row) and reported as a miss (L04); it never raises for
        a bad entry. A hit refreshes `last_used_s`. Raises ValueError for a malformed key,
        CacheStoreError if the index itself cannot be read.
        """
        _check_key(key)
        with self._lock:
            row = self._row(key)
            if row is None:
                return None
            loaded = self._load_verified(key, row)
            if isinstance(loaded, str):
                # Another process may have replaced or evicted the entry while we read it; decide
                # under the write lock, where rows and files cannot change, before deleting.
                with self._write():
                    row = self._row(key)
                    if row is None:
                        return None
                    loaded = self._load_verified(key, row)
                    if isinstance(loaded, str):
                        log.warning("dropping prefix cache entry %s: %s", key, loaded)
                        self._drop(key)
                        return None
                    self._touch(key, row["sha256"])
                return loaded
            # Recency is advisory: losing one update to a busy index must not turn a hit into an error.
            try:
                with self._write():
                    self._touch(key, row["sha256"])
            except CacheStoreError as error:
                log.info("could not refresh recency of prefix cache entry %s: %s", key, error)
            return loaded

    def put(
        self,
        key: str,
        tensors: Mapping[str, torch.Tensor],
        metadata: Mapping[str, str],
        *,
        n_tokens: int,
        label: str,
    ) -> PrefixEntry:
        """Store `tensors` (any device, dtype and layout; saved contiguous on CPU) under `key`,
        replacing an existing entry, then evict least-recently-used entries (never this one) until
        the total size is <= `disk_budget_bytes`. Returns the new index row.

        The file is serialized in memory first, so an entry larger than the whole budget raises
        PrefixTooLargeError before anything on disk changes (existing entries are not evicted for
        it). Otherwise it is written to a temp file in `root`, flushed and fsynced, renamed into
        place and indexed in one transaction; on any failure the temp file (and a renamed file whose
        row was not committed) is removed and CacheStoreError is raised, so no partial entry is ever
        visible. Raises ValueError/TypeError for a malformed key, a non-tensor, a non-string or
        reserved ("halaman.") metadata item, or a negative n_tokens.
        """
        _check_key(key)
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an int >= 0, got {n_tokens!r}")
        if not isinstance(label, str):
            raise TypeError("label must be a str")
        # A label is for people; one with lone surrogates (a file name that was not UTF-8) would
        # make SQLite raise UnicodeEncodeError after the whole prefill.
        label = _SURROGATES.sub("\ufffd", label)
        header = _header_metadata(key, metadata, n_tokens)
        data = safetensors.torch.save(_prepare_tensors(tensors), metadata=header)
        if not parts_fit(len(data), 0, self.disk_budget_bytes):
            raise PrefixTooLargeError(
                f"The prefix cache for {label!r} needs {len(data)} bytes, more than the whole cache disk "
                f"budget ({self.disk_budget_bytes} bytes); raise the budget in settings to keep it."
            )
        sha256 = hashlib.sha256(data).hexdigest()
        final = self._entry_path(key)
        temp = self.root / f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        with self._lock:
            try:
                with open(temp, "xb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                with self._write():
                    os.replace(temp, final)
                    try:
                        now = time.time()
                        row = {
                            "key": key,
                            "file": final.name,
                            "n_tokens": n_tokens,
                            "size_bytes": len(data),
                            "created_s": now,
                            "last_used_s": now,
                            "label": label,
                            "sha256": sha256,
                        }
                        self._db[_TABLE].upsert(row, pk="key")
                        self._evict_to_budget(keep=key)
                    except BaseException:
                        # The rollback keeps the old row (if any); a file that matches no row is useless.
                        _remove(final)
                        raise
            except (OSError, sqlite3.Error) as error:
                raise CacheStoreError(
                    f"Could not save the prefix cache for {label!r} in {self.root} ({error}); "
                    "free some disk space or run `halaman cache clear`."
                ) from error
            finally:
                _remove(temp)
        return _entry(self.root, row)

    def archive_temp_path(self, key: str) -> Path:
        """A fresh temp path in `root` to write `key`'s archive to before `put_archive` (a crashed
        writer's file is cleaned up like any temp file)."""
        _check_key(key)
        return self.root / f".{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"

    def put_archive(self, key: str, temp: Path, *, sha256: str, size_bytes: int) -> Path:
        """Move the finished archive file `temp` into place as `key`'s archive and index it; the
        entry for `key` must exist (`put` first). Evicts least-recently-used entries (never this
        one) down to the budget, archives counted. Raises PrefixTooLargeError when entry + archive
        exceed the whole budget (`engine.disk_budget.parts_fit`: the rule that decided, before the
        read, that the archive would be written), CacheStoreError when there is no entry or the move
        fails; `temp` is deleted on every failure."""
        _check_key(key)
        final = self._archive_path(key)
        with self._lock:
            try:
                with self._write():
                    row = self._row(key)
                    if row is None:
                        raise CacheStoreError(f"No prefix cache entry for the archive {key[:12]}; store the entry first.")
                    if not parts_fit(row["size_bytes"], size_bytes, self.disk_budget_bytes):
                        raise PrefixTooLargeError(
                            f"The archive for {row['label']!r} needs {size_bytes} bytes, more than the cache disk "
                            f"budget ({self.disk_budget_bytes} bytes) leaves; raise the budget in settings to keep it."
                        )
                    os.replace(temp, final)
                    try:
                        self._db[_ARCHIVES].upsert({"key": key, "size_bytes": size_bytes, "sha256": sha256}, pk="key")
                        self._evict_to_budget(keep=key)
                    except BaseException:
                        _remove(final)
                        raise
            except OSError as error:
                raise CacheStoreError(f"Could not save the archive in {self.root} ({error}); free some disk space.") from error
            finally:
                _remove(temp)
        return final

    def archive(self, key: str) -> tuple[Path, str] | None:
        """(path, digest) of `key`'s archive, or None if it has none (the file is not verified here:
        `engine.kvcache.archive.Archive.open` checks the digest, reads check each block)."""
        _check_key(key)
        with self._lock, self._index_errors("read"):
            rows = self._db.execute_returning_dicts(f"SELECT sha256 FROM {_ARCHIVES} WHERE key = ?", [key])
        path = self._archive_path(key)
        return (path, rows[0]["sha256"]) if rows and path.is_file() else None

    def drop_archive(self, key: str) -> None:
        """Delete `key`'s archive (a damaged one); the entry stays."""
        _check_key(key)
        with self._lock, self._write():
            self._db.execute(f"DELETE FROM {_ARCHIVES} WHERE key = ?", [key])
            _remove(self._archive_path(key))

    # -- checkpoints of a read in progress (engine.read_checkpoint) -----------------------------

    def begin_checkpoint(self, key: str, *, label: str, archive_bytes: int | None) -> Path | None:
        """Start the checkpoints of a read of `key`: drop any earlier one, store an empty entry under
        `checkpoint_key(key)` and, when the read writes an archive of `archive_bytes` bytes (its
        preallocated size), index that archive from now on, so the disk budget counts it and other
        processes' cleanup leaves it alone. Returns the path the read must create its archive at
        (None without one). Evicts least-recently-used entries down to the budget. Raises
        PrefixTooLargeError when the archive exceeds the whole budget, CacheStoreError on failure."""
        checkpoint = checkpoint_key(key)
        self.delete(checkpoint)
        self.put(checkpoint, {}, {}, n_tokens=0, label=label)
        if archive_bytes is None:
            return None
        with self._lock, self._write():
            row = self._row(checkpoint)
            if row is None or not parts_fit(row["size_bytes"], archive_bytes, self.disk_budget_bytes):
                self._drop(checkpoint)
                raise PrefixTooLargeError(f"The archive being read for {label!r} ({archive_bytes} bytes) does not fit "
                                          f"the cache disk budget ({self.disk_budget_bytes} bytes).")
            self._db[_ARCHIVES].upsert({"key": checkpoint, "size_bytes": archive_bytes, "sha256": _CHECKPOINT_ARCHIVE_DIGEST},
                                       pk="key")
            self._evict_to_budget(keep=checkpoint)
        return self._archive_path(checkpoint)

    def save_checkpoint(self, key: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], *,
                        n_tokens: int, label: str) -> None:
        """Replace the checkpoint of the read of `key` with `tensors` (what `n_tokens` tokens read
        left); its archive, indexed by `begin_checkpoint`, stays. Raises like `put`."""
        self.put(checkpoint_key(key), tensors, metadata, n_tokens=n_tokens, label=label)

    def checkpoint(self, key: str) -> tuple[dict[str, torch.Tensor], dict[str, str], Path | None] | None:
        """The checkpoint of a read of `key`: (tensors, metadata, its archive's path or None), or None
        when there is none (a damaged one is dropped, as `get` does). Raises CacheStoreError."""
        checkpoint = checkpoint_key(key)
        found = self.get(checkpoint)
        if found is None:
            return None
        archive = self.archive(checkpoint)
        return found[0], found[1], archive[0] if archive is not None else None

    def checkpoint_tokens(self, key: str) -> int:
        """Tokens read by the checkpoint of a read of `key` (0: none), from the index only (the file
        is checked when it is loaded). Raises CacheStoreError."""
        with self._lock:
            row = self._row(checkpoint_key(key))
        return int(row["n_tokens"]) if row is not None else 0

    def release_checkpoint(self, key: str) -> Path | None:
        """The read of `key` is complete: drop its checkpoint, moving its archive (closed by its
        writer, finished) to a fresh temp path first, for `put_archive`. Returns that path (None:
        the checkpoint had no archive file). Raises CacheStoreError (then nothing changed)."""
        checkpoint = checkpoint_key(key)
        source, temp = self._archive_path(checkpoint), self.archive_temp_path(key)
        with self._lock:
            try:
                with self._write():
                    moved = source.is_file()
                    if moved:
                        os.replace(source, temp)
                    self._drop(checkpoint)
            except OSError as error:
                raise CacheStoreError(f"Could not move the archive in {self.root} ({error}).") from error
        return temp if moved else None

    def drop_checkpoint(self, key: str) -> None:
        """Delete the checkpoint of a read of `key` and its archive, if any. Raises CacheStoreError."""
        self.delete(checkpoint_key(key))

    def entries(self) -> list[PrefixEntry]:
        """All index rows, most recently used first. Raises CacheStoreError if the index fails."""
        with self._lock, self._index_errors("read"):
            rows = self._db.execute_returning_dicts(
                f"SELECT p.*, COALESCE(a.size_bytes, 0) AS archive_bytes FROM {_TABLE} p "
                f"LEFT JOIN {_ARCHIVES} a ON a.key = p.key ORDER BY p.last_used_s DESC, p.created_s DESC"
            )
        return [_entry(self.root, row) for row in rows]

    def total_bytes(self) -> int:
        """Sum of `size_bytes` over the index, archives included (temp files and orphans are not counted)."""
        with self._lock, self._index_errors("read"):
            return self._indexed_bytes()

    def _indexed_bytes(self) -> int:
        entries = self._db.execute(f"SELECT COALESCE(SUM(size_bytes), 0) FROM {_TABLE}").fetchall()[0][0]
        archives = self._db.execute(f"SELECT COALESCE(SUM(size_bytes), 0) FROM {_ARCHIVES}").fetchall()[0][0]
        return int(entries) + int(archives)

    def delete(self, key: str) -> bool:
        """Remove the entry for `key` (row and file); True if there was one. ValueError for a malformed key."""
        _check_key(key)
        with self._lock, self._write():
            existed = self._row(key) is not None or self._entry_path(key).exists()
            self._drop(key)
        return existed

    def clear(self) -> int:
        """Remove every entry, orphaned entry file and temp file; return the number of entries removed
        (index rows plus orphaned entry files). A `put` racing with it in another process may fail with
        CacheStoreError, since its temp file is removed too. When the index cannot be written (a full
        disk), the files are deleted by name anyway (`clear_files`): clearing always frees the space."""
        try:
            return self._clear_indexed()
        except CacheStoreError as error:
            log.info("prefix cache index unusable while clearing (%s); deleting the files by name", error)
            with self._lock:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                return clear_files(self.root)

    def _clear_indexed(self) -> int:
        with self._lock, self._write():
            keys = {row["key"] for row in self._db.execute_returning_dicts(f"SELECT key FROM {_TABLE}")}
            self._db.execute(f"DELETE FROM {_TABLE}")
            self._db.execute(f"DELETE FROM {_ARCHIVES}")
            for path in self._files():
                entry = _ENTRY_RE.fullmatch(path.name)
                if entry:
                    keys.add(entry.group(1))
                _remove(path)
        return len(keys)

    def close(self) -> None:
        """Close the index connection (the store cannot be used afterwards)."""
        with self._lock:
            self._db.close()

    # -- internals -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _index_errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as error:
            raise CacheStoreError(
                f"The prefix cache index {self._index_path} could not be {action} ({error}); close other "
                f"Halaman windows and retry, or delete the folder {self.root} (it only holds re-computable caches)."
            ) from error

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction. IMMEDIATE takes the write lock up front: a deferred transaction that
        later upgrades can fail with SQLITE_BUSY at once in WAL mode instead of waiting."""
        with self._index_errors("updated"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.commit()
            except BaseException:
                self._db.rollback()
                raise

    def _ensure_schema(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchall()[0][0]
        if version not in (0, SCHEMA_VERSION):
            raise CacheStoreError(
                f"The prefix cache index {self._index_path} has schema version {version}, this Halaman "
                f"understands {SCHEMA_VERSION}; delete the folder {self.root} or use the matching Halaman version."
            )
        table = self._db[_TABLE]
        table.create(
            {
                "key": str,
                "file": str,
                "n_tokens": int,
                "size_bytes": int,
                "created_s": float,
                "last_used_s": float,
                "label": str,
                "sha256": str,
            },
            pk="key",
            not_null={"file", "n_tokens", "size_bytes", "created_s", "last_used_s", "label", "sha256"},
            if_not_exists=True,
        )
        table.create_index(["last_used_s"], if_not_exists=True)
        self._db[_ARCHIVES].create({"key": str, "size_bytes": int, "sha256": str}, pk="key",
                                   not_null={"size_bytes", "sha256"}, if_not_exists=True)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _entry_path(self, key: str) -> Path:
        return self.root / f"{key}.safetensors"

    def _archive_path(self, key: str) -> Path:
        return self.root / f"{key}.archive.safetensors"

    def text_index_path(self, key: str) -> Path:
        """Where `key`'s full-text index of spans lives (`engine.evidence.text_index`): derived data that
        carries its own digest, rebuilt by its reader when missing or damaged, deleted with the entry."""
        _check_key(key)
        return self.root / f"{key}.spans.sqlite"

    def _row(self, key: str) -> dict | None:
        with self._index_errors("read"):
            rows = self._db.execute_returning_dicts(f"SELECT * FROM {_TABLE} WHERE key = ?", [key])
        return rows[0] if rows else None

    def _touch(self, key: str, sha256: str) -> None:
        # Matching the checksum too: a concurrent put may have replaced the row since we verified it.
        self._db.execute(
            f"UPDATE {_TABLE} SET last_used_s = ? WHERE key = ? AND sha256 = ?", [time.time(), key, sha256]
        )

    def _drop(self, key: str) -> None:
        """Delete row and file; call inside `_write`. Only the path derived from the key is ever
        deleted, whatever the row's `file` column says."""
        self._db.execute(f"DELETE FROM {_TABLE} WHERE key = ?", [key])
        self._db.execute(f"DELETE FROM {_ARCHIVES} WHERE key = ?", [key])
        _remove(self._entry_path(key))
        _remove(self._archive_path(key))
        _remove(self.text_index_path(key))

    def _load_verified(self, key: str, row: Mapping) -> tuple[dict[str, torch.Tensor], dict[str, str]] | str:
        """The entry's contents, or a reason string why it is unusable."""
        if row["file"] != f"{key}.safetensors":
            return f"index row names file {row['file']!r}"
        try:
            # One read, then checks and parsing on that buffer: the file cannot change in between.
            data = self._entry_path(key).read_bytes()
        except OSError as error:
            return f"file unreadable ({error.strerror or error})"
        if len(data) != row["size_bytes"]:
            return f"size {len(data)} bytes, index says {row['size_bytes']}"
        if hashlib.sha256(data).hexdigest() != row["sha256"]:
            return "checksum mismatch"
        try:
            (header_len,) = struct.unpack("<Q", data[:8])
            if header_len > len(data) - 8:
                return "header length beyond end of file"
            header_meta = json.loads(data[8 : 8 + header_len]).get("__metadata__")
            tensors = safetensors.torch.load(data)
        except Exception as error:  # noqa: BLE001 - any parse failure means a bad entry, not a crash
            return f"unparsable ({type(error).__name__}: {error})"
        if not isinstance(header_meta, dict):
            return "no metadata in the header"
        expected = {_META_FORMAT: str(FORMAT_VERSION), _META_KEY: key, _META_N_TOKENS: str(row["n_tokens"])}
        for name, value in expected.items():
            if header_meta.get(name) != value:
                return f"header {name}={header_meta.get(name)!r}, expected {value!r}"
        metadata = {k: v for k, v in header_meta.items() if not k.startswith(_RESERVED_PREFIX)}
        return tensors, metadata

    def _files(self) -> list[Path]:
        return store_files(self.root)

    def _clean(self, *, stale_temp_s: float) -> None:
        """Drop rows without a usable file, delete entry files without a row and stale temp files.
        Call inside `_write`: a writer renames and indexes under the same lock, so a file without a
        row here really is an orphan."""
        rows = self._db.execute_returning_dicts(f"SELECT key, file FROM {_TABLE}")
        indexed = set()
        for row in rows:
            key = row["key"]
            if not (isinstance(key, str) and _KEY_RE.fullmatch(key)):
                self._db.execute(f"DELETE FROM {_TABLE} WHERE key = ?", [key])
            elif row["file"] != f"{key}.safetensors" or not self._entry_path(key).is_file():
                self._drop(key)
            else:
                indexed.add(key)
        archived = {row["key"] for row in self._db.execute_returning_dicts(f"SELECT key FROM {_ARCHIVES}")}
        for key in archived - indexed:
            self._db.execute(f"DELETE FROM {_ARCHIVES} WHERE key = ?", [key])
        now = time.time()
        for path in self._files():
            entry = _ENTRY_RE.fullmatch(path.name) or _SPANS_RE.fullmatch(path.name)
            archive = _ARCHIVE_RE.fullmatch(path.name)
            if entry or archive:
                if (entry or archive).group(1) not in (indexed if entry else indexed & archived):
                    _remove(path)
                continue
            try:
                age_s = now - path.stat().st_mtime
            except OSError:
                continue
            if age_s > stale_temp_s:
                _remove(path)

    def _evict_to_budget(self, *, keep: str | None) -> None:
        """Delete least-recently-used entries until the total fits the budget; call inside `_write`."""
        total = self._indexed_bytes()
        if total <= self.disk_budget_bytes:
            return
        victims = self._db.execute(
            f"SELECT p.key, p.label, p.size_bytes + COALESCE(a.size_bytes, 0) FROM {_TABLE} p LEFT JOIN {_ARCHIVES} a "
            "ON a.key = p.key WHERE p.key != ? ORDER BY p.last_used_s ASC, p.created_s ASC",
            [keep or ""],
        ).fetchall()
        for key, label, size_bytes in victims:
            if total <= self.disk_budget_bytes:
                break
            self._drop(key)
            self.evicted.append(label)
            total -= size_bytes

    def take_evicted(self) -> list[str]:
        """Labels of the entries evicted to stay within the disk budget since the last call, least
        recently used first (a document's saved reading: "book.pdf · SmolLM2…"); then forgets them."""
        with self._lock:
            evicted, self.evicted = self.evicted, []
        return evicted


def _enable_wal(db: sqlite_utils.Database) -> None:
    """Switch the index to WAL, waiting up to BUSY_TIMEOUT_S for other processes.

    SQLite does not wait on its own here: `PRAGMA journal_mode=wal` reads the header under a shared
    lock, then needs an exclusive one, and a connection that holds a shared lock is answered "database
    is locked" at once rather than wait (waiting could deadlock). Two processes opening a new store
    together (the window and a `halaman ask`; tests/test_prefix_store.py's four workers) hit it.
    Once switched, WAL is stored in the file, so later opens skip the switch."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.enable_wal()
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def open_store(root: Path, *, disk_budget_bytes: int) -> tuple[PrefixStore | None, str | None]:
    """Open the store at `root` for a caller that can do without it: (store, notice or None) when
    it works (notice: it had to heal its index), (None, notice) when it cannot be used (full disk,
    read-only folder, index locked by a crashed process). The notice is one line for the user.
    Raises SettingsError for a negative budget only."""
    try:
        store = PrefixStore(root, disk_budget_bytes=disk_budget_bytes)
    except CacheStoreError as error:
        log.info("prefix cache not used: %s", error)
        return None, f"the prefix cache cannot be used ({_short(error, root)}), so it is off for now: documents are prefilled every time"
    return store, store.notice


def store_files(root: Path) -> list[Path]:
    """Entry, archive, span-index and temp files in `root`, by name pattern only: never touch anything
    we did not write. What `PrefixStore.clear` deletes, but for the index."""
    try:
        children = list(Path(root).iterdir())
    except OSError:
        return []
    return [p for p in children
            if any(pattern.fullmatch(p.name) for pattern in (_ENTRY_RE, _ARCHIVE_RE, _SPANS_RE, _TEMP_RE))]


def stored_size(root: Path) -> tuple[int, int]:
    """(entries, bytes) that clearing `root` frees, counted by name without SQLite, so that a store
    whose index cannot be opened (a full disk) is counted too."""
    entries, size = 0, 0
    for path in store_files(root):
        entries += bool(_ENTRY_RE.fullmatch(path.name))
        with contextlib.suppress(OSError):  # deleted meanwhile by another process
            size += path.stat().st_size
    return entries, size


def clear_files(root: Path) -> int:
    """Delete the store's entry, archive and temp files and its index files under `root` by name, without
    SQLite (for when the index cannot be opened or written). Returns the number of entry files
    deleted. A damaged index kept for inspection is deleted too: clearing frees all the space."""
    try:
        children = list(Path(root).iterdir())
    except OSError:
        return 0
    removed = 0
    index_names = {INDEX_NAME + suffix for suffix in ("", "-wal", "-shm", DAMAGED_SUFFIX,
                                                      DAMAGED_SUFFIX + "-wal", DAMAGED_SUFFIX + "-shm")}
    for path in children:
        if _ENTRY_RE.fullmatch(path.name):
            removed += 1
        elif not (any(p.fullmatch(path.name) for p in (_ARCHIVE_RE, _SPANS_RE, _TEMP_RE)) or path.name in index_names):
            continue  # never touch anything we did not write
        _remove(path)
    return removed


def _is_damage(error: BaseException | None) -> bool:
    """Whether an SQLite error means the index file itself is damaged (not locked, not a full disk)."""
    if not isinstance(error, sqlite3.DatabaseError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    # The quick check's own verdict carries no code; SQLITE_CORRUPT may come as an extended code.
    return code is None or code & 0xFF in _DAMAGE_CODES


def _short(error: CacheStoreError, root: Path) -> str:
    """Why the store cannot be used, in a few words: SQLite says "disk I/O error" for a full disk."""
    try:
        if shutil.disk_usage(root).free < _NEARLY_FULL_BYTES:
            return "the disk holding it is full"
    except OSError:
        pass
    cause = error.__cause__
    return str(getattr(cause, "strerror", None) or cause or error)


def _check_key(key: str) -> None:
    # Keys become file names: anything but 64 hex digits could escape root.
    if not (isinstance(key, str) and _KEY_RE.fullmatch(key)):
        raise ValueError(f"not a prefix key (64 lowercase hex digits): {key!r}")


def _header_metadata(key: str, metadata: Mapping[str, str], n_tokens: int) -> dict[str, str]:
    header: dict[str, str] = {}
    for name, value in metadata.items():
        if not (isinstance(name, str) and isinstance(value, str)):
            raise TypeError(f"metadata must map str to str, got {name!r}: {type(value).__name__}")
        if name.startswith(_RESERVED_PREFIX):
            raise ValueError(f"metadata key {name!r} uses the reserved prefix {_RESERVED_PREFIX!r}")
        header[name] = value
    header.update({_META_FORMAT: str(FORMAT_VERSION), _META_KEY: key, _META_N_TOKENS: str(n_tokens)})
    return header


def _prepare_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dense, contiguous CPU tensors, none sharing memory (safetensors refuses aliases)."""
    prepared: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            raise TypeError(f"{name!r} is not a dense torch.Tensor")
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if tensor.numel() and storage in seen_storages:
            tensor = tensor.clone()
            storage = tensor.untyped_storage().data_ptr()
        seen_storages.add(storage)
        prepared[name] = tensor
    return prepared


def _entry(root: Path, row: Mapping) -> PrefixEntry:
    return PrefixEntry(
        key=row["key"],
        path=root / f"{row['key']}.safetensors",
        n_tokens=int(row["n_tokens"]),
        size_bytes=int(row["size_bytes"]),
        created_s=float(row["created_s"]),
        last_used_s=float(row["last_used_s"]),
        label=row["label"],
        sha256=row["sha256"],
        archive_bytes=int(row.get("archive_bytes", 0)),
    )


def _remove(path: Path) -> None:
    # Best effort: a file already gone is fine, and on Windows a file another process holds open
    # cannot be deleted; the next open's cleanup takes it.
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        log.info("could not remove %s: %s", path, error)
