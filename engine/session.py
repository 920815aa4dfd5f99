"""DocumentSession: open a document → prefill it once (or load its prefix cache) → ask questions.

    session = DocumentSession(load_model("default"), settings, store)
    report = session.open("book.pdf", progress=print)      # PDF / folder / text → token ids → cache
    answer = session.ask("What is chapter 3 about?", on_text=print)

1. `open` renders the document (`engine.documents`) into the prompt prefix (`engine.prompt`) and
   tokenizes it. The prefix-cache key is the SHA-256 of model, tokenizer, the exact token ids and
   the cache policy (`engine.prefix_store.prefix_key`). On a hit the compressed cache is restored
   from disk; on a miss the prefix is prefilled chunk by chunk into a `CompressedCache` (sinks +
   window + heavy hitters, INT4 blocks) and saved. The result is the document *snapshot*.
   While prefilling, every token's K/V also goes to the document's *archive* on disk (INT4, with
   per-block key bounds; `engine.kvcache.archive`), saved beside the snapshot under the same key.
2. `ask` starts from a copy of the snapshot (never from what the previous answer left behind;
   transformers #34164) and feeds the question. While it does, in every layer the question's
   queries score the archive's blocks and the best ones are *recalled* (`engine.kvcache.recall`):
   the question and the whole answer attend to them beside the snapshot. Then it decodes token by
   token, streaming text; the pages or files whose recalled tokens received the most attention
   become the answer's sources. A follow-up (`follow_up=True`) continues the previous answer's
   cache instead, recalling again with its own queries.
Cancel: set the `cancel` event; prefill and decoding stop between two layers (well under a second).
"""

from __future__ import annotations

import enum
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers

from engine import paths, read_time
from engine.answer import Answer, StopReason
from engine.documents import Document, load_document
from engine.documents.names import check_unicode
from engine.errors import CacheStoreError, Cancelled, HalamanError, SettingsError, halaman_errors_only
from engine.estimate import QUESTION_RESERVE_TOKENS, full_cache_bytes, kv_peak_bytes
from engine.kvcache.archive import Archive, ArchiveError, ArchiveLayout, ArchiveWriter
from engine.kvcache.cache import CompressedCache, MemoryBreakdown
from engine.memory import MemoryReport, measure
from engine.models.loader import LoadedModel
from engine.prefix_store import PrefixConfig, PrefixStore, PrefixTooLargeError
from engine.prompt import PrefixEncoding, chat_layout, check_question, encode_document, follow_up_suffix, question_suffix
from engine.read_time import RateKey, ReadPlan
from engine.recall_plan import RecallPlan, RecallSource, plan_recall
from engine.settings import CachePolicy, EngineSettings
from engine.evidence.select import Selection, Turn, select
from engine.generate import Asked, Decoding, answer_frame, recall_budget, stop_token_ids
from engine.open_document import OpenDocument, PendingRead
from engine.recall_source import question_recall
from engine.read_checkpoint import ReadCheckpoints
from engine.spans import DocumentSpans
from engine.text_index import IndexDamaged
from engine.threads import ThreadGovernor, apply_threads

# Bumped whenever what a snapshot holds, or how it is computed, changes.
SNAPSHOT_FORMAT = "halaman-kv-1"
UNREAD_REASON = ("the document is not read whole yet: each question re-reads the parts it chooses from their "
                 "token ids")
"""The recall plan's reason while a document opened index first is not read (`DocumentSession.read`)."""


class Phase(enum.Enum):
    """What a `Progress` event reports: loading the model, reading the file(s), tokenizing,
    prefilling, or looking for / restoring a saved prefix cache. `value` is the name shown."""

    LOADING_MODEL = "loading model"
    READING = "reading"
    TOKENIZING = "tokenizing"
    PREFILL = "prefill"
    LOADING_CACHE = "loading cache"


@dataclass(frozen=True)
class Progress:
    """A progress event of opening a document (or loading the model): `done` of `total` `unit`s."""

    phase: Phase
    done: int
    total: int
    unit: str                  # "pages", "files", "tokens"; "model" or CONVERTING_MODEL_UNIT
    tokens_per_s: float = 0.0
    eta_s: float | None = None


