"""`CloudError`, the translation of HTTP failures into it, and the redaction of secrets from every
line that leaves the cloud client.

An API key must never reach a log line, an exception message or a crash report. Three guards:
our own messages are built from known parts and passed through `redact`; urllib3's and requests'
loggers get a filter that redacts every registered secret; and errors raised from a failed
request never chain the `requests` exception (whose `.request` holds the Authorization header).
"""

from __future__ import annotations

import http
import json
import logging
import re
import socket
import ssl
import threading
import urllib.parse

import requests
import urllib3.exceptions

from engine.errors import HalamanError

REDACTED = "[redacted]"
# Secrets shorter than this are not redacted by substring: "a" would blank every message.
MIN_SECRET_CHARS = 4
# Loggers that may format a URL or a header of our requests. A filter on a parent logger does not
# see records of its children, so each one gets the filter.
_LOGGERS = ("urllib3", "urllib3.connectionpool", "urllib3.connection", "urllib3.response",
            "urllib3.util.retry", "requests", "engine.cloud")

# Each server's words for "the request is longer than the model's context" (B-kind of issue 22):
# OpenAI / Azure / DeepSeek / vLLM "This model's maximum context length is 8192 tokens"; vLLM "The
# decoder prompt (length 5000) is longer than the maximum model length of 4096"; SGLang "is longer
# than the model's context length"; llama.cpp "the request exceeds the available context size";
# Ollama "input length exceeds the context length" / "exceeds maximum context length"; Anthropic
# "prompt is too long: 215000 tokens > 200000 maximum" and "input length and `max_tokens` exceed
# context limit"; Mistral "too large for model with 32768 maximum context length"; Gemini "The
# input token count (1200000) exceeds the maximum number of tokens allowed"; TGI "`inputs` tokens
# + `max_new_tokens` must be <= 4096"; Groq "Please reduce the length of the messages".
_CONTEXT_LENGTH = re.compile(
    r"context[ _-]?(?:length|window|size|limit)|maximum context|max(?:imum)?[ _]model[ _]len|n_ctx|too many tokens|"
    r"prompt is too long|input is too long|reduce the length|exceeds? (?:the )?(?:\w+ )?(?:maximum )?context|"
    r"exceeds? the maximum number of tokens|max_new_tokens.{0,3} must be <=",
    re.I,
)
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"})
"""`error.code` / `error.type` values that say the same: OpenAI, Azure; llama.cpp's server."""

_secrets: set[str] = set()
_lock = threading.Lock()


class CloudError(HalamanError):
    """A cloud request failed; `str()` is one line naming the problem and what to do.

    kind: what went wrong, for the GUI to pick an icon or an action:
        "disabled" (cloud fallback is off; nothing was sent), "config" (missing URL, model,
        confirm callback, or no room for the document), "auth" (401/403), "not_found" (404),
        "rate_limited" (429 after retries), "server" (5xx after retries, or an error event in
        the stream), "bad_request" (another 4xx), "context_length" (400: the request exceeds
        the endpoint's context), "timeout" (connect or read), "dns", "connection" (refused,
        reset), "tls" (certificate not verified), "protocol" (malformed SSE, unexpected content
        type, redirect), "cut" (the stream ended before any text arrived).
    status: the HTTP status code, when there was a response.
    partial_text: the answer text that had arrived (and was already streamed to `on_text`)
        before the failure; "" when none did.
    """

    def __init__(self, message: str, *, kind: str = "other", status: int | None = None, partial_text: str = "") -> None:
        super().__init__(redact(" ".join(message.split())))  # one line, whatever went in
        self.kind = kind
        self.status = status
        self.partial_text = redact(partial_text)

    def __repr__(self) -> str:
        return f"CloudError({str(self)!r}, kind={self.kind!r}, status={self.status!r})"


def register_secret(secret: str | None) -> None:
    """Redact `secret` from every later message of `CloudError` and the HTTP loggers.

    Secrets stay registered for the life of the process: the key is in its memory anyway, and a
    late log line (a connection closed during shutdown) must not slip through.
    """
    if secret and len(secret) >= MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(secret)
    _install_filter()


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """`text` with every registered secret (and each of `extra`) replaced by "[redacted]"."""
    with _lock:
        secrets = sorted(_secrets.union(s for s in extra if s and len(s) >= MIN_SECRET_CHARS), key=len, reverse=True)
    for secret in secrets:  # longest first: a key that contains another is removed whole
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


