"""When to escalate a local answer to the cloud by itself: `escalation_reason`.

Signal: the local answer's mean log-probability per chosen token (`Answer.mean_logprob`, natural
log), compared with `CloudSettings.escalation_threshold`. We chose it over the entropy of the
next-token distribution because the session already computes it for every answer at no cost, it
does not depend on the answer's length, and it measures how sure the model was of the words it
actually wrote (entropy also rises when many phrasings of a right answer are equally good).

Calibration (embedded SmolLM2-135M, greedy, default cache policy, 40 new tokens per answer; 23
questions about the bundled KV-cache primer (562 tokens), chapter 1 of Think Python from the
test corpus (P16 in docs/CORPUS.md, 4,260 tokens) and the 18-page DMCA summary (P05, 9,708 tokens, 42 % kept by the
cache); each answer judged against the document): mean log-probability ranged from -1.54 to -0.35,
median -1.19. Only 3 of 23 answers were right (-1.37, -1.03, -0.35). The threshold fires on
1 / 23 answers at -1.5, 10 / 23 at -1.2 and 18 / 23 at -1.0 (16 of the 20 wrong answers and 2 of
the 3 right ones). The signal separates poorly on this model: its worst errors are confident
(a wrong date at -0.54, a wrong title at -0.39). -1.0, the default in `CloudSettings`, is the
value that catches most wrong answers; -1.5 escalates almost never. The threshold is specific to
the local model: recalibrate it for another one.

Coverage: a document is "not represented well enough" locally when the compressed cache keeps
less than MIN_KEPT_FRACTION of its tokens (`settings.cache.budget_tokens` of
`OpenReport.document_tokens`) and the cloud request could carry at least CLOUD_GAIN times as many
tokens of it as the local cache keeps. Below that gain the cloud would see about as little as the
local model, so sending the document would buy nothing.
"""

from __future__ import annotations

from typing import Protocol

from engine.answer import Answer, StopReason
from engine.cloud.plan import document_room_tokens
from engine.settings import EngineSettings


class OpenedDocument(Protocol):
    """What the policy reads of an `engine.session.OpenReport` (the cloud package sits below the
    session in the layers, so it names the one field it needs instead of importing it)."""

    document_tokens: int

MIN_KEPT_FRACTION = 0.25   # the local cache keeps under a quarter of the document's tokens ...
CLOUD_GAIN = 2.0           # ... and the cloud could read at least twice as many of them


def kept_fraction(document_tokens: int, budget_tokens: int) -> float:
    """Share (0..1) of a document's tokens the compressed cache keeps: budget / tokens, at most 1."""
    return min(1.0, budget_tokens / max(document_tokens, 1))


def low_confidence(answer: Answer, settings: EngineSettings) -> bool:
    """The local model was unsure of the words it wrote: `answer`'s mean log-probability is below
    `settings.cloud.escalation_threshold` (the signal of the module docstring, the same whether or
    not the cloud is on, so the window can say so under the answer). False for a cloud answer, a
    cancelled one and an empty one. Pure."""
    if answer.cloud is not None or answer.stop_reason == StopReason.CANCELLED or not answer.text.strip():
        return False
    return answer.mean_logprob < settings.cloud.escalation_threshold


def escalation_reason(answer: Answer, report: OpenedDocument, settings: EngineSettings) -> str | None:
    """Why `answer` should go to the cloud by itself, as one line, or None to keep it local.

    answer: a local `engine.answer.Answer`; report: the `engine.session.OpenReport` of its document;
    settings: the engine settings (cloud fallback, threshold, cache budget).
    Always None when the cloud fallback is off, automatic escalation is off, the answer is not
    local, or it was cancelled. Otherwise, in this order: an empty answer; mean log-probability
    below `settings.cloud.escalation_threshold`; names in the answer that the document does not
    contain (`Answer.unsupported`, `engine.grounding`); the document poorly covered by the local cache
    (see the module docstring). Pure: reads its arguments, opens nothing.
    """
    cloud = settings.cloud
    if not (cloud.enabled and cloud.auto_escalate):
        return None
    if answer.cloud is not None or answer.stop_reason == StopReason.CANCELLED:
        return None
    if not answer.text.strip():
        return "the local model gave no answer"
    if low_confidence(answer, settings):
        return (f"low confidence: the local answer's mean log-probability is {answer.mean_logprob:.2f} per token, "
                f"below the threshold {cloud.escalation_threshold:.2f}")
    if answer.unsupported:
        return "the local answer names things the document does not contain: " + ", ".join(answer.unsupported)
    budget = settings.cache.budget_tokens
    kept = kept_fraction(report.document_tokens, budget)
    kept_tokens = min(budget, report.document_tokens)
    cloud_tokens = min(report.document_tokens, document_room_tokens(cloud))
    if kept < MIN_KEPT_FRACTION and cloud_tokens >= CLOUD_GAIN * kept_tokens:
        return (f"document too long for the local cache: it keeps {kept_tokens:,} of {report.document_tokens:,} tokens "
                f"({100 * kept:.0f} %), the cloud can read about {cloud_tokens:,}")
    return None
