"""Reading: a document into an `OpenDocument` with one model, its settings and the prefix store.

    reader = Reader(model, settings, store)
    opened = reader.open("book.pdf", progress=print)    # PDF / folder / text → token ids → cache
    reader.read(opened)                                   # opened index first: read it whole later

`open` renders the document (`engine.documents`) into the prompt prefix (`engine.prompt`) and
tokenizes it. The prefix-cache key is the SHA-256 of model, tokenizer, the exact token ids and the
cache policy (`prefix_config`, `engine.prefix_store.prefix_key`). On a hit the compressed cache is
restored from disk; on a miss the prefix is prefilled chunk by chunk into a `CompressedCache`
(sinks + window + heavy hitters, INT4 blocks) and saved: the document's *snapshot*. While
prefilling, every token's K/V also goes to the document's *archive* on disk (INT4, with per-block
key bounds; `engine.kvcache.archive`), saved beside the snapshot under the same key; a long read
keeps checkpoints to go on after a stop (`engine.read_checkpoint`). The spans and their full-text
index are built at open, before any read (index first). The recall plan (`engine.recall_plan`) is
decided here and kept in the document's report.
Cancel: set the `cancel` event; prefill stops between two layers (well under a second).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from engine import paths, read_time
from engine.documents import Document, load_document
from engine.documents.names import check_unicode
from engine.errors import CacheStoreError, Cancelled, HalamanError, SettingsError, halaman_errors_only
from engine.estimate import QUESTION_RESERVE_TOKENS, full_cache_bytes
from engine.kvcache.archive import Archive, ArchiveError, ArchiveLayout, ArchiveWriter
from engine.kvcache.cache import CompressedCache
from engine.models.loader import LoadedModel
from engine.open_document import OpenDocument, OpenReport, PendingRead, RecallNotice
from engine.prefix_store import PrefixConfig, PrefixStore, PrefixTooLargeError
from engine.progress import Phase, PrefillClock, Progress, reading_progress
from engine.prompt import PrefixEncoding, chat_layout, encode_document, follow_up_suffix, question_suffix
from engine.read_checkpoint import ReadCheckpoints
from engine.read_time import RateKey, ReadPlan
from engine.recall_plan import RecallPlan, RecallSource, plan_recall
from engine.settings import CachePolicy, EngineSettings
from engine.evidence.spans import DocumentSpans
from engine.evidence.text_index import IndexDamaged
from engine.threads import ThreadGovernor, apply_threads

# Bumped whenever what a snapshot holds, or how it is computed, changes.
SNAPSHOT_FORMAT = "halaman-kv-1"
UNREAD_REASON = ("the document is not read whole yet: each question re-reads the parts it chooses from their "
                 "token ids")
"""The recall plan's reason while a document opened index first is not read (`DocumentSession.read`)."""


