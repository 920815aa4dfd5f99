"""Real-world stream quirks (B04, B05, B09, B10 in docs/REAL_WORLD_INPUTS.md): recorded bodies
served by the real loopback server, and the answer the client must return for each."""

from __future__ import annotations

import time

import pytest
from cloud_server import PIECES, CloudServer

from engine.cloud.client import RequestLimits, stream_chat_completion, wait_asked_s
from engine.cloud.errors import CloudError

ANSWER = "The answer is forty-two."
MESSAGES = [{"role": "user", "content": "What is the answer?"}]


def ask(server: CloudServer, model: str, **kwargs):
    payload = {"model": model, "messages": MESSAGES, "stream_options": {"include_usage": True}, "max_tokens": 64}
    limits = {name: kwargs.pop(name) for name in list(kwargs) if name in RequestLimits.__dataclass_fields__}
    limits = RequestLimits(**{"read_timeout_s": 10.0, "connect_timeout_s": 5.0, **limits})
    return stream_chat_completion(server.base_url, payload, limits=limits, **kwargs)


def recorded(corpus, case: str) -> bytes:
    return next((corpus / "bugs").glob(f"{case}-*")).joinpath("stream.sse").read_bytes()


def test_b04_usage_chunk_with_null_choices_is_accepted(corpus):
    with CloudServer(replay={"b04": recorded(corpus, "B04")}) as server:
        result = ask(server, "b04")
    assert result.text == ANSWER and result.complete and result.finish_reason == "stop"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (12, 5, 17)


def test_b09_data_null_event_is_skipped(corpus):
    with CloudServer(replay={"b09": recorded(corpus, "B09")}) as server:
        result = ask(server, "b09")
    assert result.text == ANSWER and result.complete and result.cut_reason is None


def test_b05_returns_after_finish_and_usage_although_keepalives_continue(corpus):
    """No [DONE], the connection held open with a keep-alive every 0.5 s: the answer is whole once
    finish_reason and usage are in, so the call returns at once, not when the server closes."""
    with CloudServer(replay={"b05": recorded(corpus, "B05")}) as server:
        began = time.monotonic()
        result = ask(server, "b05", read_timeout_s=30.0)
        elapsed = time.monotonic() - began
        assert server.closed.wait(2.0)  # the client hung up; the server did not
    assert result.text == ANSWER and result.complete and result.usage.total_tokens == 17
    assert elapsed < 2.0


def test_b05_a_stream_of_only_keepalives_ends_at_the_total_limit():
    with CloudServer(replay={"idle": b": keep-alive\n\n" * 40}) as server:
        began = time.monotonic()
        result = ask(server, "idle", read_timeout_s=30.0, total_timeout_s=1.5)
        elapsed = time.monotonic() - began
    assert not result.complete and result.text == ""
    assert result.cut_reason == "the answer took longer than 1.5 s in all"
    assert 1.5 <= elapsed < 3.0


@pytest.mark.parametrize("header", ["retry-after-ms", "x-ms-retry-after-ms"])
def test_b10_millisecond_retry_headers_are_honoured(header):
    """429 with only `retry-after-ms: 4000` for 4 s: wait as asked and succeed on attempt 2."""
    with CloudServer() as server:
        began = time.monotonic()
        result = ask(server, header)
        elapsed = time.monotonic() - began
    assert result.text == "".join(PIECES) and result.complete
    assert result.attempts == 2 and elapsed >= 4.0


def test_wait_asked_prefers_milliseconds_and_falls_back_to_retry_after():
    assert wait_asked_s({"retry-after-ms": "1500", "Retry-After": "9"}) == 1.5
    assert wait_asked_s({"x-ms-retry-after-ms": "250"}) == 0.25
    assert wait_asked_s({"retry-after-ms": "soon", "Retry-After": "3"}) == 3.0
    assert wait_asked_s({}) is None


def test_gzip_event_stream_is_decoded():
    with CloudServer() as server:
        result = ask(server, "gzip")
    assert result.text == "".join(PIECES) and result.complete and result.cut_reason is None


def test_unknown_content_encoding_is_reported_as_compression():
    with CloudServer() as server, pytest.raises(CloudError) as info:
        ask(server, "brotli")
    assert str(info.value).startswith("the endpoint compressed its event stream (br), which Halaman cannot decode")
