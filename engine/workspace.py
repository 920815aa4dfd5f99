"""Workspace: the loaded model, the open document's session and the prefix store, behind the calls
the command line (`engine.cli`) and the window's worker (`app.worker`) make.

    workspace = Workspace(load_settings())
    info = workspace.ensure_model()                                  # ModelInfo (loads once)
    opened = workspace.open("book.pdf", progress=print)              # OpenResult
    answer = workspace.ask("What is chapter 3 about?", on_text=print)
    if reason := workspace.escalation_reason(answer):
        answer = workspace.ask_cloud("What is chapter 3 about?", reason=reason, confirm=ask_user)
    outcome = workspace.outcome(answer)                               # + its library record and escalation
    change = workspace.apply_settings(new_settings)                  # SettingsChange: what to redo

Everything that decides something about the engine lives here, once: where the prefix store is
(`prefix_store_dir`), what a settings change implies (`SettingsChange.between`), how far the budget
drops after an out-of-memory (`lowered_budget`; whether an exception is one: `engine.errors.out_of_memory`),
how an answer is stored in the library (`answer_record`), what kind of failure an exception is
(`error_kind`). Callers act on the results.

Not thread-safe: one caller at a time (the window runs it on its worker thread only). The pure
functions (`SettingsChange.between`, `lowered_budget`, `answer_record`, `error_kind`) read only
their arguments and may be called from any thread.
"""

from __future__ import annotations

import enum
import gc
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from engine import paths
from engine.answer import Answer, Source, StopReason
from engine.attended import AttendedSpan
from engine.cloud import ask_cloud, escalation_reason
from engine.cloud.plan import CloudPlan
from engine.cloud import policy as cloud_policy
from engine.documents import Document, PasswordRequiredError, WrongPasswordError
from engine.documents import parsed_cache
from engine.documents.parsed_cache import load_reusing
from engine.errors import (CacheStoreError, Cancelled, DocumentError, ErrorKind, HalamanError, ModelError, SettingsError,
                           out_of_memory)
from engine.evidence import kept_spans
from engine.kvcache.recall import RecallStats
from engine.open_library import LibraryAnswer, OpenLibrary, unmatched_note
from engine.memory import MemoryReport
from engine.models import int4_unpack
from engine.models.loader import LoadedModel, conversion_pending, load_model
from engine.models.profile import ModelProfile
from engine.prompt import check_question
from engine.prefix_store import PrefixEntry, PrefixStore, checkpoint_key, clear_files, open_store
from engine.read_time import ReadPlan
from engine.recall_plan import RecallPlan, RecallSource
from engine.open_document import OpenReport
from engine.progress import CONVERTING_MODEL_UNIT, Phase, Progress, reading_progress
from engine.session import DocumentSession
from engine.settings import CachePolicy, EngineSettings
from engine.tokenizer_cache import keep_loaded

# The smallest budget `lowered_budget` goes down to (tokens per layer and KV head).
MIN_BUDGET_TOKENS = 64


def prefix_store_dir() -> Path:
    """The folder of the prefix store: `<cache dir>/prefix` (`engine.paths.cache_dir`)."""
    return paths.cache_dir() / "prefix"


def load_for(settings: EngineSettings) -> LoadedModel:
    """The model `settings` name, on the device, with the weights and CPU threads they name.
    Raises ModelError with what to do. Its tokenizer is kept for `halaman find` (`keep_loaded`)."""
    model = load_model(settings.model, device=settings.device, weights=settings.weights, threads=settings.threads)
    keep_loaded(settings.model, model.tokenizer, model.profile)
    return model


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class ModelInfo:
    """The loaded model, in plain values (safe to hand to another thread).

    device: "cpu", "cuda" or "cuda:0". weight_bytes: what the weights really hold.
    load_seconds: the load (and first-time conversion) took this long. weights_label: how the
    weights are held ("4-bit NF4", "float32"). threads: CPU threads torch got (0 on a GPU).
    """

    label: str
    device: str
    profile: ModelProfile
    weight_bytes: int
    load_seconds: float
    weights_label: str = "4-bit NF4"
    threads: int = 0


