"""Checkpoints of a whole read: what a read stopped half-way keeps, so that the next one goes on.

Reading a book whole takes up to an hour on a slow CPU (`DocumentSession.read`). A read paused for a
question, cancelled (the document or the app closed) or killed keeps what it read in the prefix
store, and the next read of the same document (the same prefix key), in this process or after a
restart, goes on from its last saved chunk instead of token 0. It ends with the snapshot and the
archive a read in one go makes: the cache restored from a checkpoint holds the same tensors, H2O
scores and positions, and the archive's digests are computed again from its bytes.

A checkpoint is an ordinary prefix-store entry under `checkpoint_key(key)` (safetensors, its
SHA-256 checked when loaded, counted in the disk budget, evicted least-recently-used like any
entry): the partial compressed cache (`CompressedCache.export`, `seen_tokens` included) and the
digests of the archive written so far (`ArchiveWriter.digests`). The archive itself is written in
place, as that entry's archive, from the read's first chunk (`PrefixStore.begin_checkpoint`): a
checkpoint copies nothing, it flushes the file and stores the cache (a few MB to tens of MB).

Saved: after `FIRST_CHECKPOINT_S` of reading, then at doubling intervals up to every
`CHECKPOINT_EVERY_S`, when the read pauses, and when it is cancelled or
fails inside a chunk (from a copy of the cache taken at the chunk's start: the stopped chunk left
the cache half-updated). Deleted once the whole read is saved (its archive becomes the document's)
and, like every entry, when the cache is cleared. One that cannot be used (damaged, made with other
settings, its archive missing or differing from its digests) is dropped: the read starts at 0.

Not handled: two processes reading the same document at the same time share one checkpoint, and
the second to start drops the first's. Nothing wrong is ever answered from the result (the archive's
digest and each block's are checked before use), but one of the two may end without its archive.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import CacheStoreError
from engine.kvcache.archive import ArchiveError, ArchiveLayout, ArchiveWriter
from engine.kvcache.cache import CompressedCache
from engine.prefix_store import PrefixStore
from engine.settings import CachePolicy

if TYPE_CHECKING:  # types only: the decoder is the model layer's, above the cache
    from engine.models.decoder import CompressedDecoder

log = logging.getLogger(__name__)

CHECKPOINT_EVERY_S = 60.0
"""Seconds of reading between two checkpoints: what a crash can cost at most (plus the chunk under
way). A checkpoint stores the partial cache (tens of MB at the default budget) and flushes the
archive: well under a second, so this interval costs the read about 1 %."""
FIRST_CHECKPOINT_S = 5.0
"""The first checkpoint comes after this much reading and the interval doubles up to
`CHECKPOINT_EVERY_S` (5, 10, 20, 40, 60 s …): a read killed in its first minute kept nothing, while
a small cache costs little to store early on."""

_ARCHIVE_PREFIX = "archive."  # names of the archive's digests among a checkpoint's tensors


class ReadCheckpoints:
    """The checkpoints of one read of the document `key` (`n_tokens` prefix tokens) in `store`.

    `saved_tokens`: tokens read by the checkpoint on disk (0: none), at first from the store's
    index. Nothing here raises for the store or the file system: a checkpoint that cannot be saved
    or loaded costs what it would have saved, never the read (it is logged).
    """

    def __init__(self, store: PrefixStore, key: str, n_tokens: int, label: str) -> None:
        self.store, self.key, self.n_tokens, self.label = store, key, n_tokens, label
        try:
            self.saved_tokens = store.checkpoint_tokens(key)
        except CacheStoreError:
            self.saved_tokens = 0
        self._archive: Path | None = None   # the checkpoint's archive file, which the read writes
        self._running = False               # this read keeps checkpoints (it began or loaded one)
        self._saved_at = time.monotonic()
        self._interval_s = FIRST_CHECKPOINT_S  # reading before the next checkpoint, doubling
        self._boundary: tuple[CompressedCache, dict | None] | None = None  # the last chunk's end, not saved yet

    def load(self, decoder: CompressedDecoder, policy: CachePolicy,
             layout: ArchiveLayout | None) -> tuple[CompressedCache, ArchiveWriter | None] | None:
        """The read as the checkpoint on disk left it: (its cache, the archive writer going on from
        there; None when `layout` is None: no archive is written), or None when there is no usable
        checkpoint (an unusable one is dropped: damaged, made with another policy or shape, its
        archive missing, of another layout or differing from its digests)."""
        try:
            found = self.store.checkpoint(self.key)
        except CacheStoreError as error:
            log.info("read checkpoint not loaded: %s", error)
            found = None
        if found is None:
            self.saved_tokens = 0
            return None
        tensors, meta, archive = found
        try:
            cache = CompressedCache.restore({n: t for n, t in tensors.items() if not n.startswith(_ARCHIVE_PREFIX)}, meta,
                                            shape=decoder.shape, policy=policy, device=decoder.device,
                                            store_dtype=decoder.store_dtype)
            if not 0 < cache.seen_tokens < self.n_tokens:
                raise ValueError(f"it holds {cache.seen_tokens} of {self.n_tokens} tokens")
            writer = None
            if layout is not None:
                if archive is None:
                    raise ArchiveError("its archive is missing")
                digests = {n[len(_ARCHIVE_PREFIX):]: t for n, t in tensors.items() if n.startswith(_ARCHIVE_PREFIX)}
                writer = ArchiveWriter.resume(archive, layout, decoder.rope, cache.seen_tokens, digests)
        except (ValueError, KeyError, OSError) as error:  # ArchiveError is a ValueError
            log.warning("dropping the read checkpoint of %s (%s): the read starts at token 0", self.key[:12], error)
            self.drop()
            return None
        self._start(archive)
        self.saved_tokens = cache.seen_tokens
        return cache, writer

    def begin(self, layout: ArchiveLayout | None) -> Path | None:
        """Start keeping checkpoints of a read from token 0 (an earlier checkpoint is dropped);
        returns where to create its archive (the checkpoint's, in the store), None when `layout` is
        None or the store refused (the read then goes on without checkpoints)."""
        try:
            path = self.store.begin_checkpoint(self.key, label=self._label(0),
                                               archive_bytes=layout.file_bytes if layout is not None else None)
        except CacheStoreError as error:  # PrefixTooLargeError too
            log.info("the read keeps no checkpoints: %s", error)
            self.saved_tokens = 0
            return None
        self._start(path)
        self.saved_tokens = 0
        return path

    def _start(self, archive: Path | None) -> None:
        self._archive, self._running, self._boundary = archive, True, None
        self._saved_at, self._interval_s = time.monotonic(), FIRST_CHECKPOINT_S

    def after_chunk(self, cache: CompressedCache, writer: ArchiveWriter | None) -> None:
        """Between two chunks (the cache consistent, the archive written up to it): save a
        checkpoint if the interval passed since the last one (`FIRST_CHECKPOINT_S`, doubling up to
        `CHECKPOINT_EVERY_S`); else remember this point (a
        fork of the cache, sharing its tensors until either changes them) in case the next chunk
        is cancelled. Nothing after the last chunk: the whole read is saved next."""
        if not self._running or cache.seen_tokens >= self.n_tokens:
            return
        digests = writer.digests() if writer is not None else None
        if time.monotonic() - self._saved_at >= min(self._interval_s, CHECKPOINT_EVERY_S):
            self._save(cache, digests, writer)
        else:
            self._boundary = (cache.fork(), digests)

    def save(self, cache: CompressedCache, writer: ArchiveWriter | None) -> None:
        """Save a checkpoint of `cache` now (the read paused between two chunks)."""
        if self._running:
            self._save(cache, writer.digests() if writer is not None else None, writer)

    def _save(self, cache: CompressedCache, digests: dict | None, writer: ArchiveWriter | None) -> None:
        if cache.seen_tokens <= self.saved_tokens:
            return
        tensors, meta = cache.export()
        if digests is not None:
            tensors.update({_ARCHIVE_PREFIX + name: t for name, t in digests.items()})
        try:
            if writer is not None:
                writer.flush()  # the archive holds what the checkpoint says, even after a power cut
            self.store.save_checkpoint(self.key, tensors, meta, n_tokens=cache.seen_tokens, label=self._label(cache.seen_tokens))
        except (CacheStoreError, OSError) as error:
            log.info("read checkpoint not saved: %s", error)
            return
        self.saved_tokens, self._saved_at, self._boundary = cache.seen_tokens, time.monotonic(), None
        self._interval_s = min(2 * self._interval_s, CHECKPOINT_EVERY_S)

    def stopped(self, writer: ArchiveWriter | None) -> None:
        """The read was cancelled or failed inside a chunk: save the cache of that chunk's start,
        then `close`."""
        if self._running and self._boundary is not None:
            self._save(*self._boundary, writer)
        self.close(writer)

    def close(self, writer: ArchiveWriter | None) -> None:
        """The read stops here (it may go on later, or after a restart): close its archive, kept
        when a checkpoint holds part of it, else deleted with the empty checkpoint."""
        keep = self._running and self.saved_tokens > 0
        if writer is not None and keep:
            writer.close()
        elif writer is not None:
            writer.abort()
        if self._running and not keep:
            self.drop()
        self._running, self._boundary = False, None

    def release(self, writer: ArchiveWriter | None) -> None:
        """The whole read is done and `writer` finished (its file closed): drop the checkpoint. Its
        archive, `writer`'s file, moves to a temp path first (`writer.path` follows) for
        `PrefixStore.put_archive`; when that fails it stays where it is, which works as well."""
        self._running, self._boundary = False, None
        try:
            moved = self.store.release_checkpoint(self.key)
        except CacheStoreError as error:
            log.info("read checkpoint not released: %s", error)
            return
        self.saved_tokens = 0
        if moved is None:
            return
        if writer is not None and writer.path == self._archive:
            writer.path = moved
        else:  # the checkpoint's archive, not this read's (read without one this time)
            moved.unlink(missing_ok=True)

    def drop(self) -> None:
        """Delete the checkpoint on disk, if any."""
        try:
            self.store.drop_checkpoint(self.key)
        except CacheStoreError as error:
            log.info("read checkpoint not deleted: %s", error)
        self.saved_tokens = 0

    def _label(self, tokens: int) -> str:
        return f"{self.label} (read in part: {tokens:,} of {self.n_tokens:,} tokens)"
