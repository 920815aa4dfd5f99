"""The Chat Completions client against a real HTTP server on 127.0.0.1: streaming SSE, errors,
retries, timeouts, cancel, cut streams, TLS, and the API key kept out of errors and logs."""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from cloud_server import PIECES, USAGE, CloudServer, self_signed_context

from engine.cloud import client
from engine.cloud.client import RequestLimits, completions_url, display_url, retry_after_s, stream_chat_completion
from engine.cloud.errors import CloudError
from engine.cloud.sse import SseEvent, SseParser

KEY = "sk-test-5f1d9c0e7a2b4c6d8e0f1a2b3c4d5e6f"
MESSAGES = [{"role": "system", "content": "Document: ..."}, {"role": "user", "content": "What is the answer?"}]


@pytest.fixture
def server():
    with CloudServer() as running:
        yield running


def payload(model: str, **extra) -> dict:
    return {"model": model, "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0.2, "max_tokens": 64, **extra}


def stream(server, model, **kwargs):
    """`stream_chat_completion` with `RequestLimits` fields among `kwargs`."""
    limits = {name: kwargs.pop(name) for name in list(kwargs) if name in RequestLimits.__dataclass_fields__}
    limits = RequestLimits(**{"read_timeout_s": 10.0, "connect_timeout_s": 5.0, **limits})
    return stream_chat_completion(server.base_url, payload(model), limits=limits, **kwargs)


def fails(server, model, **kwargs) -> CloudError:
    with pytest.raises(CloudError) as info:
        stream(server, model, **kwargs)
    return info.value


# ------------------------------------------------------------------------ SSE format
def test_sse_parser_handles_any_split_line_ends_comments_and_multiline_data():
    raw = (b"\xef\xbb\xbf: comment\r\ndata: one\r\n\r\nevent: error\ndata: a\ndata:b\n\nid: 7\rdata:  two spaces\r\r"
           b"data: no blank line at the end")
    expected = [SseEvent("one"), SseEvent("a\nb", event="error"), SseEvent(" two spaces", id="7")]
    assert SseParser().feed(raw) == expected  # the unterminated last event is discarded (W3C)
    for size in (1, 2, 3, 5):  # byte by byte, CR and LF of one CRLF in different chunks
        parser = SseParser()
        events = [e for i in range(0, len(raw), size) for e in parser.feed(raw[i:i + size])]
        assert events == expected, size


def test_urls():
    assert completions_url("https://api.example.com/v1/") == "https://api.example.com/v1/chat/completions"
    assert completions_url("https://h/openai/v1?api-version=2024") == "https://h/openai/v1/chat/completions?api-version=2024"
    assert completions_url("http://h:8000/v1/chat/completions") == "http://h:8000/v1/chat/completions"
    assert display_url("https://user:secret@h:8443/v1/?key=abc") == "https://h:8443/v1"
    assert display_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"


def test_retry_after_seconds_and_http_date():
    assert retry_after_s("3") == 3.0 and retry_after_s("0.5") == 0.5 and retry_after_s(None) is None
    assert retry_after_s("soon") is None and retry_after_s("-4") == 0.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 110 < retry_after_s(later) <= 120


# ------------------------------------------------------------------------ streaming
def test_streams_pieces_in_order_with_usage_model_and_the_request_as_sent(server):
    pieces = []
    result = stream(server, "ok", on_text=pieces.append, api_key=KEY)
    assert pieces == PIECES and result.text == "".join(PIECES)
    assert result.complete and result.finish_reason == "stop" and result.cut_reason is None
    assert result.usage == client.CloudUsage(**USAGE) and result.model == "served-model"
    assert result.attempts == 1 and 0 < result.time_to_first_token_s <= result.last_token_s
    sent = server.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == f"Bearer {KEY}"
    assert sent["body"]["stream"] is True and sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["messages"] == MESSAGES and sent["body"]["max_tokens"] == 64


def test_no_key_sends_no_authorization_header(server):
    stream(server, "ok")
    assert "Authorization" not in server.requests[0]["headers"]


def test_crlf_split_events_and_multiline_data(server):
    result = stream(server, "crlf")
    assert result.text == "".join(PIECES) and result.complete and result.finish_reason == "stop"


def test_non_streaming_json_answer_is_accepted(server):
    pieces = []
    result = stream(server, "json", on_text=pieces.append)
    assert pieces == ["".join(PIECES)] and result.complete and result.usage.total_tokens == USAGE["total_tokens"]


def test_endpoint_without_stream_options_is_asked_again_without_them(server):
    result = stream(server, "strict")
    assert result.text == "".join(PIECES) and result.usage is None
    assert [("stream_options" in r["body"]) for r in server.requests] == [True, False]


def test_finish_reason_length(server):
    assert stream(server, "length").finish_reason == "length"


# ------------------------------------------------------------------------ errors
@pytest.mark.parametrize("model,kind,status,words", [
    ("missing-model", "not_found", 404, "check the endpoint URL"),
    ("forbidden", "auth", 403, "permissions"),
    ("context-400", "context_length", 400, "context tokens"),
    ("bad-400", "bad_request", 400, "temperature must be at most 2"),
    ("html", "protocol", 200, "text/html"),
    ("redirect", "protocol", 307, "does not follow redirects"),
])
def test_http_errors_are_one_clear_line(server, model, kind, status, words):
    error = fails(server, model)
    assert (error.kind, error.status) == (kind, status)
    assert words in str(error) and "\n" not in str(error)
    assert len(server.requests) == 1  # not retried


def test_wrong_path_is_404_naming_the_url(server):
    with pytest.raises(CloudError) as info:
        stream_chat_completion(server.base_url.removesuffix("/v1"), payload("ok"))
    assert info.value.kind == "not_found" and "usually ends in /v1" in str(info.value)


def test_401_without_and_with_a_key():
    with CloudServer(expected_key=KEY) as guarded:
        missing = fails(guarded, "ok")
        assert missing.kind == "auth" and "none is stored" in str(missing)
        wrong = fails(guarded, "ok", api_key=KEY[:-4] + "XXXX")
        assert wrong.kind == "auth" and "rejected the API key" in str(wrong)
        assert stream(guarded, "ok", api_key=KEY).text == "".join(PIECES)


def test_retry_honours_retry_after(server):
    began = time.monotonic()
    result = stream(server, "retry-429", backoff_s=0.05)
    elapsed = time.monotonic() - began
    assert result.text == "".join(PIECES) and result.attempts == 2
    assert 1.0 <= elapsed < 2.5  # the server asked for 1 s; the backoff alone would be 0.05 s


def test_500_then_success_backs_off_exponentially(server):
    began = time.monotonic()
    result = stream(server, "retry-500", backoff_s=0.3)
    assert result.attempts == 2 and result.complete and 0.3 <= time.monotonic() - began < 1.5


def test_persistent_503_gives_up_after_the_retries(server):
    began = time.monotonic()
    error = fails(server, "down-503", max_retries=3, backoff_s=0.05)
    assert (error.kind, error.status) == ("server", 503) and "4 attempts" in str(error)
    assert server.counts["down-503"] == 4
    assert 0.35 <= time.monotonic() - began < 2.0  # 0.05 + 0.1 + 0.2


def test_a_retry_after_longer_than_we_wait_is_reported_not_waited(server):
    began = time.monotonic()
    error = fails(server, "wait-an-hour")
    assert error.kind == "rate_limited" and "3600 s" in str(error) and time.monotonic() - began < 1.0


def test_connection_refused_and_dns_failure():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(CloudError) as refused:
        stream_chat_completion(f"http://127.0.0.1:{port}/v1", payload("ok"), limits=RequestLimits(connect_timeout_s=2))
    assert refused.value.kind == "connection" and "refused" in str(refused.value)
    with pytest.raises(CloudError) as unknown:
        stream_chat_completion("https://halaman-test.invalid/v1", payload("ok"), limits=RequestLimits(connect_timeout_s=2))
    assert unknown.value.kind == "dns" and "halaman-test.invalid" in str(unknown.value)


def test_certificates_are_verified(tmp_path):
    with CloudServer(tls=self_signed_context(tmp_path)) as tls_server:
        error = fails(tls_server, "ok", api_key=KEY)
    assert error.kind == "tls" and "certificate" in str(error)
    assert tls_server.requests == []  # the request (and its key) never went out


# ------------------------------------------------------------------------ timeouts, cut, cancel
def test_read_timeout_before_any_answer(server):
    began = time.monotonic()
    error = fails(server, "hang", read_timeout_s=0.5)
    assert error.kind == "timeout" and "0.5 s" in str(error) and time.monotonic() - began < 2.0


def test_read_timeout_mid_stream_keeps_what_arrived(server):
    result = stream(server, "stall", read_timeout_s=0.5)
    assert result.text == PIECES[0] + PIECES[1] and not result.complete
    assert "sent nothing for 0.5 s" in result.cut_reason


@pytest.mark.parametrize("model", ["cut", "cut-eof"])
def test_cut_stream_keeps_what_arrived(server, model):
    pieces = []
    result = stream(server, model, on_text=pieces.append)
    assert result.text == PIECES[0] + PIECES[1] == "".join(pieces)
    assert not result.complete and not result.cancelled and result.cut_reason


def test_malformed_event_raises_with_the_partial_text(server):
    error = fails(server, "malformed")
    assert error.kind == "protocol" and "not a JSON object" in str(error)
    assert error.partial_text == PIECES[0]


def test_error_event_mid_stream(server):
    error = fails(server, "error-event")
    assert error.kind == "server" and "overloaded" in str(error) and error.partial_text == PIECES[0]


@pytest.mark.parametrize("model", ["slow", "hang"])
def test_cancel_closes_the_connection_promptly(server, model):
    """`slow`: cancelled while a read waits for the next piece (5 s away); `hang`: while waiting
    for the response headers. Either way the call returns at once and the server sees the close."""
    cancel = threading.Event()
    pieces = []
    threading.Timer(0.5, cancel.set).start()
    began = time.monotonic()
    result = stream(server, model, cancel=cancel, on_text=pieces.append)
    returned = time.monotonic() - began
    assert result.cancelled and not result.complete and result.cut_reason is None
    assert returned < 1.5  # 0.5 s until the cancel, then well under a second
    assert result.text == (PIECES[0] if model == "slow" else "") == "".join(pieces)
    assert server.closed.wait(2.0), "the server never saw the connection close"
    assert server.closed_at - began < 2.0


def test_cancel_during_retry_wait(server):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    began = time.monotonic()
    result = stream(server, "down-503", cancel=cancel, backoff_s=5.0)
    assert result.cancelled and time.monotonic() - began < 1.5 and server.counts["down-503"] == 1


# ------------------------------------------------------------------------ the key stays secret
@pytest.mark.parametrize("model", ["ok", "echo-key", "cut", "malformed", "down-503", "refused", "key-in-url"])
def test_api_key_never_in_logs_or_errors(server, caplog, model):
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's included
    if model == "echo-key":  # the server quotes the key it got, as OpenAI's 401 does
        with CloudServer(expected_key="another-key") as echo:
            error = fails(echo, "ok", api_key=KEY, backoff_s=0.01)
    elif model == "key-in-url":  # some gateways take the key as a query parameter; urllib3 logs the path
        error = None
        stream_chat_completion(f"{server.base_url}?key={KEY}", payload("ok"))
        assert "?key=[redacted]" in caplog.text
    elif model == "refused":
        with pytest.raises(CloudError) as info:
            stream_chat_completion(f"http://{KEY}:{KEY}@127.0.0.1:9/v1?key={KEY}", payload("ok"), api_key=KEY)
        error = info.value
    else:
        error = None
        try:
            stream(server, model, api_key=KEY, backoff_s=0.01)
        except CloudError as exc:
            error = exc
    if model != "refused":
        assert "urllib3.connectionpool" in {r.name for r in caplog.records}  # the capture does see urllib3
    assert KEY not in caplog.text
    assert all(KEY not in r.getMessage() for r in caplog.records)
    if model in ("echo-key", "malformed", "down-503", "refused"):
        assert error is not None
        text = str(error) + repr(error) + "".join(traceback.format_exception(error)) + error.partial_text
        assert KEY not in text and KEY[-12:] not in text
        assert error.__context__ is None and error.__cause__ is None  # nothing chained that holds the request
    if model == "echo-key":
        assert "[redacted]" in str(error)


def test_key_with_a_line_break_is_refused_without_showing_it(server):
    error = fails(server, "ok", api_key=KEY + "\nX-Injected: 1")
    assert error.kind == "config" and KEY not in str(error) + repr(error)
    assert server.requests == []
