"""Streaming client for OpenAI-compatible Chat Completions endpoints, on `requests`.

Protocol: `POST {base_url}/chat/completions` with a JSON body
`{"model", "messages", "stream": true, "stream_options": {"include_usage": true}, "temperature",
"max_tokens"}` (OpenAI API reference, "Create chat completion", streaming). The answer arrives as
server-sent events (W3C EventSource format, `engine.cloud.sse`): each `data:` line holds a
`chat.completion.chunk` whose `choices[0].delta.content` is the next piece of text and whose
`choices[0].finish_reason` ends it; with `include_usage` a last chunk with empty `choices` carries
`usage`; `data: [DONE]` closes the stream. vLLM, llama.cpp's server, Ollama and hosted providers
speak this. A server that ignores `stream` and answers with one `chat.completion` JSON object is
accepted too.

Behaviour:
- Timeouts (`RequestLimits`): `connect_timeout_s` to open the connection, `read_timeout_s` of
  silence between bytes, and `total_timeout_s` for the whole answer, because keep-alive comments reset the read timeout
  and a server may send them forever. Once `finish_reason` and `usage` (if asked for) arrived,
  the answer is complete and the call returns without waiting for `[DONE]` or the server's close.
- Tolerated quirks: `"choices": null` (a usage-only chunk) and `data: null` events are skipped;
  `"finish_reason": ""` means "not finished" (Ollama, SGLang: B13); every provider's finish value
  has its meaning (`engine.cloud.finish`).
- Reasoning is kept apart from the answer (B16, B18): `delta.reasoning_content` (DeepSeek, vLLM,
  SGLang, llama.cpp), `delta.reasoning` (OpenRouter, Ollama, newer vLLM), `thinking` parts of a
  `content` list (Mistral Magistral) and leading `<think>…</think>` in the text
  (`engine.reasoning`) go to `reasoning`, never to `on_text`.
- Retries: on 429 and 5xx, up to `max_retries` more attempts, waiting what `retry-after-ms`,
  `x-ms-retry-after-ms` (milliseconds; OpenAI, Azure) or `Retry-After` (seconds or an HTTP date)
  asks, or else `backoff_s · 2^attempt`; no jitter, since a desktop app sends one request at a
  time. A wait longer than `max_wait_s` is not waited: the error says so.
- Compression: `identity` is asked for; a gzip/deflate event stream is decoded anyway, any other
  `Content-Encoding` is reported by name.
- Cancel: a watcher thread shuts down the request's sockets when the `cancel` event is set, which
  wakes a read blocked on the network at once (closing a socket from another thread would not).
- No redirects are followed (an API endpoint that redirects is misconfigured, and following it
  could carry the key elsewhere); HTTPS certificates are always verified.
- The key goes in an auth object, so requests never substitutes credentials from ~/.netrc.
"""

from __future__ import annotations

import email.utils
import http
import http.client
import json
import logging
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
import urllib3.exceptions

from engine.cloud.errors import (
    CloudError, is_context_length, network_error, register_secret, server_code, server_message, status_error,
)
from engine.cloud.finish import Finish, parse_finish
from engine.cloud.sse import SseEvent, SseFormatError, SseParser
from engine.cloud.transport import BearerAuth, SocketTracker, TrackingAdapter, watch_cancel
from engine.reasoning import ReasoningSplitter, split_reasoning

log = logging.getLogger("engine.cloud")

MAX_RETRIES = 3            # attempts after the first, on 429 and 5xx
BACKOFF_S = 0.5            # first wait without Retry-After; doubles each attempt (0.5, 1, 2 s)
MAX_WAIT_S = 30.0          # a Retry-After longer than this is reported, not waited
READ_CHUNK_BYTES = 16 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
TOTAL_TIMEOUT_S = 600.0    # longest whole answer; keep-alives reset only the read timeout
FINISH_GRACE_S = 2.0       # after finish_reason, how long to wait for the usage chunk
_DECODED_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})  # what urllib3 decodes here


@dataclass(frozen=True)
class RequestLimits:
    """How long one completion may take and how often its request is tried again.

    connect_timeout_s: to open the connection. read_timeout_s: of silence between bytes.
    total_timeout_s: for the whole answer (keep-alive comments reset only the read timeout).
    max_retries: attempts after the first, on 429 and 5xx. backoff_s: the first wait when the
    server names none, doubling each attempt. max_wait_s: a longer wait the server asks for is
    reported, not waited.
    """

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    total_timeout_s: float = TOTAL_TIMEOUT_S
    max_retries: int = MAX_RETRIES
    backoff_s: float = BACKOFF_S
    max_wait_s: float = MAX_WAIT_S


