"""Answer: what a question got back, from the local model or from the cloud, in one type.

A local answer (`DocumentSession.ask`) has `cloud = None`. A cloud answer (`engine.cloud.ask_cloud`)
has a `CloudReply`: where it went, which model answered, why it was sent, what the endpoint
reported. Callers look at `answer.cloud` instead of comparing strings.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kvcache.breakdown import MemoryBreakdown

if TYPE_CHECKING:  # types only: the cloud package builds these, and imports this module
    from engine.attended import AttendedSpan
    from engine.cloud.client import CloudUsage
    from engine.cloud.finish import Finish
    from engine.cloud.plan import CloudPlan
    from engine.kvcache.recall import RecallStats


class StopReason(enum.StrEnum):
    """Why an answer stopped. A str enum because it is stored as text in the library's
    `messages.stop_reason` and read back as a plain str, which compares equal to these members.

    END: the model (or the endpoint) ended it. MAX_TOKENS: the answer-length limit (or a full
    context window). CANCELLED: the user stopped it; what arrived is kept. CUT: a cloud stream
    broke off (`CloudReply.cut_reason` says why). ERROR: the job failed; only the library records
    this one (an `Answer` never carries it).
    """

    END = "end"
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"
    CUT = "cut"
    ERROR = "error"


@dataclass(frozen=True)
class Source:
    """A page or file whose recalled tokens the answer attended to.

    share: that page's part of all the attention the recalled tokens received (0..1), summed over
    layers, heads, the question and the answer's tokens. From the model's attention, not from text
    matching. page / path as in `engine.documents.Segment`. document / document_source: the title
    and the file or folder (`Document.source`) of the document it is in, for an answer over several
    (`engine.open_library`); None for one document's answer. shown: how a reader knows the page
    where its printed label differs ("page 48 (PDF page 68)", `Segment.shown`), for an answer over
    several, whose citations name it so; None where it is the label.
    """

    label: str
    share: float
    page: int | None = None
    path: str | None = None
    document: str | None = None
    document_source: str | None = None
    shown: str | None = None

    @property
    def cited_name(self) -> str:
        """How a citation names it: its label ("page 3"), or for a library answer's source its
        document's title with it ("Think Python, page 3"), once for a single file whose one
        segment is named as the document is ("notes.md", or "a/minutes.txt" when the library
        tells two minutes.txt apart: `engine.citations.distinct_titles`). A page whose printed
        label differs is named as printed: "Think Python, page 48 (PDF page 68)" (`shown`)."""
        if not self.document or self.label == self.document:
            return self.label
        if self.document.endswith("/" + self.label):
            return self.document
        return f"{self.document}, {self.shown or self.label}"


@dataclass
class DraftStats:
    """Prompt-lookup speculative decoding in one answer: passes that checked drafts, tokens drafted,
    tokens accepted (each accepted token is a decode pass saved)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class CloudReply:
    """The cloud part of an answer that came from an OpenAI-compatible endpoint.

    endpoint: the base URL it was sent to (as shown: no credentials). model: the model name the
    endpoint reported (else the one requested). reason: why it went to the cloud ("user asked", or
    `engine.cloud.escalation_reason`'s line). usage: token counts the endpoint reported, or None.
    plan: what was sent (`plan.was_cut` says whether the document was cut). finish_reason: as the
    endpoint sent it; finish: what it means (`engine.cloud.finish.Finish`, None when none came).
    cut_reason: why the answer is incomplete (the stream broke off, or a finish other than a normal
    end or the length limit), None when it is not. notices: one line each for the user, about this
    answer (the length limit, reasoning that used the whole budget, a document the endpoint
    probably cut). attempts: HTTP requests made, retries included.
    """

    endpoint: str
    model: str
    reason: str
    usage: CloudUsage | None = None
    plan: CloudPlan | None = None
    finish_reason: str | None = None
    cut_reason: str | None = None
    attempts: int = 0
    finish: Finish | None = None
    notices: tuple[str, ...] = ()

    @property
    def completion_tokens(self) -> int | None:
        """Tokens of the answer as the endpoint counted them; None when it did not report usage."""
        return self.usage.completion_tokens if self.usage is not None else None


@dataclass
class Answer:
    """One answer to one question.

    time_to_first_token_s counts from the call to the first streamed piece. prefix_hit: the
    document's KV cache was reused for this answer (restored from the prefix store, or kept in
    memory from an earlier question) rather than prefilled just before it, and it is read whole
    (`engine.open_document.OpenDocument.take_prefix_hit`; for a library answer, every document
    it read). stop_reason: "end",
    "max_tokens", "cancelled", or "cut" (a cloud stream broke off; `cloud.cut_reason` says why and
    `text` holds what arrived). mean_logprob: mean natural-log probability of the chosen tokens,
    the confidence signal for escalation. reasoning: what the model reasoned before answering
    (`<think>` blocks, a cloud endpoint's reasoning fields), kept out of `text`; "" when none
    (the GUI shows it folded). unsupported: names in `text` found nowhere in the document or the
    question (`engine.grounding`), set by the answer frame (`engine.generate.answer_frame`); [] when
    every name is found. instructions: phrases of the documents read written as instructions to the model
    ("ignore all previous instructions": `engine.grounding.instruction_like`), set there too; [] when none.

    A cloud answer (`cloud` set) has no token ids, a NaN `mean_logprob` (not requested, so unknown;
    NaN never compares below a threshold, so it is never escalated again), an all-zero `kv` (no
    local cache was used), `prompt_tokens` as the endpoint counted them (else the plan's estimate),
    and no recall, sources, passages or drafts.
    """

    question: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    time_to_first_token_s: float
    decode_tokens_per_s: float
    prefix_hit: bool
    stop_reason: StopReason
    mean_logprob: float
    kv: MemoryBreakdown = field(default_factory=MemoryBreakdown)
    recall: RecallStats | None = None                     # what recall scored and read (None: no recall)
    sources: list[Source] = field(default_factory=list)   # attention-grounded pages / files
    passages: list[AttendedSpan] = field(default_factory=list)  # their attended sentences / lines (engine.attended)
    drafts: DraftStats | None = None                      # prompt-lookup speculative decoding (None: cloud answer)
    cloud: CloudReply | None = None                       # set when the answer came from the cloud
    reasoning: str = ""                                   # the model's monologue, apart from `text`
    unsupported: list[str] = field(default_factory=list)  # names the document does not contain (engine.grounding)
    instructions: list[str] = field(default_factory=list)  # document text addressed to the model (engine.grounding)
    continues: str = ""  # why it went on from the previous question ("refers back: “it”"); "" when it started afresh

    @property
    def incomplete(self) -> bool:
        """The stream was cut before the model finished (cloud only)."""
        return self.cloud is not None and self.cloud.cut_reason is not None

    @classmethod
    def from_cloud(cls, question: str, text: str, *, prompt_tokens: int, time_to_first_token_s: float,
                   decode_tokens_per_s: float, stop_reason: StopReason, reply: CloudReply,
                   reasoning: str = "") -> Answer:
        """A cloud answer: the local-only fields get the values the class docstring gives."""
        return cls(question=question, text=text, token_ids=[], prompt_tokens=prompt_tokens,
                   time_to_first_token_s=time_to_first_token_s, decode_tokens_per_s=decode_tokens_per_s,
                   prefix_hit=False, stop_reason=stop_reason, mean_logprob=math.nan, cloud=reply,
                   reasoning=reasoning, instructions=list(reply.plan.instructions) if reply.plan else [])