@dataclass(frozen=True)
class OpenResult:
    """An opened document. `document` is for reading (citations), never to be changed;
    `prefix_key` is None without a prefix store; `prefix_signature` is its key's
    `PrefixConfig.signature` (what the library compares to tell a stale cache); `memory` is
    measured right after the open."""

    report: OpenReport
    document: Document
    path: str
    prefix_key: str | None
    memory: MemoryReport
    prefix_signature: str | None = None


@dataclass(frozen=True)
class CacheStatus:
    """What the library needs to call a document's prefix cache cached, stale or not cached, by
    the prefix cache's own rule: the keys in the store, and the `PrefixConfig.signature` a document
    of each prefix-token count would be keyed with now (`signatures`; None before a model is loaded,
    when it cannot be known). A stored key is stale when the document's file or its signature changed."""

    keys: frozenset[str]
    signatures: dict[int, str | None] | None = None
    entry_tokens: Mapping[str, int] = field(default_factory=dict)
    """Prefix tokens of each stored entry, by key: a read stopped half-way keeps its checkpoint under
    `checkpoint_key(document's key)` (`read_tokens`)."""

    def adding(self, key: str | None, n_tokens: int, signature: str | None) -> CacheStatus:
        """This status with a document just opened (its key stored, its signature known)."""
        keys = self.keys | {key} if key else self.keys
        signatures = {**self.signatures, n_tokens: signature} if self.signatures is not None else None
        return CacheStatus(keys, signatures, self.entry_tokens)

    def cleared(self) -> CacheStatus:
        """This status after the store was cleared."""
        return CacheStatus(frozenset(), self.signatures)

    def read_tokens(self, key: str | None) -> int:
        """Tokens a read of the document keyed `key` stopped half-way has kept (0: none)."""
        return self.entry_tokens.get(checkpoint_key(key), 0) if key else 0


class SettingsChange(enum.Enum):
    """What a settings change implies, from most to least work.

    RELOAD_MODEL: the model, its device or its weights (4-bit / full) changed; the model is unloaded, the next call loads the
    new one, and an open document must be opened again. REOPEN_DOCUMENT: what a document's prefix
    holds changed (cache policy, prefix cache on / off, the archive, which files of a folder are
    read) or its recall plan did (recall turned on or off); an open document must be opened again.
    NOTHING: the rest (answer length, temperature, a recall budget above 0, drafts, cloud, disk
    budget) applies from the next question on, CPU threads from the next document read.
    """

    NOTHING = "nothing"
    REOPEN_DOCUMENT = "reopen document"
    RELOAD_MODEL = "reload model"

    @property
    def reopens_document(self) -> bool:
        """An open document must be opened again (its prefix key or content changed)."""
        return self is not SettingsChange.NOTHING

    @classmethod
    def between(cls, old: EngineSettings, new: EngineSettings) -> SettingsChange:
        """What going from `old` to `new` implies (pure: reads only its arguments)."""
        if (old.model, old.device, old.weights) != (new.model, new.device, new.weights):
            return cls.RELOAD_MODEL
        # The recall budget is read at each question; the rest of the recall settings shape the
        # archive, which is written while the document is read, and turning recall on or off changes
        # the document's recall plan, decided when it opens (`engine.recall_plan`).
        archive_changed = (old.recall.replace(recall_tokens=0) != new.recall.replace(recall_tokens=0)
                           or (old.recall.recall_tokens > 0) != (new.recall.recall_tokens > 0))
        if (old.cache != new.cache or old.prefix_cache != new.prefix_cache or archive_changed
                or old.include_generated_files != new.include_generated_files):
            return cls.REOPEN_DOCUMENT
        return cls.NOTHING