class _RedactingFilter(logging.Filter):
    """Rewrites a record's message with secrets redacted (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _secrets:
            message = record.getMessage()
            cleaned = redact(message)
            if cleaned != message:
                record.msg, record.args = cleaned, None
            if record.exc_info:  # a traceback may quote a URL or a header: format it now, redacted
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
                record.exc_info = None
        return True


_FILTER = _RedactingFilter()
_installed = False


def _install_filter() -> None:
    global _installed
    if _installed:
        return
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
    _installed = True


# ------------------------------------------------------ HTTP failures as CloudError
def status_error(status: int, message: str, *, where: str, model: str, has_key: bool, attempts: int,
                 extra: str = "", code: str = "") -> CloudError:
    """The CloudError for an HTTP error `status` whose body said `message` (see `server_message`).

    where: the endpoint as shown; model: the model requested; has_key: a key was sent;
    attempts: requests made (retries included); extra: appended to the problem (e.g. a long wait);
    code: the body's `error.code` (`server_code`).
    """
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    code = f"{status} {phrase}"
    said = f" — the server says: {message[:200]}" if message else ""

    def error(kind: str, problem: str, action: str) -> CloudError:
        return CloudError(f"{problem}{said}: {action}", kind=kind, status=status)

    if status == 401 and has_key:
        return error("auth", f"the endpoint rejected the API key ({code})", f"store the right key for {where} in cloud settings")
    if status == 401:
        return error("auth", f"the endpoint needs an API key ({code}) and none is stored for {where}",
                     "add one in cloud settings (it is kept in the OS keyring)")
    if status == 403:
        return error("auth", f"the API key may not use this endpoint or model ({code})",
                     f"check the key's permissions and the model name {model!r}")
    if status == 404:
        return error("not_found", f"not found ({code})",
                     f"check the endpoint URL {where} (it usually ends in /v1) and the model name {model!r}")
    if is_context_length(status, message, code):
        return error("context_length", f"the request is longer than the endpoint accepts ({code})",
                     "lower 'context tokens' in cloud settings")
    if status == 429:
        return error("rate_limited", f"the endpoint is rate-limiting requests ({code}, {attempts} attempts){extra}",
                     "wait a minute and ask again, or check your plan's limits")
    if 500 <= status < 600:
        return error("server", f"the endpoint has a server error ({code}, {attempts} attempts){extra}", "try again later")
    return error("bad_request", f"the endpoint rejected the request ({code})",
                 f"check the model name {model!r} and cloud settings")


def is_context_length(status: int, message: str, code: str = "") -> bool:
    """Whether an error response says the request exceeds the model's context: 413, or any other
    client or server error (llama.cpp once answered 500) whose code or words say so. Such a request
    fails the same way every time, so it is never retried. 401/403/404/429 keep their meaning."""
    if status == 413:
        return True
    if status in (401, 403, 404, 429) or status < 400:
        return False
    return code.lower() in _CONTEXT_CODES or _CONTEXT_LENGTH.search(message) is not None


def server_code(body: bytes | None) -> str:
    """`error.code` (else `error.type`) of an OpenAI-style error body, "" when there is none."""
    try:
        data = json.loads((body or b"").decode("utf-8", errors="replace"))
    except ValueError:
        return ""
    if isinstance(data, list) and data:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ""
    value = error.get("code") or error.get("type") or ""
    return value if isinstance(value, str) else ""


def network_error(exc: BaseException, *, url: str, where: str, connect_timeout_s: float, read_timeout_s: float) -> CloudError:
    """The CloudError for a request that got no HTTP response: TLS verification, connect or read
    timeout, DNS failure, refused or reset connection. Names hosts and exception types only."""
    parts = urllib.parse.urlsplit(url)
    host, netloc = parts.hostname or "?", parts.netloc.rpartition("@")[2]
    chain = _causes(exc)
    verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if verify is not None or isinstance(exc, requests.exceptions.SSLError):
        reason = getattr(verify, "verify_message", None) or "TLS handshake failed"
        return CloudError(f"cannot verify the TLS certificate of {host} ({reason}): nothing was sent; "
                          "the server needs a certificate your system trusts", kind="tls")
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return CloudError(f"no connection to {netloc} within {connect_timeout_s:g} s: check the URL, your network and any proxy",
                          kind="timeout")
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return CloudError(f"the endpoint {where} sent no answer within {read_timeout_s:g} s: it may be busy; "
                          "try again or raise the read timeout in cloud settings", kind="timeout")
    if any(isinstance(e, (socket.gaierror, urllib3.exceptions.NameResolutionError)) for e in chain):
        return CloudError(f"cannot find the host {host!r} (DNS lookup failed): check the endpoint URL and your network connection",
                          kind="dns")
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return CloudError(f"connection refused by {netloc}: is the server running and listening on that port?", kind="connection")
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, urllib3.exceptions.LocationParseError)):
        return CloudError(f"the endpoint URL {where} is not valid: enter e.g. https://api.example.com/v1", kind="config")
    return CloudError(f"cannot reach the endpoint {where} ({type(chain[-1]).__name__}): check the URL and your network",
                      kind="connection")


def server_message(body: bytes | None) -> str:
    """The server's own words from an error body: OpenAI's `{"error": {"message"}}` (Gemini's in a
    list), FastAPI's `{"detail"}`, or the text with HTML tags removed; one line, at most 300
    characters, redacted."""
    if not body:
        return ""
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    message = ""
    if isinstance(data, list) and data and isinstance(data[0], dict):
        data = data[0]  # Gemini's OpenAI-compatible layer wraps the error object in a list
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail") or error.get("code") or ""
        elif isinstance(error, str):
            message = error
    elif data is None:
        message = re.sub(r"<[^>]*>", " ", text)
    return redact(" ".join(str(message).split())[:300])


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and everything it wraps (cause, context, urllib3's `.reason`, exceptions in args)."""
    seen: list[BaseException] = []
    todo: list[object] = [exc]
    while todo:
        current = todo.pop(0)
        if not isinstance(current, BaseException) or any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
    return seen