@dataclass(frozen=True)
class CloudUsage:
    """Token counts reported by the endpoint (`usage` of the last chunk); None where not given."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass
class StreamResult:
    """What one streamed completion produced.

    text: the answer. reasoning: what the model reasoned before it ("" when nothing was sent).
    finish_reason: the endpoint's own word (None: none arrived); finish: its meaning.
    complete: `[DONE]` or a finish_reason arrived. cancelled: the cancel event stopped it.
    cut_reason: why it ended early (one line), when neither complete nor cancelled.
    time_to_first_token_s / last_token_s: seconds from the call to the first / last piece of the
    answer or its reasoning (the endpoint's completion tokens count both).
    attempts: HTTP requests made (retries included).
    """

    text: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    finish: Finish | None = None
    model: str | None = None
    usage: CloudUsage | None = None
    complete: bool = False
    cancelled: bool = False
    cut_reason: str | None = None
    time_to_first_token_s: float | None = None
    last_token_s: float | None = None
    attempts: int = 0
    _pieces: list[str] = field(default_factory=list, repr=False)
    _thoughts: list[str] = field(default_factory=list, repr=False)
    _splitter: ReasoningSplitter = field(default_factory=ReasoningSplitter, repr=False)


def completions_url(base_url: str) -> str:
    """`{base_url}/chat/completions`, keeping a query string (e.g. `?api-version=`) in place.

    A base URL that already ends in /chat/completions is used as is.
    """
    parts = urllib.parse.urlsplit(base_url.strip())
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def display_url(base_url: str) -> str:
    """The base URL as shown to the user and recorded in answers: no user:password@, no query."""
    parts = urllib.parse.urlsplit(base_url.strip())
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def wait_asked_s(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429/503 response asks to wait: `retry-after-ms`, `x-ms-retry-after-ms`
    (milliseconds, finer than and preferred to) `Retry-After`; None when none is usable."""
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        try:
            millis = float(headers.get(name) or "nan")
        except ValueError:
            continue
        if math.isfinite(millis):
            return max(0.0, millis / 1000)
    return retry_after_s(headers.get("Retry-After"))


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header (RFC 9110 §10.2.3: seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def stream_chat_completion(
    base_url: str,
    payload: dict,
    *,
    api_key: str | None = None,
    limits: RequestLimits = RequestLimits(),
    on_text: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> StreamResult:
    """POST `payload` to `{base_url}/chat/completions` and stream the answer's text to `on_text`.

    `payload` is the Chat Completions request body; `stream` is forced on. `limits`: timeouts and
    retries (`RequestLimits`). Returns a StreamResult;
    a stream that ends early (connection cut, read timeout mid-stream, `limits.total_timeout_s` seconds
    since the call) is returned with `cut_reason` set and whatever text arrived, and a cancelled
    one with `cancelled=True`.
    Raises CloudError for every failure before the first byte of the answer, for an error event or
    malformed data in the stream (with `partial_text`), and when a 429/5xx persists after retries.
    """
    api_key = _checked_key(api_key)
    register_secret(api_key)
    for secret in _url_secrets(base_url):
        register_secret(secret)
    url, where = completions_url(base_url), display_url(base_url)
    tracker = SocketTracker()
    session = requests.Session()
    adapter = TrackingAdapter(tracker)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    finished = threading.Event()
    watcher = None
    if cancel is not None:
        watcher = threading.Thread(target=watch_cancel, args=(cancel, finished, tracker), name="halaman-cloud-cancel", daemon=True)
        watcher.start()
    exchange = _Exchange(session, url, where, dict(payload, stream=True), BearerAuth(api_key), limits, cancel, on_text)
    result = exchange.result
    try:
        response = exchange.send()
        if response is None:
            result.cancelled = True
        else:
            with response:
                exchange.read(response)
    finally:
        finished.set()
        session.close()
        if watcher is not None:
            watcher.join(timeout=1.0)
    answer, thought = result._splitter.close()
    split = split_reasoning("".join(result._pieces) + answer)  # a </think> the template opened
    result.text = split.answer
    result.reasoning = "\n\n".join(p for p in ("".join(result._thoughts + [thought]).strip(), split.reasoning) if p)
    result.complete = result.complete or result.finish is not None
    if result.cancelled or result.complete:
        result.cut_reason = None
    return result


class _Exchange:
    """One request with its retries, and the reading of its body. Not reusable."""

    def __init__(self, session, url, where, body, auth, limits: RequestLimits, cancel, on_text) -> None:
        self.session, self.url, self.where, self.body, self.auth = session, url, where, body, auth
        self.limits, self.cancel, self.on_text = limits, cancel, on_text
        self.result = StreamResult()
        self.timeout = (limits.connect_timeout_s, limits.read_timeout_s)
        self.began = time.perf_counter()
        self.deadline = self.began + limits.total_timeout_s  # perf_counter() time after which the answer is cut
        # stream_options.include_usage: wait for the usage chunk
        self.wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.finished_at: float | None = None  # perf_counter() time finish_reason arrived

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    # ------------------------------------------------------------ request
    def send(self) -> requests.Response | None:
        """The 2xx response, or None when cancelled. Raises CloudError."""
        retries, adjusted = 0, set()
        max_retries, backoff_s, max_wait_s = self.limits.max_retries, self.limits.backoff_s, self.limits.max_wait_s
        while True:
            if self.cancelled():
                return None
            self.result.attempts += 1
            log.debug("POST %s/chat/completions (attempt %d)", self.where, self.result.attempts)
            response, error = None, None
            try:
                response = self.session.post(
                    self.url, data=json.dumps(self.body).encode("utf-8"), headers=_HEADERS, auth=self.auth,
                    timeout=self.timeout, stream=True, allow_redirects=False, verify=True,
                )
            except (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
                error = network_error(exc, url=self.url, where=self.where, connect_timeout_s=self.timeout[0], read_timeout_s=self.timeout[1])
            if error is not None:  # raised here, outside `except`, so it chains nothing that holds the request
                if self.cancelled():
                    return None
                raise error
            status = response.status_code
            if 200 <= status < 300:
                return response
            error_body = _read_limited(response, MAX_ERROR_BODY_BYTES, quiet=True)
            message, code = server_message(error_body), server_code(error_body)
            retry_after = wait_asked_s(response.headers)
            location = response.headers.get("Location", "")
            response.close()
            changed = _adjust_for_endpoint(self.body, status, message, adjusted)
            if changed is not None:
                log.info("endpoint rejected %s; retrying without it", changed)
                continue
            if is_context_length(status, message, code):  # the same request fails the same way: no retry
                raise self._status_error(status, message, code=code)
            if (status == 429 or 500 <= status < 600) and retries < max_retries:
                wait = retry_after if retry_after is not None else backoff_s * 2**retries
                if wait > max_wait_s:
                    raise self._status_error(status, message, f"; it asks to wait {wait:.0f} s before trying again")
                log.info("endpoint answered %d; retrying in %.1f s", status, wait)
                retries += 1
                if self.cancel is not None and self.cancel.wait(wait):
                    return None
                if self.cancel is None:
                    time.sleep(wait)
                continue
            if 300 <= status < 400:
                raise CloudError(
                    f"the endpoint redirected ({status}) to {display_url(location) or 'another address'}: "
                    "enter the final URL in cloud settings (Halaman does not follow redirects with your key)",
                    kind="protocol", status=status)
            raise self._status_error(status, message)

    def _status_error(self, status: int, message: str, extra: str = "", code: str = "") -> CloudError:
        return status_error(status, message, where=self.where, model=str(self.body.get("model", "")),
                            has_key=self.auth.has_key, attempts=self.result.attempts, extra=extra, code=code)

    # --------------------------------------------------------------- body
    def read(self, response: requests.Response) -> None:
        content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            self._read_json(response)
        elif content_type in ("text/event-stream", ""):
            self._read_events(response)
        else:
            raise CloudError(f"the endpoint answered with {content_type}, not a Chat Completions stream: "
                             f"check that {self.where} is an OpenAI-compatible API URL (it usually ends in /v1)",
                             kind="protocol", status=response.status_code)

    def _read_events(self, response: requests.Response) -> None:
        parser, result = SseParser(), self.result
        encoding = response.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in _DECODED_ENCODINGS:
            raise CloudError(f"the endpoint compressed its event stream ({encoding}), which Halaman cannot decode: "
                             "turn response compression off for this API in the server or proxy",
                             kind="protocol", status=response.status_code)
        while True:
            error = None
            try:
                # What has arrived, without waiting to fill the chunk; decoded, because requests
                # leaves raw bytes compressed and a gzip stream would otherwise look empty.
                chunk = response.raw.read1(READ_CHUNK_BYTES, decode_content=True)
            except urllib3.exceptions.DecodeError:
                raise CloudError(f"the endpoint's compressed ({encoding}) event stream is corrupt: "
                                 "turn response compression off for this API", kind="protocol",
                                 partial_text=self._text()) from None
            except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
                chunk, error = b"", exc
            if self.cancelled():
                result.cancelled = True
                return
            if error is not None:
                timed_out = isinstance(error, (urllib3.exceptions.ReadTimeoutError, TimeoutError, socket.timeout))
                result.cut_reason = (f"the endpoint sent nothing for {self.timeout[1]:g} s" if timed_out
                                     else "the connection was closed in the middle of the answer")
                return
            if not chunk:
                if not result.complete and result.finish is None:
                    result.cut_reason = "the endpoint closed the stream before the answer was finished"
                return
            try:
                events = parser.feed(chunk)
            except SseFormatError as exc:
                raise CloudError(f"the endpoint sent a malformed event stream ({exc})", kind="protocol", partial_text=self._text()) from None
            for event in events:
                if self._event(event):
                    return
            if self._answer_over():
                return

    def _answer_over(self) -> bool:
        """Whether to stop reading although the server has not closed the stream: the answer is
        finished (and its usage arrived, or did not within FINISH_GRACE_S), or the total time is up."""
        result, now = self.result, time.perf_counter()
        if result.finish is not None:
            if self.finished_at is None:
                self.finished_at = now
            if result.usage is not None or not self.wants_usage or now - self.finished_at > FINISH_GRACE_S:
                return True
        if now > self.deadline:
            result.cut_reason = f"the answer took longer than {self.deadline - self.began:g} s in all"
            return True
        return False

    def _event(self, event: SseEvent) -> bool:
        """Apply one event; True at `[DONE]`."""
        data = event.data.strip()
        if not data:
            return False
        if data == "[DONE]":
            self.result.complete = True
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if data == "null":
            return False  # some proxies send `data: null` between chunks: nothing in it
        if not isinstance(chunk, dict):
            raise CloudError(f"the endpoint sent a malformed stream event (not a JSON object: {data[:60]!r}): "
                             "is this an OpenAI-compatible endpoint?", kind="protocol", partial_text=self._text())
        if event.event == "error" or "error" in chunk:
            raw = json.dumps(chunk).encode()
            message = server_message(raw)
            if is_context_length(400, message, server_code(raw)):  # an event has no status: its words decide
                raise CloudError(f"the request is longer than the endpoint accepts — the server says: {message[:200]}: "
                                 "lower 'context tokens' in cloud settings", kind="context_length", partial_text=self._text())
            raise CloudError(f"the endpoint reported an error during the answer: {message}",
                             kind="server", partial_text=self._text())
        self._apply(chunk, "delta")
        return False

    def _apply(self, chunk: dict, key: str) -> None:
        """Take model, usage, text and finish_reason from a chunk (`key` "delta") or a whole
        completion (`key` "message")."""
        result = self.result
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            result.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            result.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []  # null in usage-only chunks of some servers
        if not isinstance(choices, list):
            raise CloudError("the endpoint sent a malformed chunk ('choices' is not a list)", kind="protocol", partial_text=self._text())
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n = 1: only choice 0 is ours
            part = choice.get(key) or {}
            if not isinstance(part, dict):
                raise CloudError(f"the endpoint sent a malformed chunk ('{key}' is not an object)", kind="protocol",
                                 partial_text=self._text())
            answer, thought = _content(part.get("content"), self._text)
            thought += "".join(part[name] for name in _REASONING_FIELDS if isinstance(part.get(name), str))
            shown, hidden = result._splitter.feed(answer) if answer else ("", "")
            if shown or hidden or thought:
                now = time.perf_counter() - self.began
                if result.time_to_first_token_s is None:
                    result.time_to_first_token_s = now
                result.last_token_s = now
            result._thoughts += [t for t in (hidden, thought) if t]
            if shown:
                result._pieces.append(shown)
                if self.on_text is not None:
                    self.on_text(shown)
            finish = parse_finish(choice.get("finish_reason"))
            if finish is not None:
                result.finish, result.finish_reason = finish, str(choice["finish_reason"])

    def _read_json(self, response: requests.Response) -> None:
        body = _read_limited(response, MAX_JSON_BODY_BYTES)
        if body is None:
            if self.cancelled():
                self.result.cancelled = True
                return
            raise CloudError(f"the connection to {self.where} broke while the answer was read: try again", kind="connection")
        try:
            completion = json.loads(body)
        except ValueError:
            completion = None
        if not isinstance(completion, dict):
            raise CloudError("the endpoint answered with malformed JSON: is this an OpenAI-compatible endpoint?", kind="protocol")
        if "error" in completion:
            raise CloudError(f"the endpoint reported an error: {server_message(body)}", kind="server")
        self._apply(completion, "message")
        self.result.complete = True

    def _text(self) -> str:
        return "".join(self.result._pieces)


# ------------------------------------------------------------------ helpers
_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream, application/json",
    "Accept-Encoding": "identity",  # compressed SSE would be buffered by the decoder, delaying tokens
    "User-Agent": "halaman",
}


def _checked_key(api_key: str | None) -> str | None:
    """The key stripped; a key with inner whitespace or control characters would be echoed by
    http.client's header check, so it is refused here with a message that does not show it."""
    if api_key is None:
        return None
    key = api_key.strip()
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        register_secret(api_key)
        raise CloudError("the stored API key contains spaces or line breaks: store it again in cloud settings", kind="config")
    return key or None


def _url_secrets(base_url: str) -> list[str]:
    """Credentials written into the URL (user:password@, ?key=...): redacted like the key."""
    parts = urllib.parse.urlsplit(base_url)
    found = [s for s in (parts.password, parts.username) if s]
    found += [v for _k, v in urllib.parse.parse_qsl(parts.query) if len(v) >= 16]
    return found


def _read_limited(response: requests.Response, limit: int, *, quiet: bool = False) -> bytes | None:
    """Up to `limit` bytes of the body; None (or b"" when `quiet`) if reading failed."""
    try:
        return response.raw.read(limit, decode_content=True) or b""
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError):
        return b"" if quiet else None


def _adjust_for_endpoint(body: dict, status: int, message: str, adjusted: set[str]) -> str | None:
    """Drop what an older or stricter endpoint rejects with a 400 naming it, once each:
    `stream_options` (usage is then unknown) and `max_tokens` (renamed `max_completion_tokens`)."""
    if status != 400:
        return None
    if "stream_options" in message and "stream_options" in body and "stream_options" not in adjusted:
        adjusted.add("stream_options")
        del body["stream_options"]
        return "stream_options"
    if "max_completion_tokens" in message and "max_tokens" in body and "max_tokens" not in adjusted:
        adjusted.add("max_tokens")
        body["max_completion_tokens"] = body.pop("max_tokens")
        return "max_tokens"
    return None


_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
"""Where servers put reasoning beside `content`: DeepSeek, vLLM, SGLang and llama.cpp use
`reasoning_content`; OpenRouter, Ollama and vLLM >= 0.10 `reasoning`; some proxies `thinking`."""


def _content(content: object, partial: Callable[[], str]) -> tuple[str, str]:
    """(answer text, reasoning text) of a `content` value: a string, or a list of typed parts
    (Mistral: `{"type": "text", "text"}` and `{"type": "thinking", "thinking": [parts] | str}`;
    B16). Other part types (images, references) carry no answer text and are skipped.
    Raises CloudError for content that is neither."""
    if content is None:
        return "", ""
    if isinstance(content, str):
        return content, ""
    if not isinstance(content, list):
        raise CloudError("the endpoint sent a malformed chunk (content is neither text nor a list of parts)",
                         kind="protocol", partial_text=partial())
    answer, thought = [], []
    for item in content:
        if isinstance(item, str):
            answer.append(item)
        elif isinstance(item, dict):
            kind = item.get("type")
            if kind == "text" and isinstance(item.get("text"), str):
                answer.append(item["text"])
            elif kind in ("thinking", "reasoning"):
                inner = item.get(kind, item.get("text"))
                thought.append(inner if isinstance(inner, str) else _content(inner, partial)[0])
    return "".join(answer), "".join(thought)


def _usage(data: dict) -> CloudUsage:
    def number(name: str) -> int | None:
        value = data.get(name)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return CloudUsage(number("prompt_tokens"), number("completion_tokens"), number("total_tokens"))