@dataclass(frozen=True)
class AnswerRecord:
    """An answer as the library stores it: the columns of `messages` (see `engine.library`).

    state: "done" or "cancelled". source: "local" or "cloud". model: the local model's label or
    the cloud model's name. reason: why it went to the cloud (None for local answers). tokens:
    answer tokens (the endpoint's count for a cloud answer, None when not reported). prefix_hit:
    1 / 0, None for cloud answers. sources_json / recall_json / passages_json: `sources_json`,
    `recall_record` and `passages_json`, None for cloud answers. mean_logprob: how sure the local
    model was of its words (`Answer.mean_logprob`); low_confidence: 1 when that is below the
    escalation threshold (`engine.cloud.policy.low_confidence`), else 0; both None for cloud answers.
    unsupported_json: `Answer.unsupported` as a JSON list of strings, None when empty or a cloud answer.
    """

    text: str
    state: str
    source: str
    endpoint: str | None
    model: str | None
    reason: str | None
    ttft_s: float
    tokens_per_s: float | None
    tokens: int | None
    prefix_hit: int | None
    stop_reason: StopReason
    sources_json: str | None = None
    recall_json: str | None = None
    passages_json: str | None = None
    mean_logprob: float | None = None
    low_confidence: int | None = None
    unsupported_json: str | None = None
    instructions_json: str | None = None  # `Answer.instructions` as JSON, None when empty

    def fields(self) -> dict:
        """Column name -> value, for `Library.update_message(message_id, **record.fields())`."""
        return asdict(self)


@dataclass(frozen=True)
class AnswerOutcome:
    """An answer with what the workspace decided about it, on the thread that answered: how the
    library stores it (`record`) and why it should also go to the cloud by itself (`escalation`,
    `engine.cloud.escalation_reason`; None: it should not)."""

    answer: Answer
    record: AnswerRecord
    escalation: str | None
    documents: tuple[str, ...] = ()   # a library answer's documents read (`Document.source`), the best first


def sources_json(sources: list[Source]) -> str | None:
    """`Answer.sources` as the JSON text stored in `messages.sources_json` (None when empty)."""
    return json.dumps([asdict(s) for s in sources]) if sources else None


def passages_json(passages: list[AttendedSpan]) -> str | None:
    """`Answer.passages` as the JSON text stored in `messages.passages_json` (None when empty): the
    source pane shows an older answer's highlights from it."""
    return json.dumps([asdict(p) for p in passages]) if passages else None


class RecallOff(enum.StrEnum):
    """Why an answer had no recall, as `recall_record` stores it (text in `messages.recall_json`,
    read back as a plain str, hence a str enum), from the document's `RecallPlan`: OFF by the
    settings; WHOLE: the cache keeps the whole document; NO_ARCHIVE for this document (its archive
    could not be written or read: the open report's `recall_notice` says why); NOT_CHOSEN: the plan
    recalls, but not for this question (no page chosen without an archive, or a budget of 0)."""

    OFF = "off"
    WHOLE = "the cache keeps the whole document"
    NO_ARCHIVE = "no archive for this document"
    NOT_CHOSEN = "nothing recalled for this question"


def recall_off(plan: RecallPlan | None) -> RecallOff:
    """Why an answer of a document with `plan` (None: unknown) recalled nothing."""
    if plan is None or (plan.source is RecallSource.OFF and plan.archive_missing is None):
        return RecallOff.OFF
    if plan.source is RecallSource.WHOLE:
        return RecallOff.WHOLE
    return RecallOff.NO_ARCHIVE if plan.archive_missing is not None else RecallOff.NOT_CHOSEN


def recall_record(stats: RecallStats | None, plan: RecallPlan | None, *, heads: int | None = None) -> str:
    """JSON text for `messages.recall_json`: what recall did for one local answer of a document
    whose recall plan is `plan`.

    stats None (no recall for this answer): {"off": why} (`recall_off`). Otherwise the `RecallStats` fields plus
    `tokens_per_head`: tokens_recalled is summed over layers and KV heads, so it is divided by
    `heads` (layers x KV heads of the model) to be comparable with the `recall_tokens` setting.
    """
    if stats is None:
        return json.dumps({"off": recall_off(plan)})
    record = asdict(stats)
    record["seconds"] = stats.seconds
    record["tokens_per_head"] = round(stats.tokens_recalled / heads) if heads else None
    return json.dumps(record)