class Reader:
    """Reads documents into `OpenDocument`s with one model, its settings and the prefix store (None:
    without one, or after it failed: `notices` says so once). Not thread-safe: one caller at a time.

    `open(..., before_prefill=f)`: `f(plan)` is called when a prefill is about to run (a prefix-cache
    miss) and the `ReadPlan` says it takes at least `engine.read_time.LONG_READ_S`; when it returns
    False nothing is prefilled and Cancelled is raised. `on_read_plan(plan)` is told the plan of
    every prefill about to run, short or long (a command line says how long before it starts). A
    finished prefill records its rate for the next plans (`engine.read_time.record_rate`).

    `open(..., read_now=False)` (index first): on a prefix-cache miss, a document that span recall
    can answer is not read: the open ends once its spans and full-text index exist (seconds for a
    book), questions re-read the spans they choose from their token ids, and `read` reads it whole
    later (the report's `unread` says so). A document the cache keeps whole, or with recall off,
    is read at once either way.
    """

    def __init__(self, model: LoadedModel, settings: EngineSettings, store: PrefixStore | None = None) -> None:
        self.model = model
        self.settings = settings
        self.store = store if settings.prefix_cache else None
        self.notices: list[str] = []  # lines for the next OpenReport's warnings, e.g. "the prefix cache is off"
        self.layout = chat_layout(model.tokenizer)
        self.filling: CompressedCache | None = None  # the cache a running prefill is filling (the live gauge)

    @halaman_errors_only("opening the document")
    def load(self, path: str, *, password: str | None = None, progress: Callable[[Progress], None] | None = None,
             cancel: threading.Event | None = None) -> Document:
        """The document at `path` read and checked (`load_document`, then its text checked for the
        tokenizer), without touching the model or any open document: the first step of `open`,
        which `DocumentSession.open` takes before it closes the document open now, so a file that
        cannot be read leaves that one open. Raises DocumentError, Cancelled."""
        notify = progress or (lambda _p: None)
        document = load_document(path, password=password, cancel=cancel, progress=reading_progress(notify, path),
                                 include_generated=self.settings.include_generated_files)
        check_unicode(document.render() + document.title, document.title)
        return document

    @halaman_errors_only("opening the document")
    def open(
        self,
        path: str | Document,
        *,
        password: str | None = None,
        progress: Callable[[Progress], None] | None = None,
        cancel: threading.Event | None = None,
        before_prefill: Callable[[ReadPlan], bool] | None = None,
        read_now: bool = True,
        on_read_plan: Callable[[ReadPlan], None] | None = None,
    ) -> OpenDocument:
        """Read, tokenize and prefill (or restore) a document: the `OpenDocument` (its `report` says
        what it did and cost). Raises DocumentError, Cancelled, and any other failure as a one-line
        HalamanError (nothing else leaves it).

        `path` may also be a `Document` already read with `load_document` (the CLI reads first, so
        a bad file is reported before the model is loaded).

        `before_prefill`, `on_read_plan` and `read_now`: see the class docstring.
        """
        began = time.perf_counter()
        notify = progress or (lambda _p: None)
        if isinstance(path, Document):
            document = path
            check_unicode(document.render() + document.title, document.title)  # before any model work
        else:
            document = self.load(path, password=password, progress=progress, cancel=cancel)  # read and checked
        notify(Progress(Phase.TOKENIZING, 0, 1, "documents"))
        encoding = self.encode_document(document)
        n = len(encoding.ids)
        policy = self._resolve_policy(n)
        key = self.prefix_config(policy).key(encoding.ids)
        # Before the read the plan says whether an archive is written; after it, what questions do.
        planned = self.plan_recall(n, spans=bool(encoding.token_chars))
        layout = self._archive_layout(n, policy) if planned.uses_archive else None
        recall_warnings: list[str] = []
        archive_missing: list[str] = []  # why the archive the plan needs is not there
        cache, hit = self._restore(key, policy, n, notify)
        # Index first: the spans and their full-text index need the text, not the model, so they
        # exist before the read, and a document not read yet is answered from re-read spans.
        spans = self._document_spans(document, encoding, key, recall_warnings)
        archive, own_archive, unread, read, read_plan = None, None, None, None, None
        try:
            if cache is None:
                label = f"{document.title} · {self.model.label}"
                checkpoints = ReadCheckpoints(self.store, key, n, label) if self.store is not None else None
                read = PendingRead(encoding.ids, policy, key, layout, label, checkpoints=checkpoints)
                if read_now or not (planned.by_spans and spans is not None):
                    self._read_at_open(read, document.title, notify, cancel, before_prefill, on_read_plan)
                    cache, archive, own_archive = read.cache, read.archive, read.own_archive
                    archive_missing += read.missing
                else:
                    cache, unread, read_plan = self._unread_snapshot(policy, n), read, self._unread_plan(read)
            elif layout is not None:
                archive = self._open_archive(key, layout, archive_missing)
        except BaseException:
            if spans is not None:
                spans.close()
            raise
        if unread is not None:
            plan = RecallPlan(RecallSource.REREAD, UNREAD_REASON)
        else:  # the budget's verdict stands even if the store turned itself off during the read
            plan = self.plan_recall(n, spans=spans is not None,
                                    archive_missing=archive_missing[0] if archive_missing else planned.archive_missing)
        notice = RecallNotice.of(plan)
        read_s = 0.0 if hit or unread is not None else read.seconds
        report = OpenReport(
            title=document.title, kind=document.kind, document_tokens=n, prefix_hit=hit,
            position_mode=policy.position_mode, seconds=time.perf_counter() - began,
            prefill_seconds=read_s, prefill_tokens_per_s=(n - read.resumed_from) / read_s if read_s else 0.0,
            kv=cache.memory(), full_fp16_bytes=full_cache_bytes(self.model.profile, n),
            warnings=[*self.notices, *document.warnings, *([str(notice)] if notice else []), *recall_warnings],
            pages=document.pages, threads=0 if hit or unread is not None else read.threads,
            recall_notice=notice, recall_plan=plan, unread=unread is not None, read_plan=read_plan,
            read_from=unread.tokens_read if unread is not None else 0,
        )
        self.notices = []  # said once
        return OpenDocument(document, encoding, key, cache, report, spans=spans, archive=archive,
                            own_archive=own_archive, pending_read=unread, prefilled=not hit)

    def _read_at_open(self, read: PendingRead, title: str, notify: Callable[[Progress], None],
                      cancel: threading.Event | None, before_prefill: Callable[[ReadPlan], bool] | None,
                      on_read_plan: Callable[[ReadPlan], None] | None) -> None:
        """Read `read` whole now, telling `on_read_plan` its plan first; raises Cancelled when
        `before_prefill` turns a long read down (see `open`) or `cancel` stops it."""
        threads = apply_threads(self.settings.threads) if self.model.device.type == "cpu" else 0
        if before_prefill is not None or on_read_plan is not None:
            to_read = len(read.ids) - read.tokens_read  # what a checkpoint of an earlier read leaves
            plan = read_time.plan_read(to_read, self._rate_key(threads), self.model.parameters)
            if on_read_plan is not None:
                on_read_plan(plan)
            if before_prefill is not None and plan.is_long and not before_prefill(plan):
                raise Cancelled(f"Reading {title} was not started: {plan.describe()}")
        self._run_read(read, notify, cancel, None, threads=threads)

    def _unread_plan(self, read: PendingRead) -> ReadPlan:
        """How long `read` (left for later) will take, from where its checkpoint stands."""
        # The thread count the model runs with now: the read decides its own only when it
        # starts (sampling the cores takes a moment the open should not spend).
        threads = torch.get_num_threads() if self.model.device.type == "cpu" else 0
        return read_time.plan_read(len(read.ids) - read.tokens_read, self._rate_key(threads), self.model.parameters)

    @halaman_errors_only("reading the document")
    def read(self, opened: OpenDocument, *, progress: Callable[[Progress], None] | None = None,
             cancel: threading.Event | None = None, pause: threading.Event | None = None,
             on_read_plan: Callable[[ReadPlan], None] | None = None) -> bool:
        """Read `opened` whole (what `open(read_now=False)` left for later): prefill it into
        its snapshot, write its archive, and save both to the prefix cache, so the next question
        recalls from the archive instead of re-reading spans.

        Returns True when the document is read (at once if it already was), False when `pause` was
        set: the read stopped between two chunks and keeps what it read; call `read` again to go on
        (answering a question in between is fine). Raises Cancelled when `cancel` is set (what was
        read is dropped). `on_read_plan(plan)` is told the plan of what is left to read before it
        starts (as in `open`).
        """
        pending = opened.pending_read
        if pending is None:
            return True
        threads = None
        if on_read_plan is not None:  # the plan's threads are the read's: apply_threads samples the cores once
            threads = apply_threads(self.settings.threads) if self.model.device.type == "cpu" else 0
            done, n = opened.unread_progress()
            on_read_plan(read_time.plan_read(n - done, self._rate_key(threads), self.model.parameters))
        try:
            if not self._run_read(pending, progress or (lambda _p: None), cancel, pause, threads=threads):
                return False
        except BaseException:  # a cancelled chunk leaves the cache inconsistent: the next read starts over
            opened.pending_read = pending.restarted()
            raise
        opened.read_finished()
        report = opened.report
        report.unread = False
        report.prefill_seconds = pending.seconds
        report.prefill_tokens_per_s = (len(pending.ids) - pending.resumed_from) / pending.seconds if pending.seconds else 0.0
        report.kv, report.threads = pending.cache.memory(), pending.threads
        plan = self.plan_recall(len(pending.ids), spans=opened.spans is not None,
                                 archive_missing=pending.missing[0] if pending.missing else None)
        report.recall_plan, report.recall_notice = plan, RecallNotice.of(plan)
        if report.recall_notice is not None:
            report.warnings.append(str(report.recall_notice))
        report.warnings += self.notices
        self.notices = []  # said once
        return True

    def _unread_snapshot(self, policy: CachePolicy, n_tokens: int) -> CompressedCache:
        """The snapshot of a document not read yet: empty, its stream past the document's
        `n_tokens`, so a question's tokens come after the document as they would after a read.
        Span recall in focus hides the held document tokens anyway (`SpanRecaller`)."""
        cache = self.model.decoder.new_cache(policy, policy.position_mode)
        cache.seen_tokens = n_tokens
        return cache

    def _rate_key(self, threads: int = 0) -> RateKey:
        return RateKey(self.model.label, self.model.device.type, self.model.reading_label, threads)

    def _run_read(self, read: PendingRead, notify: Callable[[Progress], None], cancel: threading.Event | None,
                  pause: threading.Event | None, *, threads: int | None = None) -> bool:
        """Prefill `read`'s tokens from where it stopped (in memory, else its checkpoint on disk),
        writing its archive and keeping checkpoints (`engine.read_checkpoint`); when all are read,
        save the snapshot and keep the archive (`read.cache`, `read.archive`). False: `pause` stopped
        it between two chunks (a checkpoint is saved). `threads`: the count `apply_threads` just set
        (None: decided here). Raises Cancelled (a checkpoint of the chunks before is kept; without a
        prefix store the archive being written is deleted)."""
        governor = None
        if self.model.device.type == "cpu":  # the load may have changed since the model loaded (or the pause)
            read.threads = apply_threads(self.settings.threads) if threads is None else threads
            governor = ThreadGovernor(self.settings.threads)  # and it changes during a long read
        if read.cache is None:
            self._start_read(read)
        cache, n, checkpoints = read.cache, len(read.ids), read.checkpoints
        first = cache.seen_tokens
        clock = PrefillClock(read.policy.budget_tokens, first)

        def after_chunk(done: int, total: int, elapsed: float) -> None:
            if checkpoints is not None:
                checkpoints.after_chunk(cache, read.writer)
            notify(clock(first + done, n, elapsed))

        t0 = time.perf_counter()
        self.filling = cache  # memory() reports it from progress callbacks (the live gauge)
        try:
            self.model.decoder.prefill(torch.tensor(read.ids[first:]), cache, cancel=cancel, archive=read.writer,
                                       governor=governor, pause=pause, progress=after_chunk)
        except BaseException:
            if checkpoints is not None:
                checkpoints.stopped(read.writer)
            elif read.writer is not None:
                read.writer.abort()
            read.writer = None
            raise
        finally:
            self.filling = None
            read.seconds += time.perf_counter() - t0
        if cache.seen_tokens < n:
            if checkpoints is not None:
                checkpoints.save(cache, read.writer)
            return False
        read_time.record_rate(self._rate_key(read.threads), n - read.resumed_from, read.seconds)
        cache.shrink()
        finished = self._finish_archive(read)
        if checkpoints is not None:  # before the snapshot is saved: the budget would count the archive twice
            checkpoints.release(read.writer)
        saved = self._save(read.key, cache, n, read.label)
        if finished is not None:
            read.archive = self._keep_archive(read, finished, saved)
        if self.store is not None:  # the user should know which saved reading made room for this one
            self.notices += [evicted_notice(label) for label in self.store.take_evicted()]
        return True

    def _start_read(self, read: PendingRead) -> None:
        """Give `read` its cache and archive writer: as its checkpoint on disk left them, else new
        ones for a read from token 0 (with checkpoints when there is a prefix store)."""
        decoder = self.model.decoder
        resumed = read.checkpoints.load(decoder, read.policy, read.layout) if read.checkpoints is not None else None
        if resumed is not None:
            read.cache, read.writer = resumed
            read.resumed_from = read.cache.seen_tokens
            return
        read.cache = decoder.new_cache(read.policy, read.policy.position_mode)
        path = read.checkpoints.begin(read.layout) if read.checkpoints is not None else None
        read.writer = self._archive_writer(read.key, read.layout, read.missing, path)

    def encode(self, parts: tuple[str, str, str]) -> list[int]:
        """Token ids of (template, user text, template); special-token strings in the user text
        (the document or the question) are split into ordinary tokens, never obeyed."""
        tokenizer = self.model.tokenizer
        head, text, tail = parts
        ids = tokenizer(head, add_special_tokens=False)["input_ids"] if head else []
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return ids + tokenizer(tail, add_special_tokens=False)["input_ids"]

    def question_ids(self, question: str, *, follow_up: bool = False) -> list[int]:
        """Token ids of a first question after the prefix (`engine.prompt.question_suffix`), or of
        a follow-up after an answer (`follow_up_suffix`): the template, the question and the
        template that opens the answer."""
        return self.encode((follow_up_suffix if follow_up else question_suffix)(self.layout, question))

    def encode_document(self, document: Document) -> PrefixEncoding:
        """Token ids of the document prefix, with where each segment and the text start in them."""
        return encode_document(self.model.tokenizer, self.layout, document)

    def spans_of(self, document: Document) -> DocumentSpans:
        """`document`'s spans, full-text index (in memory) and structure, without reading it into a
        KV cache: selection needs only its text and the tokenizer (`halaman find` on a document not
        read yet). Raises HalamanError when the tokenizer gives no character offsets."""
        encoding = self.encode_document(document)
        if not encoding.token_chars:
            raise HalamanError(f"{self.model.name}'s tokenizer gives no character offsets: spans cannot be found")
        return DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                                   len(encoding.ids), None)

    def _document_spans(self, document: Document, encoding: PrefixEncoding, key: str,
                        warnings: list[str]) -> DocumentSpans | None:
        """The spans of the open document and their full-text index, kept in the prefix store
        beside the snapshot (rebuilt there when missing or damaged; in memory without a store).
        None when the tokenizer gives no character offsets (recall then selects blocks)."""
        if not encoding.token_chars:
            return None
        path = self.store.text_index_path(key) if self.store is not None else None
        try:
            return DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                                       len(encoding.ids), path)
        except (OSError, IndexDamaged, sqlite3.Error) as error:
            warnings.append(f"the full-text index could not be built ({error}); recall selects by attention only")
            return None

    def plan_recall(self, n_tokens: int, *, spans: bool, archive_missing: str | None = None) -> RecallPlan:
        """`engine.recall_plan.plan_recall` for a document of `n_tokens` opened now (this store's budget)."""
        budget = self.store.disk_budget_bytes if self.store is not None else None
        return plan_recall(self.settings, self.model.profile, n_tokens, disk_budget_bytes=budget, spans=spans,
                           archive_missing=archive_missing)

    def archive_damaged(self, opened: OpenDocument, error: ArchiveError) -> HalamanError:
        """Stop using `opened`'s archive after a read found a damaged block: it is deleted
        from the store and the document's plan becomes that of a document without one (re-read or
        off), so the next question works. Returns the error for this question."""
        if self.store is not None:
            try:
                self.store.drop_archive(opened.key)
            except CacheStoreError:
                pass  # still indexed: the next open checks it again and meets the same damage
        opened.drop_archive()
        plan = self.plan_recall(opened.report.document_tokens, spans=opened.spans is not None,
                                 archive_missing=f"{error}; it was deleted, clear its cache to read it again")
        opened.report.recall_plan, opened.report.recall_notice = plan, RecallNotice.of(plan)
        return HalamanError(f"the document's archive is damaged: {plan.reason}; ask the question again")

    def _resolve_policy(self, n_tokens: int) -> CachePolicy:
        policy = self.settings.cache
        fits = n_tokens + QUESTION_RESERVE_TOKENS + self.settings.max_new_tokens <= self.model.profile.max_positions
        if policy.position_mode == "auto":
            return policy.replace(position_mode="original" if fits else "compact")
        if policy.position_mode == "original" and not fits:
            raise SettingsError(
                f"the document has {n_tokens} tokens, more than the model's {self.model.profile.max_positions} positions "
                "allow in 'original' position mode; use 'compact' or 'auto'"
            )
        return policy

    def prefix_config(self, policy: CachePolicy) -> PrefixConfig:
        """What a prefix key made with `policy` (position mode resolved) hashes besides the token ids."""
        config = self.model.decoder.config
        return PrefixConfig(
            model_fingerprint=self.model.model_fingerprint,
            tokenizer_fingerprint=self.model.tokenizer_fingerprint,
            policy=asdict(policy),
            dtype=f"{self.model.decoder.compute_dtype}/{self.model.decoder.store_dtype}",
            extra={
                "format": SNAPSHOT_FORMAT,
                "transformers": transformers.__version__,
                "rope": json.dumps(getattr(config, "rope_parameters", None) or {}, sort_keys=True, default=str),
                "device_type": self.model.device.type,
            },
        )

    def prefix_signature(self, n_tokens: int) -> str | None:
        """`PrefixConfig.signature` of a document of `n_tokens` prefix tokens opened now, with this
        model and these settings; None when such a document cannot be opened ('original' positions
        that do not fit)."""
        try:
            return self.prefix_config(self._resolve_policy(n_tokens)).signature
        except SettingsError:
            return None

    def _restore(self, key: str, policy: CachePolicy, n_tokens: int, notify) -> tuple[CompressedCache | None, bool]:
        """The stored snapshot of `key` and True; (None, False) on a miss, or when the store failed
        (it is then off for this session: `_without_store`)."""
        if self.store is None:
            return None, False
        notify(Progress(Phase.LOADING_CACHE, 0, 1, "files"))
        try:
            found = self.store.get(key)
        except CacheStoreError as error:
            return None, self._without_store(error)
        if found is None:
            return None, False
        tensors, meta = found
        decoder = self.model.decoder
        try:
            cache = CompressedCache.restore(
                tensors, meta, shape=decoder.shape, policy=policy, device=decoder.device, store_dtype=decoder.store_dtype
            )
            if cache.seen_tokens != n_tokens:
                raise ValueError("token count differs")
        except (ValueError, KeyError):
            try:
                self.store.delete(key)  # made by a different build of the same key: recompute
            except CacheStoreError as error:
                self._without_store(error)
            return None, False
        notify(Progress(Phase.LOADING_CACHE, 1, 1, "files"))
        return cache, True

    def _save(self, key: str, cache: CompressedCache, n_tokens: int, label: str) -> bool:
        """Store the snapshot; False when there is no store or it could not be saved."""
        if self.store is None:
            return False
        tensors, meta = cache.export()
        try:
            self.store.put(key, tensors, meta, n_tokens=n_tokens, label=label)
        except PrefixTooLargeError:
            return False  # an entry over the disk budget costs the next open a prefill, nothing else
        except CacheStoreError as error:
            self._without_store(error)
            return False
        return True

    def _without_store(self, error: CacheStoreError) -> bool:
        """Go on without the prefix store after it failed (full disk, read-only or damaged folder);
        the next OpenReport says so once. Returns False (no cache hit), for `open`'s convenience."""
        self.store = None
        self.notices.append(f"the prefix cache stopped working and is off for this session: {error}")
        return False

    def _archive_layout(self, n_tokens: int, policy: CachePolicy) -> ArchiveLayout:
        recall = self.settings.recall
        shape = self.model.decoder.shape
        return ArchiveLayout(shape.num_layers, shape.kv_heads, shape.head_dim, n_tokens, recall.block_tokens,
                             recall.archive_bits, policy.group_size)

    def _archive_writer(self, key: str, layout: ArchiveLayout | None, missing: list[str],
                        path: Path | None = None) -> ArchiveWriter | None:
        """A writer for the archive at `path` (the read's checkpoint's), else in the prefix store (or
        a session file without one); None when the plan writes none or it cannot be created (then
        `missing` says why)."""
        if layout is None:
            return None
        try:
            if path is None and self.store is not None:
                path = self.store.archive_temp_path(key)
            elif path is None:
                folder = paths.cache_dir() / "archives"
                folder.mkdir(exist_ok=True)
                path = folder / f"session-{os.getpid()}-{secrets.token_hex(4)}.safetensors"
            return ArchiveWriter(path, layout, self.model.decoder.rope)
        except (OSError, HalamanError) as error:
            missing.append(f"its archive cannot be written ({error})")
            return None

    def _finish_archive(self, read: PendingRead) -> tuple[str, int] | None:
        """Finish `read`'s archive (`ArchiveWriter.finish`: digest tables written, file closed):
        (digest hex, size in bytes); None without one, or when it failed (deleted; `missing` says why)."""
        if read.writer is None:
            return None
        try:
            return read.writer.finish()
        except (OSError, ArchiveError) as error:
            read.writer.abort()
            read.missing.append(f"its archive was not kept ({error})")
            return None

    def _keep_archive(self, read: PendingRead, finished: tuple[str, int], saved: bool) -> Archive | None:
        """Move `read`'s finished archive (`finished`: its digest and size) into the prefix store
        beside the snapshot (`saved`), or keep it for this session only (`read.own_archive`), and
        open it. One that cannot be opened is not kept: not in the store either, where the next
        prefix-cache hit would find it."""
        key, writer, missing = read.key, read.writer, read.missing
        stored = False
        try:
            sha256, size = finished
            path = writer.path
            if saved:
                path = self.store.put_archive(key, writer.path, sha256=sha256, size_bytes=size)
                stored = True
            else:  # no store, or the snapshot was not stored: keep the archive for this session only
                read.own_archive = path
            return Archive.open(path, expect=writer.layout)
        except (OSError, ArchiveError, HalamanError) as error:
            writer.abort()
            if stored:
                try:
                    self.store.drop_archive(key)
                except CacheStoreError:
                    pass  # still indexed: the next hit checks its digest and drops it then
            missing.append(f"its archive was not kept ({error})")
            return None

    def _open_archive(self, key: str, layout: ArchiveLayout, missing: list[str]) -> Archive | None:
        """The stored archive of a prefix-cache hit, its digest checked; None (`missing` says why)
        when it is missing or damaged. The snapshot is used either way."""
        found = self.store.archive(key) if self.store is not None else None
        if found is None:
            missing.append("it has no archive (read before recall existed, or while recall or the archive was off); "
                           "clear its cache to read it again with one")
            return None
        path, digest = found
        try:
            return Archive.open(path, sha256=digest, expect=layout)
        except ArchiveError as error:
            self.store.drop_archive(key)
            missing.append(f"{error}; clear its cache to read it again")
            return None


def evicted_notice(label: str) -> str:
    """The line that says a saved reading was removed to make room (`PrefixStore.take_evicted`)."""
    return (f"the saved reading of “{label}” was removed to keep the saved readings within their disk space "
            "(the least recently used goes first): it will be read again when opened")
