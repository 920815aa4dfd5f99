"""DocumentSession: one model, one open document, and the conversation about it.

    session = DocumentSession(load_model("default"), settings, store)
    report = session.open("book.pdf", progress=print)      # engine.reading: PDF / folder / text → cache
    answer = session.ask("What is chapter 3 about?", on_text=print)

1. `open` reads the document into an `OpenDocument` (`engine.reading.Reader`: its snapshot, archive,
   spans and report), restored from the prefix cache when it was read before.
2. `ask` starts from a copy of the snapshot (never from what the previous answer left behind;
   transformers #34164) and answers in the one answer frame (`engine.generate.answer_frame`),
   recalling what the document's recall plan says (`engine.recall_source`): the question and the
   whole answer attend to the recalled tokens beside the snapshot, and the pages or files whose
   recalled tokens received the most attention become the answer's sources. A follow-up
   (`follow_up=True`) continues the previous answer's cache instead, recalling again with its own
   queries and keeping the spans the previous question read (`engine.evidence.select`'s turns).
Cancel: set the `cancel` event; prefill and decoding stop between two layers (well under a second).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from engine.answer import Answer, StopReason
from engine.documents import Document
from engine.errors import HalamanError
from engine.estimate import kv_peak_bytes
from engine.evidence.conversation import continues_why, conversation_turns, select_after
from engine.evidence.reading_budget import reading_budget
from engine.evidence.select import Selection, Turn, select
from engine.generate import Asked, Decoding, answer_frame, decoding_for, recall_budget, stop_token_ids
from engine.kvcache.archive import ArchiveError
from engine.kvcache.cache import CompressedCache
from engine.memory import MemoryReport, measure
from engine.models.loader import LoadedModel
from engine.open_document import OpenDocument, OpenReport
from engine.prefix_store import PrefixConfig, PrefixStore
from engine.progress import Progress
from engine.prompt import check_question
from engine.read_time import ReadPlan
from engine.reading import Reader
from engine.recall_plan import RecallPlan
from engine.recall_source import question_recall
from engine.settings import CachePolicy, EngineSettings
from engine.evidence.spans import DocumentSpans


class DocumentSession:
    """One model, at most one open document (an `OpenDocument`: its snapshot, archive, spans, report)
    and the conversation about it. Not thread-safe: one caller at a time."""

    def __init__(self, model: LoadedModel, settings: EngineSettings, store: PrefixStore | None = None) -> None:
        settings.validate()
        self.model = model
        self.reader = Reader(model, settings, store)  # opens and reads documents; holds the settings and the store
        self._open: OpenDocument | None = None  # the open document: its snapshot, archive, spans, report
        # The conversation about it: the cache the last answer left (a follow-up continues it) and
        # its questions with the spans they read.
        self._conversation: CompressedCache | None = None
        self._turns: list[Turn] = []
        self._stop_ids = stop_token_ids(model.tokenizer, getattr(model.decoder.model, "generation_config", None))

    @property
    def settings(self) -> EngineSettings:
        """The settings it reads and answers with; set new ones between questions (the answer's
        length, temperature, recall budget apply from the next question on)."""
        return self.reader.settings

    @settings.setter
    def settings(self, settings: EngineSettings) -> None:
        self.reader.settings = settings

    @property
    def store(self) -> PrefixStore | None:
        """The prefix store (None: off, or it failed and was turned off for this session)."""
        return self.reader.store

    @store.setter
    def store(self, store: PrefixStore | None) -> None:
        self.reader.store = store

    @property
    def notices(self) -> list[str]:
        """Lines for the next open's (or read's) warnings, said once."""
        return self.reader.notices

    @notices.setter
    def notices(self, notices: list[str]) -> None:
        self.reader.notices = notices

    @property
    def layout(self):
        """The model's chat layout (`engine.prompt.chat_layout`)."""
        return self.reader.layout

    # ------------------------------------------------------------------ open
    def open(self, path: str | Document, *, password: str | None = None,
             progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             before_prefill: Callable[[ReadPlan], bool] | None = None, read_now: bool = True,
             on_read_plan: Callable[[ReadPlan], None] | None = None) -> OpenReport:
        """Read, tokenize and prefill (or restore) a document (`engine.reading.Reader.open`, which
        says what `before_prefill`, `read_now` and `on_read_plan` do) and start a new conversation
        about it. Raises DocumentError, Cancelled, and any other failure as a one-line
        HalamanError. The new file is read and checked first (`Reader.load`): one that cannot be
        (corrupt, refused, a wrong password, cancelled while reading it) leaves the open document
        and its conversation as they were; a failure after that (tokenizing, the read) leaves the
        session with no document, so a later `ask` says so."""
        # The old document's caches are freed only once the new one is known to be readable.
        document = path if isinstance(path, Document) else self.reader.load(path, password=password, progress=progress,
                                                                            cancel=cancel)
        self.close()
        self._open = self.reader.open(document, progress=progress, cancel=cancel,
                                      before_prefill=before_prefill, read_now=read_now, on_read_plan=on_read_plan)
        return self._open.report

    def read(self, *, progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             pause: threading.Event | None = None, on_read_plan: Callable[[ReadPlan], None] | None = None) -> bool:
        """Read the open document whole (what `open(read_now=False)` left for later;
        `engine.reading.Reader.read`): True once read, False when `pause` stopped it between two
        chunks (call again to go on). Raises Cancelled, HalamanError when no document is open."""
        if self._open is None:
            raise HalamanError("no document is open: open a document first")
        return self.reader.read(self._open, progress=progress, cancel=cancel, pause=pause, on_read_plan=on_read_plan)

    @property
    def opened(self) -> OpenDocument | None:
        """The open document's handle (None: none is open)."""
        return self._open

    @property
    def conversation(self) -> CompressedCache | None:
        """The cache the last answer left, which a follow-up continues (None: none, or it was cancelled)."""
        return self._conversation

    def question_ids(self, question: str, *, follow_up: bool = False) -> list[int]:
        """Token ids of a first question after the prefix (`engine.prompt.question_suffix`), or of
        a follow-up after an answer (`follow_up_suffix`): the template, the question and the
        template that opens the answer."""
        return self.reader.question_ids(question, follow_up=follow_up)

    def decoding(self, max_new_tokens: int | None = None) -> Decoding:
        """How this session's answers are decoded (the settings' sampling and drafting, the model's
        stop tokens); `max_new_tokens` overrides the settings' length limit."""
        return decoding_for(self.model, self.settings, self._stop_ids, max_new_tokens)

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

    @property
    def recall_plan(self) -> RecallPlan | None:
        """Where the open document's questions get their recalled tokens, decided when it opened
        and changed only when a question finds its archive damaged (None: no document is open)."""
        return self._open.recall_plan if self._open is not None else None

    def prefix_config(self, policy: CachePolicy) -> PrefixConfig:
        """What a prefix key made with `policy` hashes besides the token ids (`Reader.prefix_config`)."""
        return self.reader.prefix_config(policy)

    def prefix_signature(self, n_tokens: int) -> str | None:
        """`PrefixConfig.signature` of a document of `n_tokens` opened now (`Reader.prefix_signature`)."""
        return self.reader.prefix_signature(n_tokens)

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
        follow_up: bool | None = False,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        max_new_tokens: int | None = None,
        progress: Callable[[Progress], None] | None = None,
    ) -> Answer:
        """Answer `question` about the open document, streaming text pieces to `on_text`
        (`engine.generate.answer_frame`, recalling by `engine.recall_source.question_recall`).

        Starts from a fork of the document snapshot (`CompressedCache.fork`: it stays as it is)
        unless `follow_up` continues the previous answer; `follow_up=None` lets the question's words
        decide (`engine.evidence.conversation.continuation`: it refers back, or names nothing new),
        and `Answer.continues` says why it went on. Cancelling keeps what was generated
        (stop_reason "cancelled"). `progress`: told how far the chosen pages are re-read before
        the first word, where the document has no archive yet (`Phase.REREADING`, tokens).
        Raises HalamanError when no document is open, the question is empty, or a block of its
        archive is damaged (the archive is dropped: ask again).
        """
        opened = self._open
        if opened is None:
            raise HalamanError("no document is open: open a document first (it may have failed to load)")
        check_question(question)
        began = time.perf_counter()
        continues = self._continues(question, follow_up)
        follow_up = bool(continues)
        goes_on = follow_up and self._conversation is not None
        cache = self._conversation if goes_on else opened.snapshot.fork()
        self._conversation = None
        suffix_ids = self.question_ids(question, follow_up=goes_on)
        history = self._turns if follow_up else []
        decoding = self.decoding(max_new_tokens)
        asked = Asked(question, suffix_ids, cache, opened.report.document_tokens + len(suffix_ids),
                      opened.take_prefix_hit(), began, opened.prompt_lookup(suffix_ids) if decoding.drafts else None)
        recall, turn = question_recall(opened, self.model, self.settings, question, history, progress)
        try:
            answer, passages = answer_frame(self.model.decoder, self.model.tokenizer, asked, recall, decoding,
                                            threads=self._threads(), on_text=on_text, cancel=cancel)
        except ArchiveError as error:  # a block read for this question differs from its digest
            raise self.reader.archive_damaged(opened, error) from None
        answer.passages = passages
        answer.continues = continues if goes_on or history else ""
        if answer.stop_reason is not StopReason.CANCELLED:
            self._conversation = cache  # a follow-up continues from here
        # A cancelled answer's question is still the last one asked: the user re-asks or refines it
        # ("and in 2018?"), so the next question is weighed against it and keeps its spans. Only its
        # cut answer's cache is not continued (the next starts from the snapshot).
        self._turns = [*history, turn]
        return answer

    def assume_asked(self, questions: Sequence[str]) -> None:
        """Take `questions` (oldest first) as the conversation so far without answering them (the
        command line's `ask --after`): the next `ask` decides whether it goes on from the last one
        and then keeps the spans they read (`engine.evidence.conversation.conversation_turns`, at
        the selection's archive budget). Without spans (no text index) there is nothing to keep."""
        self._conversation = None
        spans = self.spans
        if spans is None:
            self._turns = []
            return
        self._turns = conversation_turns(questions, lambda asked, history: self._select(asked, history, spans),
                                         spans.structure)

    def continues(self, question: str, follow_up: bool | None = None) -> str:
        """Why `question`, asked next with `follow_up`, would go on from the previous question ("" :
        it starts afresh), as `ask` decides it; for a caller that says so before the answer."""
        return self._continues(question, follow_up)

    def _continues(self, question: str, follow_up: bool | None) -> str:
        """Why `question` goes on from the previous one ("" when it starts afresh): asked as a
        follow-up, or, for `follow_up=None`, what its words show (`continuation`)."""
        spans = self._open.spans if self._open is not None else None
        previous = self._turns[-1].question if self._turns else None
        return continues_why(question, previous, spans.structure if spans is not None else None, follow_up)

    def _threads(self) -> int | None:
        """The settings' CPU threads for a `ThreadGovernor`; None on a GPU (no governor)."""
        return self.settings.threads if self.model.device.type == "cpu" else None

    def memory(self) -> MemoryReport:
        """Weights / KV / workspace / free now, on the model's device. During `open`, call it only
        from the progress callback (between chunks): it then reports the cache being prefilled."""
        cache = self._conversation or (self._open.snapshot if self._open is not None else None) or self.reader.filling
        policy = cache.policy if cache else self.settings.cache
        # The mark on the gauge: what the cache may hold at its peak (budget + one chunk), plus what
        # a question may recall beside it.
        peak = kv_peak_bytes(self.model.profile, policy, self.settings.recall)
        return measure(self.model.device, weights_bytes=self.model.weight_bytes, kv=cache.memory() if cache else None, budget_bytes=peak)

    # ------------------------------------------------------------ spans
    @property
    def spans(self) -> DocumentSpans | None:
        """The open document's spans, text index and structure (None: no document, or no index)."""
        return self._open.spans if self._open is not None else None

    def spans_of(self, document: Document) -> DocumentSpans:
        """`document`'s spans, full-text index (in memory) and structure, without reading it into a
        KV cache: selection needs only its text and the tokenizer (`halaman find` on a document not
        read yet). Raises HalamanError when the tokenizer gives no character offsets."""
        return self.reader.spans_of(document)

    def select(self, question: str, *, after: Sequence[str] = (), spans: DocumentSpans | None = None,
               follow_up: bool | None = True) -> Selection:
        """The spans `question` would read (`engine.evidence.select`), best first with what chose
        each, without answering it: about `spans` (from `spans_of`), else the open document.
        `after`: earlier questions of the conversation, oldest first, each going on from the one
        before as `ask(follow_up=None)` decides (`engine.evidence.conversation.select_after`);
        `follow_up` for `question` itself: True keeps the last one's spans, None decides from its
        words. Raises HalamanError when no document is open or its spans could not be built."""
        spans = spans if spans is not None else self.spans
        if spans is None:
            raise HalamanError("no document is open, or its text index could not be built: open a document first")
        selection, _ = select_after(question, after, lambda asked, history: self._select(asked, history, spans),
                                    spans.structure, follow_up=follow_up)
        return selection

    def _select(self, question: str, history: Sequence[Turn], spans: DocumentSpans) -> Selection:
        return select(spans, question, budget_tokens=recall_budget(self.settings, self.model.profile.max_positions, reread=False),
                      max_spans=self.settings.recall.max_spans, history=history, reading=reading_budget(self.model.profile))