def answer_record(answer: Answer, *, model: ModelInfo | None, recall: RecallPlan | None,
                  low_confidence: bool = False) -> AnswerRecord:
    """How `answer` is stored in the library. model: the local model that answered (its label and
    shape; None when unknown); recall: the recall plan of the document it answered (why recall was off);
    low_confidence: the model was unsure of its words (`engine.cloud.policy.low_confidence`)."""
    state = "cancelled" if answer.stop_reason == StopReason.CANCELLED else "done"
    common = dict(text=answer.text, state=state, ttft_s=answer.time_to_first_token_s,
                  tokens_per_s=answer.decode_tokens_per_s or None, stop_reason=answer.stop_reason,
                  instructions_json=json.dumps(answer.instructions) if answer.instructions else None)
    reply = answer.cloud
    if reply is not None:
        return AnswerRecord(**common, source="cloud", endpoint=reply.endpoint, model=reply.model, reason=reply.reason,
                            tokens=reply.completion_tokens, prefix_hit=None)
    heads = model.profile.num_layers * model.profile.kv_heads if model else None
    return AnswerRecord(**common, source="local", endpoint=None, model=model.label if model else None, reason=None,
                        tokens=len(answer.token_ids), prefix_hit=int(answer.prefix_hit),
                        sources_json=sources_json(answer.sources), passages_json=passages_json(answer.passages),
                        recall_json=recall_record(answer.recall, recall, heads=heads),
                        mean_logprob=answer.mean_logprob if math.isfinite(answer.mean_logprob) else None,
                        low_confidence=int(low_confidence),
                        unsupported_json=json.dumps(answer.unsupported) if answer.unsupported else None)


