"""Plain-text lines describing a cloud plan and a cloud answer's provenance (CLI report, tooltips)."""

from __future__ import annotations

from engine.answer import Answer
from engine.cloud.plan import CloudPlan


def plan_lines(plan: CloudPlan) -> list[str]:
    """What would be sent, one fact per line, warnings last (prefixed "warning: ")."""
    shown = ", ".join(plan.segments_sent[:8]) + (f", … ({len(plan.segments_sent) - 8} more)" if len(plan.segments_sent) > 8 else "")
    lines = [
        f"endpoint        {plan.endpoint} (model {plan.model})",
        f"document        {plan.document_title}: {plan.document_tokens_sent:,} of {plan.document_tokens_total:,} tokens"
        f"{' (cut to fit)' if plan.was_cut else ' (all of it)'}",
        f"parts sent      {shown or 'none'}",
        f"question        {plan.question}",
    ]
    return lines + [f"warning: {w}" for w in plan.warnings]


def provenance_lines(answer: Answer) -> list[str]:
    """Where an answer came from and what it cost: source, endpoint, model, reason, usage, stop
    (with the endpoint's finish_reason and its meaning), the reasoning kept apart, and the
    answer's notices last (prefixed "warning: ")."""
    reply = answer.cloud
    if reply is None:
        return ["source          local"]
    lines = [
        "source          cloud",
        f"endpoint        {reply.endpoint}",
        f"model           {reply.model}",
        f"reason          {reply.reason}",
    ]
    plan = reply.plan
    if plan is not None:
        lines.append(f"sent            {plan.document_tokens_sent:,} of {plan.document_tokens_total:,} document tokens"
                     f" ({len(plan.segments_sent)} parts){'; the document was cut to fit' if plan.was_cut else ''}")
    usage = reply.usage
    if usage is not None:
        lines.append(f"usage           prompt {usage.prompt_tokens} + completion {usage.completion_tokens} = "
                     f"{usage.total_tokens} tokens (reported by the endpoint)")
    else:
        lines.append("usage           not reported by the endpoint")
    finish = f" (finish_reason {reply.finish_reason!r}: {reply.finish.value})" if reply.finish is not None else ""
    stop = answer.stop_reason + finish + (f" — INCOMPLETE: {reply.cut_reason}" if reply.cut_reason else "")
    lines.append(f"TTFT            {answer.time_to_first_token_s:.2f} s; stop: {stop}")
    if answer.reasoning:
        lines.append(f"reasoning       {len(answer.reasoning):,} characters, kept apart from the answer")
    return lines + [f"warning: {notice}" for notice in reply.notices]