CONVERTING_MODEL_UNIT = "model, converted first"
"""The unit of a LOADING_MODEL `Progress` when the model is converted before it loads (a GGUF file's
first load): the window says so only then."""


class RecallGap(enum.Enum):
    """What a document that needed an archive (one the cache does not keep whole) does without one,
    as the first words of its warning: its recall plan (`engine.recall_plan`) is OFF, or it REREADs
    the spans it chooses from their token ids for each question (slower answers)."""

    OFF = "recall is off for this document"
    REREAD = "recall re-reads the parts it chooses for each question (slower answers)"


@dataclass(frozen=True)
class RecallNotice:
    """A `RecallGap` and what caused it; `str()` is the warning's line."""

    gap: RecallGap
    why: str

    def __str__(self) -> str:
        return f"{self.gap.value}: {self.why}"

    @classmethod
    def of(cls, plan: RecallPlan) -> RecallNotice | None:
        """The warning of a plan whose document has no archive although it needs one, else None."""
        if plan.archive_missing is None:
            return None
        return cls(RecallGap.REREAD if plan.source is RecallSource.REREAD else RecallGap.OFF, plan.archive_missing)


@dataclass
class OpenReport:
    """What opening a document did and cost."""

    title: str
    kind: str
    document_tokens: int
    prefix_hit: bool
    position_mode: str
    seconds: float              # whole open, reading included
    prefill_seconds: float      # 0 on a prefix-cache hit
    prefill_tokens_per_s: float
    kv: MemoryBreakdown
    full_fp16_bytes: int        # what a full 16-bit cache of the document would take
    warnings: list[str] = field(default_factory=list)
    pages: int | None = None
    threads: int = 0            # CPU threads the prefill ran with (0: no prefill, or on a GPU)
    recall_notice: RecallNotice | None = None  # the document needed an archive and has none (also in `warnings`)
    recall_plan: RecallPlan | None = None      # where its questions' recalled tokens come from
    unread: bool = False        # opened index first and not read whole yet: questions re-read their spans
    read_plan: ReadPlan | None = None  # when unread: how long its whole read will take on this machine
    read_from: int = 0          # when unread: tokens an earlier read kept (`engine.read_checkpoint`), where its read goes on