def lowered_budget(settings: EngineSettings) -> EngineSettings:
    """`settings` with half the KV budget (at least MIN_BUDGET_TOKENS), for a retry after running
    out of memory. The window shrinks to a quarter of the new budget at most, the residual to the
    window, the sinks to what the window leaves, so the policy stays valid."""
    policy: CachePolicy = settings.cache
    budget = max(MIN_BUDGET_TOKENS, policy.budget_tokens // 2)
    window = min(policy.window_tokens, max(1, budget // 4))
    residual = min(policy.residual_tokens, window)
    sink = min(policy.sink_tokens, budget - window)
    return settings.replace(cache=policy.replace(budget_tokens=budget, window_tokens=window,
                                                 residual_tokens=residual, sink_tokens=sink))


def error_kind(exc: BaseException) -> ErrorKind:
    """Which `ErrorKind` `exc` is (pure: reads only its argument; the most specific kind wins)."""
    if isinstance(exc, Cancelled):
        return ErrorKind.CANCELLED
    if isinstance(exc, (PasswordRequiredError, WrongPasswordError)):
        return ErrorKind.PASSWORD
    if out_of_memory(exc) is not None:
        return ErrorKind.OOM
    for cls, kind in ((DocumentError, ErrorKind.DOCUMENT), (ModelError, ErrorKind.MODEL), (SettingsError, ErrorKind.SETTINGS),
                      (CacheStoreError, ErrorKind.CACHE), (HalamanError, ErrorKind.ERROR)):
        if isinstance(exc, cls):
            return kind
    return ErrorKind.BUG


# ---------------------------------------------------------------------------- the workspace
class Workspace:
    """Settings, model, document session and prefix store, for one caller at a time.

    model_factory(settings) -> LoadedModel loads the model (default `load_for`; tests hand over
    one already loaded). on_model_loaded(ModelInfo) is called, on the caller's thread, each time a
    model has been loaded. A prefix store that cannot be used (full disk, a file where its folder
    should be) is tried once per settings change; its notice appears once, in the next opened
    document's warnings.
    """

    def __init__(self, settings: EngineSettings, model_factory: Callable[[EngineSettings], LoadedModel] | None = None,
                 *, on_model_loaded: Callable[[ModelInfo], None] | None = None) -> None:
        settings.validate()
        self.settings = settings
        self.model_factory = model_factory or load_for
        self.on_model_loaded = on_model_loaded
        self.model: LoadedModel | None = None
        self.session: DocumentSession | None = None
        self._store: PrefixStore | None = None
        self._store_tried = False            # opened once (a store that cannot be used is not retried)
        self.notices: list[str] = []         # for the next open's warnings, once
        self._library: OpenLibrary | None = None   # the documents of the last library question, open index first
        self._library_paths: tuple[str, ...] = ()  # the paths it was built from (some may have failed to open)
        self._library_skipped: list[str] = []      # "title or path: why" for each of them that could not be opened

    # ------------------------------------------------------------------ model
    def ensure_model(self, progress: Callable[[Progress], None] | None = None) -> ModelInfo:
        """Load the model if none is loaded (a "loading model" Progress first), and make a session
        for it. Raises ModelError (and whatever the model factory raises)."""
        if self.model is None:
            if progress is not None:
                converting = conversion_pending(self.settings.model)
                progress(Progress(Phase.LOADING_MODEL, 0, 0, CONVERTING_MODEL_UNIT if converting else "model"))
            self.model = self.model_factory(self.settings)
            self.session = None
            if self.on_model_loaded is not None:
                self.on_model_loaded(self.model_info())
        if self.session is None:
            self.session = DocumentSession(self.model, self.settings, self.prefix_store())
        return self.model_info()

    def model_info(self) -> ModelInfo | None:
        """The loaded model's `ModelInfo`, None when none is loaded."""
        m = self.model
        if m is None:
            return None
        return ModelInfo(m.label, str(m.device), m.profile, m.weight_bytes, m.load_seconds, m.weights_label, m.threads)

    def unload_model(self) -> None:
        """Drop the model and its session and give their memory back (the GPU's cache too)."""
        self._close_library()
        if self.session is not None:
            self.session.close()
        self.session = None
        self.model = None
        int4_unpack.release()  # its unpacking buffers (~15 MB per reading thread)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -------------------------------------------------------------- documents
    def open(self, path: str | Document, *, password: str | None = None,
             progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             before_prefill: Callable[[ReadPlan], bool] | None = None, read_now: bool = True,
             on_read_plan: Callable[[ReadPlan], None] | None = None) -> OpenResult:
        """Load the model if needed, then read and prefill (or restore) a document: a path, or a
        `Document` already read (the CLI reads first, to report a bad file before the model loads).
        `before_prefill(plan)` is asked before a long read starts; False cancels it, and
        `on_read_plan(plan)` is told before any read (see `DocumentSession.open`); `read_now=False`
        opens it index first (`DocumentSession.read` reads it whole later). Raises what
        `DocumentSession.open` raises (DocumentError, Cancelled, HalamanError ...)."""
        self.ensure_model(progress)
        session = self.session
        session.notices += self.notices
        self.notices = []
        report = session.open(path, password=password, progress=progress, cancel=cancel, before_prefill=before_prefill,
                              read_now=read_now, on_read_plan=on_read_plan)
        key = session.prefix_key if session.store is not None else None
        shown = path.source if isinstance(path, Document) else str(path)
        return OpenResult(report, session.document, shown, key, session.memory(),
                          session.prefix_signature(report.document_tokens))

    def read(self, *, progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             pause: threading.Event | None = None,
             on_read_plan: Callable[[ReadPlan], None] | None = None) -> OpenReport | None:
        """Read the open document whole (`DocumentSession.read`, which tells `on_read_plan` how long
        it will take): its report once read, None when `pause` stopped the read between two chunks.
        Raises HalamanError when no document is open, Cancelled."""
        if self.session is None:
            raise HalamanError("no document is open: open a document first")
        read = self.session.read(progress=progress, cancel=cancel, pause=pause, on_read_plan=on_read_plan)
        return self.session.report if read else None

    def ask(self, question: str, *, follow_up: bool | None = False, on_text: Callable[[str], None] | None = None,
            cancel: threading.Event | None = None, progress: Callable[[Progress], None] | None = None) -> Answer:
        """Answer `question` with the local model (see `DocumentSession.ask`, which tells `progress`
        how far the chosen pages are re-read before the first word), with the names it
        states that the document does not contain in `Answer.unsupported` (`engine.grounding`).
        Raises HalamanError when no document is open or the question is empty."""
        self.ensure_model()
        return self.session.ask(question, follow_up=follow_up, on_text=on_text, cancel=cancel, progress=progress)

    def assume_asked(self, questions: Sequence[str]) -> None:
        """Take `questions` (oldest first) as the open document's conversation so far, unanswered
        (`DocumentSession.assume_asked`: the command line's `ask --after`). Raises HalamanError
        when no document is open."""
        if self.session is None or self.session.document is None:
            raise HalamanError("no document is open: open a document first")
        self.session.assume_asked(questions)

    def ask_cloud(self, question: str, *, reason: str = "user asked", on_text: Callable[[str], None] | None = None,
                  cancel: threading.Event | None = None, confirm: Callable[[CloudPlan], bool] | None = None,
                  api_key: str | None = None) -> Answer | None:
        """Send the question (and what fits of the open document) to the cloud endpoint of the
        settings (`engine.cloud.ask_cloud`: the answer has a `cloud` part; None when `confirm`
        declined). api_key None: the OS keyring's. Raises CloudError, HalamanError without an open
        document."""
        if self.session is None:  # the plan counts tokens with the local model's tokenizer
            raise HalamanError("no document is open: open a document first")
        return ask_cloud(self.session, question, self.settings, reason=reason, on_text=on_text, cancel=cancel,
                         confirm=confirm, api_key=api_key)

    def escalation_reason(self, answer: Answer) -> str | None:
        """Why `answer` should also go to the cloud by itself, or None (`engine.cloud.escalation_reason`
        with the open document's report and the settings). None when no document is open."""
        report = self.session.report if self.session is not None else None
        return escalation_reason(answer, report, self.settings) if report is not None else None

    def answer_record(self, answer: Answer) -> AnswerRecord:
        """`answer_record` with this workspace's model and the open document's recall plan, and
        whether the model was unsure of its words by the threshold in the settings."""
        recall = self.session.recall_plan if self.session is not None else None
        return answer_record(answer, model=self.model_info(), recall=recall,
                             low_confidence=cloud_policy.low_confidence(answer, self.settings))

    def outcome(self, answer: Answer) -> AnswerOutcome:
        """`answer` with its library record and its escalation, decided with the model, settings and
        open document that produced it (the window's worker returns this, so the window decides neither)."""
        return AnswerOutcome(answer, self.answer_record(answer), self.escalation_reason(answer))

    # ---------------------------------------------------------------- library
    def ask_library(self, question: str, paths: Sequence[str], *, on_text: Callable[[str], None] | None = None,
                    cancel: threading.Event | None = None) -> LibraryAnswer:
        """Answer `question` from the documents of `paths` the question picks (`engine.open_library`;
        `answer.unsupported` is set there), opened by `open_library`. Raises HalamanError when the
        question is empty or no document could be opened, Cancelled, and what `OpenLibrary.ask` raises."""
        check_question(question, "the documents")  # before any document is opened
        return self.open_library(paths, cancel=cancel).ask(question, on_text=on_text, cancel=cancel)

    def open_library(self, paths: Sequence[str], *, cancel: threading.Event | None = None,
                     progress_for: Callable[[int, int, str], Callable[[Progress], None] | None] | None = None
                     ) -> OpenLibrary:
        """The documents of `paths`, open index first with the library's index built, kept for the
        next library question; when `paths` differ from the last call's, every one is opened again
        (a file parsed before comes from its parsed copy, `engine.documents.parsed_cache`; a saved
        reading is reused).
        `progress_for(k, n, path)` gives the progress callback of the k-th of n opens (None: none).
        A document that cannot be opened is skipped (`library_skipped` names it). Raises
        HalamanError when none could be opened, Cancelled (nothing is kept)."""
        self.ensure_model()
        wanted = tuple(dict.fromkeys(str(p) for p in paths))
        if self._library is None or wanted != self._library_paths or not self._library.documents:
            self._close_library()
            self._library = OpenLibrary(self.model, self.settings, self.prefix_store())
            for k, path in enumerate(wanted, 1):
                try:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled()
                    progress = progress_for(k, len(wanted), path) if progress_for else None
                    # Parsed once: every CLI library question is a new process that opens every document.
                    document = load_reusing(path, cancel=cancel, include_generated=self.settings.include_generated_files,
                                            progress=reading_progress(progress, path) if progress else None)
                    self._library.add(document, cancel=cancel, progress=progress)
                except Cancelled:
                    self._close_library()  # a half-opened library must not pass for the whole one
                    raise
                except PasswordRequiredError:  # the library keeps no passwords: say what does work
                    self._library_skipped.append(f"{Path(path).name}: it is password-protected, and the library keeps no "
                                                 "passwords; open or ask it on its own with its password")
                except HalamanError as exc:
                    self._library_skipped.append(f"{Path(path).name}: {exc}")
            self._library.prepare()
            self._library_paths = wanted  # only now: one left half-opened by an unexpected error is rebuilt
        if not self._library.documents:
            raise HalamanError("no document of the library could be opened: "
                               + ("; ".join(self._library_skipped) or "the library is empty"))
        return self._library

    @property
    def library_skipped(self) -> list[str]:
        """"file: why" for each document the open library could not open."""
        return list(self._library_skipped)

    def library_outcome(self, answered: LibraryAnswer) -> AnswerOutcome:
        """A library answer as the library stores it: its text after a line saying how many
        documents it was asked across, which it read and which could not be opened; its sources
        (each naming its document) and every read document's attended passages (each naming its
        document, `AttendedSpan.document_source`). Never escalated: the cloud answers one document."""
        answer, documents = answered.answer, self._library.documents if self._library else []
        read = [documents[pick.document].document for pick in answered.picks]
        lead = (f"Asked across {len(documents)} document{'s' if len(documents) != 1 else ''}; read "
                + ", ".join(document.title for document in read) + ".")
        if self._library_skipped:
            lead += f"  \nCould not open: {'; '.join(self._library_skipped)}."
        unmatched = unmatched_note(answered.picks)
        if unmatched:
            lead += f"  \nNote: {unmatched}."
        record = answer_record(answer, model=self.model_info(), recall=None,
                               low_confidence=cloud_policy.low_confidence(answer, self.settings))
        passages = [replace(p, document_source=documents[d].document.source)
                    for d, found in answered.passages.items() for p in found]
        record = replace(record, text=f"{lead}\n\n{answer.text}", passages_json=passages_json(passages))
        return AnswerOutcome(answer, record, None, tuple(document.source for document in read))

    def _close_library(self) -> None:
        if self._library is not None:
            self._library.close()
        self._library, self._library_paths, self._library_skipped = None, (), []

    def memory(self) -> MemoryReport | None:
        """Weights / KV / workspace / free now, None before a model is loaded (see
        `DocumentSession.memory` for when it may be called during an open)."""
        return self.session.memory() if self.session is not None else None

    # --------------------------------------------------------------- settings
    def apply_settings(self, new: EngineSettings, change: SettingsChange | None = None) -> SettingsChange:
        """Use `new` from now on and say what the caller must redo (`SettingsChange`): after
        RELOAD_MODEL the model is unloaded (the next call loads it); after REOPEN_DOCUMENT the session
        is new and has no document. `change`: `SettingsChange.between(self.settings, new)` when the
        caller has decided it already (the window's client does, to act at once; the decision is
        made once). Raises SettingsError for invalid settings (nothing changes)."""
        new.validate()
        old, self.settings = self.settings, new
        if new != old:  # its documents were opened with the old settings (recall budget, cache policy, model)
            self._close_library()
        store_changed = (old.prefix_cache_disk_bytes, old.prefix_cache) != (new.prefix_cache_disk_bytes, new.prefix_cache)
        if store_changed:
            self._close_store()
        if change is None:
            change = SettingsChange.between(old, new)
        if change is SettingsChange.RELOAD_MODEL:
            self.unload_model()
        elif self.session is not None and change is SettingsChange.REOPEN_DOCUMENT:
            self.session.close()
            self.session = DocumentSession(self.model, new, self.prefix_store())
        elif self.session is not None:
            self.session.settings = new  # answer length, temperature, recall budget: read at the next ask
            if store_changed:  # the store under its new disk budget; one the session turned off after an error stays off
                self.session.store = self.prefix_store()
        return change

    # ------------------------------------------------------------ prefix store
    def prefix_store(self, *, even_if_off: bool = False) -> PrefixStore | None:
        """The prefix store, opened on first use; None when the settings turn it off (unless
        `even_if_off`, for listing and clearing it) or it cannot be used (a notice says why)."""
        if not (self.settings.prefix_cache or even_if_off):
            return None
        if self._store is None and not self._store_tried:
            self._store_tried = True
            self._store, notice = open_store(prefix_store_dir(), disk_budget_bytes=self.settings.prefix_cache_disk_bytes)
            if notice:
                self.notices.append(notice)
        return self._store

    def prefix_entries(self) -> list[PrefixEntry] | None:
        """The stored prefixes, most recently used first (`halaman cache list` prints them so); None when
        the store cannot be used. Raises CacheStoreError when its index cannot be read."""
        store = self.prefix_store(even_if_off=True)
        return store.entries() if store is not None else None

    def cached_keys(self) -> set[str]:
        """Keys of the stored prefixes (empty without a usable store)."""
        return {entry.key for entry in self.prefix_entries() or []}

    def cache_status(self, token_counts: set[int]) -> CacheStatus:
        """The stored keys, and the signature documents of `token_counts` prefix tokens would be
        keyed with now (`CacheStatus`; no signatures before a model is loaded: loading one to
        answer would take seconds)."""
        entries = {entry.key: entry.n_tokens for entry in self.prefix_entries() or []}
        if self.model is None:
            return CacheStatus(frozenset(entries), entry_tokens=entries)
        self.ensure_model()  # the session, after a settings change replaced it
        return CacheStatus(frozenset(entries), {n: self.session.prefix_signature(n) for n in token_counts}, entries)

    def prefix_cache_usage(self) -> tuple[int, int]:
        """(entries, bytes) in the prefix store; (0, 0) without a usable store."""
        store = self.prefix_store(even_if_off=True)
        return (len(store.entries()), store.total_bytes()) if store is not None else (0, 0)

    def clear_prefix_cache(self) -> int:
        """Delete every stored prefix, the documents' parsed copies (`parsed_cache.clear`) and what
        `find` kept of their spans (`kept_spans.clear`); returns how many prefixes. Without a usable
        store (full disk, damaged folder) the files are deleted by name: clearing always frees the space."""
        parsed_cache.clear()
        kept_spans.clear()
        store = self.prefix_store(even_if_off=True)
        return store.clear() if store is not None else clear_files(prefix_store_dir())

    def shutdown(self) -> None:
        """Close the store and drop the model (the workspace may be used again: it reloads)."""
        self._close_store()
        self.unload_model()

    def _close_store(self) -> None:
        self._close_library()  # its documents hold the store
        self._store_tried = False
        if self._store is not None:
            self._store.close()
            self._store = None
        if self.session is not None:
            self.session.store = None
