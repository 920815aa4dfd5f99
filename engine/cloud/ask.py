"""`ask_cloud`: send a question and the open document to the cloud endpoint; an `Answer` with a `CloudReply`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine.answer import Answer, CloudReply, StopReason
from engine.cloud import client
from engine.cloud.client import RequestLimits, stream_chat_completion
from engine.cloud.errors import CloudError
from engine.cloud.finish import Finish
from engine.cloud.plan import CloudPlan, plan_request
from engine.settings import CloudSettings
from engine.grounding import instructions_note
from engine.secrets import load_api_key
from engine.settings import EngineSettings

log = logging.getLogger("engine.cloud")


def ask_cloud(
    session,
    question: str,
    settings: EngineSettings,
    *,
    reason: str = "user asked",
    on_text: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    confirm: Callable[[CloudPlan], bool] | None = None,
    api_key: str | None = None,
) -> Answer | None:
    """Answer `question` about `session`'s open document with the cloud model, streaming text
    pieces to `on_text` (from this thread) as they arrive.

    session: an `engine.session.DocumentSession` with an open document (read, never imported:
    the cloud package sits below the session). reason: recorded as the answer's `cloud.reason`
    ("user asked", or what `escalation_reason` returned).
    confirm(plan) -> bool: shown what would be sent; False cancels and returns None. Required
    when `settings.cloud.ask_before_sending` is on. api_key: used instead of the OS keyring
    (`engine.secrets.load_api_key(base_url)`); no key at all sends no Authorization header (local
    servers need none). cancel: setting it stops the request within about 0.1 s of a blocked read
    and returns what arrived (stop_reason "cancelled"); a connection still being opened finishes
    or times out first (`connect_timeout_s`).

    A stream cut in the middle (connection closed, no data for `read_timeout_s`) is not an error
    when some text arrived: the partial answer is returned with stop_reason "cut" and
    `cloud.cut_reason` set (`incomplete` is True), nothing lost. How the answer ended, its
    reasoning (kept out of `text` and of `on_text`) and its notices: see `outcome`,
    `Answer.reasoning`, `CloudReply.finish` / `.notices`.
    Raises CloudError: kind "disabled" when `settings.cloud.enabled` is False (checked before
    anything else: no socket is opened); "config"; every HTTP and network failure before the first
    piece of text (see `CloudError.kind`); malformed data or an error event mid-stream, with the
    text so far in `partial_text`. Raises SettingsError for invalid cloud settings.
    """
    cloud = settings.cloud
    plan = confirmed_plan(session, question, cloud, confirm)
    if plan is None:
        return None
    key = api_key if api_key is not None else load_api_key(cloud.base_url)
    log.info("sending %d of %d document tokens to %s (model %s): %s", plan.document_tokens_sent,
             plan.document_tokens_total, plan.endpoint, plan.model, reason)
    began = time.perf_counter()
    limits = RequestLimits(connect_timeout_s=cloud.connect_timeout_s, read_timeout_s=cloud.read_timeout_s,
                           max_retries=client.MAX_RETRIES, backoff_s=client.BACKOFF_S, max_wait_s=client.MAX_WAIT_S)
    result = stream_chat_completion(cloud.base_url, request_body(plan, cloud), api_key=key, limits=limits,
                                    on_text=on_text, cancel=cancel)
    if result.cut_reason and not result.text:
        raise CloudError(f"{result.cut_reason} and no text had arrived: try again", kind="cut")
    answer = cloud_answer(question, result, plan, cloud, reason)
    log.debug("cloud answer: %d characters in %.2f s, stop %s", len(result.text), time.perf_counter() - began, answer.stop_reason)
    return answer


def confirmed_plan(session, question: str, cloud: CloudSettings,
                   confirm: Callable[[CloudPlan], bool] | None) -> CloudPlan | None:
    """What would be sent for `question` about `session`'s document (`plan_request`), its warnings
    logged, once `confirm(plan)` allowed it; None when it declined. Raises CloudError when the cloud
    is off (before anything else) or 'ask before sending' is on with no `confirm`, SettingsError
    for invalid cloud settings."""
    if not cloud.enabled:
        raise CloudError("cloud fallback is off, so nothing was sent: turn it on in cloud settings to ask the cloud model",
                         kind="disabled")
    cloud.validate()
    plan = plan_request(session, question, cloud)
    for warning in plan.warnings:
        log.warning("cloud request: %s", warning)
    if confirm is not None:
        if not confirm(plan):
            log.info("cloud request declined before sending")
            return None
    elif cloud.ask_before_sending:
        raise CloudError("'ask before sending' is on but nothing can ask: pass confirm= or turn the setting off",
                         kind="config")
    return plan


def request_body(plan: CloudPlan, cloud: CloudSettings) -> dict:
    """The Chat Completions request body for `plan`: streamed, with usage asked for."""
    return {
        "model": cloud.model,
        "messages": plan.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": cloud.temperature,
        "max_tokens": cloud.max_tokens,
    }


def cloud_answer(question: str, result: client.StreamResult, plan: CloudPlan, cloud: CloudSettings, reason: str) -> Answer:
    """The `Answer` (with its `CloudReply`) for a streamed completion that sent some text: how it
    ended and its notices (`outcome`, logged), its decode rate from the endpoint's usage."""
    stop, cut_reason, notices = outcome(result, plan.prompt_tokens_estimate, cloud.max_tokens)
    if plan.instructions:  # the answer's check line: the document spoke to the model
        notices.append(instructions_note(list(plan.instructions)))
    if cut_reason:
        log.warning("cloud answer incomplete after %d characters: %s", len(result.text), cut_reason)
    for notice in notices:
        log.warning("cloud answer: %s", notice)
    usage = result.usage
    first, last = result.time_to_first_token_s, result.last_token_s
    completion = usage.completion_tokens if usage else None
    rate = (completion - 1) / (last - first) if completion and completion > 1 and first is not None and last and last > first else 0.0
    reply = CloudReply(endpoint=plan.endpoint, model=result.model or cloud.model, reason=reason, usage=usage, plan=plan,
                       finish_reason=result.finish_reason, cut_reason=cut_reason, attempts=result.attempts,
                       finish=result.finish, notices=tuple(notices))
    return Answer.from_cloud(
        question, result.text,
        prompt_tokens=usage.prompt_tokens if usage and usage.prompt_tokens is not None else plan.prompt_tokens_estimate,
        time_to_first_token_s=first or 0.0, decode_tokens_per_s=rate, stop_reason=stop, reply=reply,
        reasoning=result.reasoning,
    )

