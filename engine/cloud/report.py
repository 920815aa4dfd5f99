"""Plain-text lines describing a cloud plan and a cloud answer's provenance (CLI report, tooltips)."""

from __future__ import annotations

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


def provenance_lines(answer) -> list[str]:
    """Where an answer came from and what it cost: source, endpoint, model, reason, usage, stop."""
    if getattr(answer, "source", "local") != "cloud":
        return ["source          local"]
    lines = [
        "source          cloud",
        f"endpoint        {answer.endpoint}",
        f"model           {answer.cloud_model}",
        f"reason          {answer.escalation_reason}",
    ]
    plan = getattr(answer, "plan", None)
    if plan is not None:
        lines.append(f"sent            {plan.document_tokens_sent:,} of {plan.document_tokens_total:,} document tokens"
                     f" ({len(plan.segments_sent)} parts){'; the document was cut to fit' if plan.was_cut else ''}")
    usage = getattr(answer, "usage", None)
    if usage is not None:
        lines.append(f"usage           prompt {usage.prompt_tokens} + completion {usage.completion_tokens} = "
                     f"{usage.total_tokens} tokens (reported by the endpoint)")
    else:
        lines.append("usage           not reported by the endpoint")
    stop = answer.stop_reason + (f" — INCOMPLETE: {answer.cut_reason}" if answer.incomplete else "")
    lines.append(f"TTFT            {answer.time_to_first_token_s:.2f} s; stop: {stop}")
    return lines