class DocumentSession:
    """One model, at most one open document (an `OpenDocument`: its snapshot, archive, spans, report)
    and the conversation about it. Not thread-safe: one caller at a time."""

    def __init__(self, model: LoadedModel, settings: EngineSettings, store: PrefixStore | None = None) -> None:
        settings.validate()
        self.model = model
        self.settings = settings
        self.store = store if settings.prefix_cache else None
        self.notices: list[str] = []  # lines for the next OpenReport's warnings, e.g. "the prefix cache is off"
        self.layout = chat_layout(model.tokenizer)
        self._open: OpenDocument | None = None  # the open document: its snapshot, archive, spans, report
        # The conversation about it: the cache the last answer left (a follow-up continues it), its
        # questions and the spans they read, and the question being answered.
        self._conversation: CompressedCache | None = None
        self._turns: list[Turn] = []
        self._filling: CompressedCache | None = None  # the cache a running prefill is filling
        self._stop_ids = stop_token_ids(model.tokenizer, getattr(model.decoder.model, "generation_config", None))
        # On the CPU, dequantizing and rotating the whole cache dominated each decode step; a GPU
        # does it fast enough to keep its memory for the budget instead (LayerKV.attend).
        self._reuse_workspace = model.device.type == "cpu"

    # ------------------------------------------------------------------ open
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
    ) -> OpenReport:
        """Read, tokenize and prefill (or restore) a document. Raises DocumentError, Cancelled, and
        any other failure as a one-line HalamanError (nothing else leaves it).

        `path` may also be a `Document` already read with `load_document` (the CLI reads first, so
        a bad file is reported before the model is loaded). Any failure leaves the session with
        no document, so a later `ask` says so clearly.

        `before_prefill(plan)` is called when a prefill is about to run (a prefix-cache miss) and
        the `ReadPlan` says it takes at least `engine.read_time.LONG_READ_S`; when it returns False
        nothing is prefilled and Cancelled is raised. `on_read_plan(plan)` is told the plan of every
        prefill about to run, short or long (a command line says how long before it starts). A
        finished prefill records its rate for the next plans (`engine.read_time.record_rate`).

        `read_now=False` (index first): on a prefix-cache miss, a document that span recall can
        answer is not read: the open ends once its spans and full-text index exist (seconds for a
        book), questions re-read the spans they choose from their token ids, and `read` reads it
        whole later (the report's `unread` says so). A document the cache keeps whole, or with
        recall off, is read at once either way.
        """
        self.close()
        began = time.perf_counter()
        notify = progress or (lambda _p: None)
        document = path if isinstance(path, Document) else load_document(
            path, password=password, cancel=cancel, progress=reading_progress(notify, path),
            include_generated=self.settings.include_generated_files)
        notify(Progress(Phase.TOKENIZING, 0, 1, "documents"))
        check_unicode(document.render() + document.title, document.title)  # before any model work
        encoding = self._encode_document(document)
        prefix_ids = encoding.ids
        policy = self._resolve_policy(len(prefix_ids))
        key = self.prefix_config(policy).key(prefix_ids)
        # Before the read the plan says whether an archive is written; after it, what questions do.
        planned = self._plan_recall(len(prefix_ids), spans=bool(encoding.token_chars))
        layout = self._archive_layout(len(prefix_ids), policy) if planned.uses_archive else None
        recall_warnings: list[str] = []
        archive_missing: list[str] = []  # why the archive the plan needs is not there
        try:
            cache, hit = self._restore(key, policy, len(prefix_ids), notify)
        except CacheStoreError as error:
            cache, hit = None, self._without_store(error)
        # Index first: the spans and their full-text index need the text, not the model, so they
        # exist before the read, and a document not read yet is answered from re-read spans.
        spans = self._document_spans(document, encoding, key, recall_warnings)
        archive, own_archive, unread, read_plan = None, None, None, None
        try:
            if cache is None:
                label = f"{document.title} · {self.model.label}"
                checkpoints = ReadCheckpoints(self.store, key, len(prefix_ids), label) if self.store is not None else None
                read = PendingRead(prefix_ids, policy, key, layout, label, checkpoints=checkpoints)
                to_read = len(prefix_ids) - read.tokens_read  # what a checkpoint of an earlier read leaves
                if read_now or not (planned.by_spans and spans is not None):
                    threads = apply_threads(self.settings.threads) if self.model.device.type == "cpu" else 0
                    if before_prefill is not None or on_read_plan is not None:
                        plan = read_time.plan_read(to_read, self._rate_key(threads), self.model.parameters)
                        if on_read_plan is not None:
                            on_read_plan(plan)
                        if before_prefill is not None and plan.is_long and not before_prefill(plan):
                            raise Cancelled(f"Reading {document.title} was not started: {plan.describe()}")
                    self._run_read(read, notify, cancel, None, threads=threads)
                    cache, archive, own_archive = read.cache, read.archive, read.own_archive
                    archive_missing += read.missing
                else:
                    cache, unread = self._unread_snapshot(policy, len(prefix_ids)), read
                    # The thread count the model runs with now: the read decides its own only when it
                    # starts (sampling the cores takes a moment the open should not spend).
                    threads = torch.get_num_threads() if self.model.device.type == "cpu" else 0
                    read_plan = read_time.plan_read(to_read, self._rate_key(threads), self.model.parameters)
            elif layout is not None:
                archive = self._open_archive(key, layout, archive_missing)
        except BaseException:
            if spans is not None:
                spans.close()
            raise
        if unread is not None:
            plan = RecallPlan(RecallSource.REREAD, UNREAD_REASON)
        else:  # the budget's verdict stands even if the store turned itself off during the read
            plan = self._plan_recall(len(prefix_ids), spans=spans is not None,
                                     archive_missing=archive_missing[0] if archive_missing else planned.archive_missing)
        notice = RecallNotice.of(plan)
        read_s = 0.0 if hit or unread is not None else read.seconds
        report = OpenReport(
            title=document.title, kind=document.kind, document_tokens=len(prefix_ids), prefix_hit=hit,
            position_mode=policy.position_mode, seconds=time.perf_counter() - began,
            prefill_seconds=read_s, prefill_tokens_per_s=(len(prefix_ids) - read.resumed_from) / read_s if read_s else 0.0,
            kv=cache.memory(), full_fp16_bytes=full_cache_bytes(self.model.profile, len(prefix_ids)),
            warnings=[*self.notices, *document.warnings, *([str(notice)] if notice else []), *recall_warnings],
            pages=document.pages, threads=0 if hit or unread is not None else read.threads,
            recall_notice=notice, recall_plan=plan, unread=unread is not None, read_plan=read_plan,
            read_from=unread.tokens_read if unread is not None else 0,
        )
        self._open = OpenDocument(document, encoding, key, cache, report, spans=spans, archive=archive,
                                  own_archive=own_archive, pending_read=unread, prefilled=not hit)
        self._turns = []
        self.notices = []  # said once
        return report

    @property
    def opened(self) -> OpenDocument | None:
        """The open document's handle (None: none is open)."""
        return self._open

    def question_ids(self, question: str, *, follow_up: bool = False) -> list[int]:
        """Token ids of a first question after the prefix (`engine.prompt.question_suffix`), or of
        a follow-up after an answer (`follow_up_suffix`): the template, the question and the
        template that opens the answer."""
        return self._encode((follow_up_suffix if follow_up else question_suffix)(self.layout, question))

    def decoding(self, max_new_tokens: int | None = None) -> Decoding:
        """How this session's answers are decoded (the settings' sampling and drafting, the model's
        stop tokens); `max_new_tokens` overrides the settings' length limit."""
        return Decoding.of(self.settings, self._stop_ids, reuse_workspace=self._reuse_workspace,
                           max_new_tokens=max_new_tokens)

    @property
    def document(self) -> Document | None:
        """The open document (None: none is open)."""
        return self._open.document if self._open is not None else None

    @property
    def report(self) -> OpenReport | None:
        """What opening the open document did and cost (None: none is open)."""
        return self._open.report if self._open is not None else None

    @property
    def prefix_key(self) -> str | None:
        """The open document's prefix-cache key, whether or not it is stored (None: none is open)."""
        return self._open.key if self._open is not None else None

    @property
    def unread(self) -> bool:
        """The open document has not been read whole yet (`open(read_now=False)`): questions re-read
        the spans they choose; `read` reads it."""
        return self._open is not None and self._open.unread

    def unread_progress(self) -> tuple[int, int]:
        """(tokens read, tokens) of the open document's whole read; (n, n) once it is read."""
        return self._open.unread_progress() if self._open is not None else (0, 0)

    @halaman_errors_only("reading the document")
    def read(self, *, progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             pause: threading.Event | None = None, on_read_plan: Callable[[ReadPlan], None] | None = None) -> bool:
        """Read the open document whole (what `open(read_now=False)` left for later): prefill it into
        its snapshot, write its archive, and save both to the prefix cache, so the next question
        recalls from the archive instead of re-reading spans.

        Returns True when the document is read (at once if it already was), False when `pause` was
        set: the read stopped between two chunks and keeps what it read; call `read` again to go on
        (answering a question in between is fine). Raises Cancelled when `cancel` is set (what was
        read is dropped), HalamanError when no document is open. `on_read_plan(plan)` is told the
        plan of what is left to read before it starts (as in `open`).
        """
        opened = self._open
        if opened is None:
            raise HalamanError("no document is open: open a document first")
        pending = opened.pending_read
        if pending is None:
            return True
        threads = None
        if on_read_plan is not None:  # the plan's threads are the read's: apply_threads samples the cores once
            threads = apply_threads(self.settings.threads) if self.model.device.type == "cpu" else 0
            done, n = self.unread_progress()
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
        plan = self._plan_recall(len(pending.ids), spans=opened.spans is not None,
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
        return RateKey(self.model.label, self.model.device.type, self.model.weights_label, threads)

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
        self._filling = cache  # memory() reports it from progress callbacks (the live gauge)
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
            self._filling = None
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

    def close(self) -> None:
        """Forget the open document and its caches (an archive kept only for this session is deleted)."""
        opened, self._open = self._open, None
        self._conversation, self._turns = None, []
        if opened is not None:
            opened.close()

    # ------------------------------------------------------------------- ask
    def ask(
        self,
        question: str,
        *,
        follow_up: bool = False,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        max_new_tokens: int | None = None,
    ) -> Answer:
        """Answer `question` about the open document, streaming text pieces to `on_text`
        (`engine.generate.answer_frame`, recalling by `engine.recall_source.question_recall`).

        Starts from a fork of the document snapshot (`CompressedCache.fork`: it stays as it is)
        unless `follow_up` continues the previous answer. Cancelling keeps what was generated
        (stop_reason "cancelled"). Raises HalamanError when no document is open, the question is
        empty, or a block of its archive is damaged (the archive is dropped: ask again).
        """
        opened = self._open
        if opened is None:
            raise HalamanError("no document is open: open a document first (it may have failed to load)")
        check_question(question)
        began = time.perf_counter()
        if follow_up and self._conversation is not None:
            cache, suffix = self._conversation, follow_up_suffix(self.layout, question)
        else:
            cache, suffix = opened.snapshot.fork(), question_suffix(self.layout, question)
        self._conversation = None
        suffix_ids = self._encode(suffix)
        history = self._turns if follow_up else []
        decoding = self.decoding(max_new_tokens)
        asked = Asked(question, suffix_ids, cache, opened.report.document_tokens + len(suffix_ids),
                      opened.take_prefix_hit(), began, opened.prompt_lookup(suffix_ids) if decoding.drafts else None)
        recall, turn = question_recall(opened, self.model, self.settings, question, history)
        try:
            answer, passages = answer_frame(self.model.decoder, self.model.tokenizer, asked, recall, decoding,
                                            threads=self._threads(), on_text=on_text, cancel=cancel)
        except ArchiveError as error:  # a block read for this question differs from its digest
            raise self._archive_damaged(error) from None
        answer.passages = passages
        if answer.stop_reason is not StopReason.CANCELLED:
            self._conversation = cache  # a follow-up continues from here
            self._turns = [*history, turn]
        return answer

    def _threads(self) -> int | None:
        """The settings' CPU threads for a `ThreadGovernor`; None on a GPU (no governor)."""
        return self.settings.threads if self.model.device.type == "cpu" else None

    def memory(self) -> MemoryReport:
        """Weights / KV / workspace / free now, on the model's device. During `open`, call it only
        from the progress callback (between chunks): it then reports the cache being prefilled."""
        cache = self._conversation or (self._open.snapshot if self._open is not None else None) or self._filling
        policy = cache.policy if cache else self.settings.cache
        # The mark on the gauge: what the cache may hold at its peak (budget + one chunk), plus what
        # a question may recall beside it.
        peak = kv_peak_bytes(self.model.profile, policy, self.settings.recall)
        return measure(self.model.device, weights_bytes=self.model.weight_bytes, kv=cache.memory() if cache else None, budget_bytes=peak)

    # -------------------------------------------------------------- helpers
    def _encode(self, parts: tuple[str, str, str]) -> list[int]:
        """Token ids of (template, user text, template); special-token strings in the user text
        (the document or the question) are split into ordinary tokens, never obeyed."""
        tokenizer = self.model.tokenizer
        head, text, tail = parts
        ids = tokenizer(head, add_special_tokens=False)["input_ids"] if head else []
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return ids + tokenizer(tail, add_special_tokens=False)["input_ids"]

    def _encode_document(self, document: Document) -> PrefixEncoding:
        """Token ids of the document prefix, with where each segment and the text start in them."""
        return encode_document(self.model.tokenizer, self.layout, document)

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

    # ------------------------------------------------------------- recall plan
    def _plan_recall(self, n_tokens: int, *, spans: bool, archive_missing: str | None = None) -> RecallPlan:
        """`engine.recall_plan.plan_recall` for a document of `n_tokens` opened now (this store's budget)."""
        budget = self.store.disk_budget_bytes if self.store is not None else None
        return plan_recall(self.settings, self.model.profile, n_tokens, disk_budget_bytes=budget, spans=spans,
                           archive_missing=archive_missing)

    @property
    def recall_plan(self) -> RecallPlan | None:
        """Where the open document's questions get their recalled tokens, decided when it opened
        and changed only when a question finds its archive damaged (None: no document is open)."""
        return self._open.recall_plan if self._open is not None else None

    def _archive_damaged(self, error: ArchiveError) -> HalamanError:
        """Stop using the open document's archive after a read found a damaged block: it is deleted
        from the store and the document's plan becomes that of a document without one (re-read or
        off), so the next question works. Returns the error for this question."""
        opened = self._open
        if self.store is not None:
            try:
                self.store.drop_archive(opened.key)
            except CacheStoreError:
                pass  # still indexed: the next open checks it again and meets the same damage
        opened.drop_archive()
        plan = self._plan_recall(opened.report.document_tokens, spans=opened.spans is not None,
                                 archive_missing=f"{error}; it was deleted, clear its cache to read it again")
        opened.report.recall_plan, opened.report.recall_notice = plan, RecallNotice.of(plan)
        return HalamanError(f"the document's archive is damaged: {plan.reason}; ask the question again")

    # ------------------------------------------------------------- archive
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

    @property
    def spans(self) -> DocumentSpans | None:
        """The open document's spans, text index and structure (None: no document, or no index)."""
        return self._open.spans if self._open is not None else None

    def spans_of(self, document: Document) -> DocumentSpans:
        """`document`'s spans, full-text index (in memory) and structure, without reading it into a
        KV cache: selection needs only its text and the tokenizer (`halaman find` on a document not
        read yet). Raises HalamanError when the tokenizer gives no character offsets."""
        encoding = self._encode_document(document)
        if not encoding.token_chars:
            raise HalamanError(f"{self.model.name}'s tokenizer gives no character offsets: spans cannot be found")
        return DocumentSpans.build(document, encoding.token_chars, encoding.head_tokens, encoding.text_tokens,
                                   len(encoding.ids), None)

    def select(self, question: str, *, after: Sequence[str] = (), spans: DocumentSpans | None = None) -> Selection:
        """The spans `question` would read (`engine.evidence.select`), best first with what chose
        each, without answering it: about `spans` (from `spans_of`), else the open document.
        `after`: earlier questions of the conversation, oldest first (the last one's spans are kept
        for a follow-up). Raises HalamanError when no document is open or its spans could not be built."""
        spans = spans if spans is not None else self.spans
        if spans is None:
            raise HalamanError("no document is open, or its text index could not be built: open a document first")
        history: list[Turn] = []
        for earlier in after:
            chosen = self._select(earlier, history, spans)
            history.append(Turn(earlier, chosen.chosen_index))
        return self._select(question, history, spans)

    def _select(self, question: str, history: Sequence[Turn], spans: DocumentSpans) -> Selection:
        return select(spans, question, budget_tokens=recall_budget(self.settings, self.model.profile.max_positions, reread=False),
                      max_spans=self.settings.recall.max_spans, history=history)

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
        if self.store is None:
            return None, False
        notify(Progress(Phase.LOADING_CACHE, 0, 1, "files"))
        found = self.store.get(key)
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
            self.store.delete(key)  # made by a different build of the same key: recompute
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


def evicted_notice(label: str) -> str:
    """The line that says a saved reading was removed to make room (`PrefixStore.take_evicted`)."""
    return (f"the saved reading of “{label}” was removed to keep the saved readings within their disk space "
            "(the least recently used goes first): it will be read again when opened")


def reading_progress(notify: Callable[[Progress], None], path: str | os.PathLike[str]) -> Callable[[int, int], None]:
    """`load_document`'s progress(done, total) for `path` as "reading" `Progress` events for
    `notify`: a folder counts files, a PDF pages."""
    unit = "files" if Path(path).is_dir() else "pages"
    return lambda done, total: notify(Progress(Phase.READING, done, total, unit))


class PrefillClock:
    """Turns the decoder's (done, total, elapsed seconds) into a prefill `Progress`.

    tokens_per_s is the average so far (what the report prints). The ETA follows the cost of chunked
    prefill instead of the average rate: a chunk attends to the kept cache plus itself, and the kept
    cache grows until it reaches the budget, so the time per token is about a + b·kept with
    kept = min(tokens before the chunk, budget). a and b are fitted (least squares) to the chunks
    seen so far and summed over the chunks to come. The average rate overestimated the rate to come
    (a fresh user saw "7 min left" stay put for minutes on a 9.7k-token PDF).

    The ETA shown is steadied (`steady_eta`): a chunk or two slowed by another program's load tilts
    the fit, and the time left used to leap (14 s, then 39 s, then 22 s) though the read went on
    at its rate.
    """

    def __init__(self, budget_tokens: int, start_tokens: int = 0) -> None:
        self.budget_tokens = budget_tokens
        self._start = start_tokens  # a read going on from there (paused, then resumed): `elapsed` counts from it
        self._last = (start_tokens, 0.0)
        self._chunks: list[tuple[int, float, float]] = []  # (tokens, seconds per token, kept before it)
        self._shown: float | None = None  # the ETA last shown, seconds
        self._rises = 0                   # updates in a row whose fitted ETA was above what `steady_eta` let show

    def __call__(self, done: int, total: int, elapsed: float) -> Progress:
        last_done, last_elapsed = self._last
        if done > last_done and elapsed > last_elapsed:
            self._chunks.append((done - last_done, (elapsed - last_elapsed) / (done - last_done),
                                 min(last_done, self.budget_tokens)))
            self._last = (done, elapsed)
        rate = (done - self._start) / elapsed if elapsed > 0 else 0.0
        fitted = self._eta(done, total)
        if fitted is not None:
            self._shown, self._rises = steady_eta(self._shown, fitted, self._rises)
        return Progress(Phase.PREFILL, done, total, "tokens", tokens_per_s=rate, eta_s=self._shown)

    def _eta(self, done: int, total: int) -> float | None:
        if not self._chunks:
            return None
        weights = [n for n, _, _ in self._chunks]
        mean_kept = sum(n * kept for n, _, kept in self._chunks) / sum(weights)
        mean_cost = sum(n * cost for n, cost, _ in self._chunks) / sum(weights)
        spread = sum(n * (kept - mean_kept) ** 2 for n, _, kept in self._chunks)
        slope = sum(n * (kept - mean_kept) * (cost - mean_cost) for n, cost, kept in self._chunks) / spread if spread else 0.0
        slope = max(slope, 0.0)  # a noisy fit must not predict that a fuller cache is cheaper
        intercept = mean_cost - slope * mean_kept
        if slope == 0.0 or intercept <= 0:  # one point or noise: the whole read's per-token cost, not a few chunks' under load
            slope, intercept = 0.0, mean_cost
        chunk = self._chunks[-1][0]
        seconds, position = 0.0, done
        while position < total:
            step = min(chunk, total - position)
            seconds += step * (intercept + slope * min(position, self.budget_tokens))
            position += step
        return seconds


ETA_RISE_MAX = 1.25
"""The shown time left may rise at most by this factor from one progress update to the next..."""
ETA_RISE_AFTER = 4
"""...unless the fitted time left was above that for this many updates in a row: the rate changed."""


def steady_eta(shown_s: float | None, fitted_s: float, rises: int) -> tuple[float, int]:
    """The time left to show, in seconds, and the new count of capped rises, from the time left
    shown last (`shown_s`, None at the first update), the one fitted now (`fitted_s`) and how many
    updates in a row were capped before (`rises`). A fall is shown as fitted; a rise is capped at
    `ETA_RISE_MAX` × the last shown until it has lasted `ETA_RISE_AFTER` updates. Raises nothing."""
    if shown_s is None or fitted_s <= shown_s * ETA_RISE_MAX:
        return fitted_s, 0
    rises += 1
    if rises >= ETA_RISE_AFTER:
        return fitted_s, 0
    return shown_s * ETA_RISE_MAX, rises