TRUNCATION_SHARE = 0.5
"""An endpoint that counts fewer prompt tokens than this share of the planned ones cut the prompt
(Ollama keeps only what fits its `num_ctx`, without an error: ollama/ollama #3839; tokenizers differ by far less)."""
MIN_PLANNED_FOR_TRUNCATION = 256
"""Below this many planned tokens, tokenizer and template differences dominate the ratio."""


def outcome(result: client.StreamResult, planned_tokens: int, max_tokens: int | None) -> tuple[StopReason, str | None, list[str]]:
    """How a streamed completion ended: (stop_reason, cut_reason, notices for the user).

    stop_reason: "cancelled"; "cut" when the stream broke off or the finish was neither a normal
    end nor a length limit (content filter, tool call, server abort or error, a value no provider
    list has: B13), with `cut_reason` saying which; "max_tokens" for the answer-length limit and
    a full context window; "end" for a normal end (or `[DONE]` with no finish_reason at all).
    notices: the length limit and what to raise; reasoning that used the whole budget with no
    answer (B18a); a prompt the endpoint counted at under TRUNCATION_SHARE of `planned_tokens`.
    """
    notices: list[str] = []
    finish = result.finish
    if result.cancelled:
        stop, cut_reason = StopReason.CANCELLED, None
    elif result.cut_reason:
        stop, cut_reason = StopReason.CUT, result.cut_reason
    elif finish is None or finish is Finish.STOP:
        stop, cut_reason = StopReason.END, None
    elif finish in (Finish.LENGTH, Finish.CONTEXT):
        stop, cut_reason = StopReason.MAX_TOKENS, None
        if result.reasoning and not result.text.strip():
            budget = f" ({max_tokens} tokens)" if max_tokens else ""
            notices.append(f"the model spent the whole answer budget{budget} reasoning and wrote no answer: "
                           "raise 'max tokens' in cloud settings (its reasoning is kept apart)")
        else:
            notices.append(finish.notice(result.finish_reason or ""))
    else:
        stop, cut_reason = StopReason.CUT, finish.notice(result.finish_reason or "")
    counted = result.usage.prompt_tokens if result.usage else None
    if counted is not None and planned_tokens >= MIN_PLANNED_FOR_TRUNCATION and counted < TRUNCATION_SHARE * planned_tokens:
        notices.append(f"the endpoint counted only {counted:,} prompt tokens of about {planned_tokens:,} sent: it probably "
                       "cut the document to fit a smaller context (Ollama does so silently: raise its num_ctx), "
                       "so the answer may not have seen all of it")
    return stop, cut_reason, notices
