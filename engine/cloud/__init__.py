"""Cloud fallback: escalate a question to any OpenAI-compatible Chat Completions endpoint, only
when the user allows it. Off by default; while `settings.cloud.enabled` is False nothing here
opens a socket.

    reason = escalation_reason(answer, report, settings)       # None: keep the local answer
    if reason or user_clicked_ask_the_cloud:
        answer = ask_cloud(session, question, settings, reason=reason or "user asked",
                           on_text=show, cancel=stop_event, confirm=ask_user)   # None: user said no
        answer.cloud.endpoint, answer.cloud.usage                              # an Answer with a CloudReply

Layout: `plan.py` decides what is sent (`CloudPlan`: the question plus as much of the document as
`context_tokens` allows, cut by relevance when it does not fit); `policy.py` decides when to
escalate by itself (mean log-probability, document coverage); `client.py` speaks the protocol
(streaming SSE over `requests`, retries, timeouts; content parts, reasoning apart from the
answer); `finish.py` says what each provider's `finish_reason` means (`Finish`); `transport.py` lets a cancel reach the sockets;
`sse.py` parses the W3C event-stream format; `errors.py` holds `CloudError`, turns HTTP failures
into it and keeps the API key out of every message and log line; `report.py` formats a plan and an
answer's provenance as text.
The key comes from the OS keyring (`engine.secrets`), never from the settings file.
"""

from engine.cloud.ask import ask_cloud
from engine.cloud.client import CloudUsage
from engine.cloud.errors import CloudError
from engine.cloud.finish import Finish
from engine.cloud.plan import CloudPlan, plan_request
from engine.cloud.policy import escalation_reason

__all__ = ["CloudError", "CloudPlan", "CloudUsage", "Finish", "ask_cloud", "escalation_reason", "plan_request"]
