"""Every provider's stream habits (B13, B16, B18 in docs/REAL_WORLD_INPUTS.md): finish values,
content as typed parts, reasoning apart from the answer, context-length errors in each server's
words, and a prompt the endpoint counted short. Recorded bodies and each server's own error
wording are served by the real loopback server (tests/cloud_server.py), paced as recorded."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cloud_server import CloudServer

from engine.cloud import ask_cloud
from engine.cloud.ask import outcome
from engine.cloud.client import RequestLimits, stream_chat_completion
from engine.cloud.errors import CloudError
from engine.cloud.finish import Finish, parse_finish
from engine.session import DocumentSession
from engine.settings import CachePolicy, CloudSettings, EngineSettings

MESSAGES = [{"role": "user", "content": "When does the backup run?"}]
BACKUP = ("The backup runs every night at 02:00 ; it keeps 14 daily copies , 8 weekly copies and 12 monthly "
          "copies , and a restore test is done on the first Monday of each month .")


def recorded(corpus, case: str) -> tuple[bytes, float]:
    """A corpus recording: its body and the pause between events its response.json gives."""
    folder = next((corpus / "bugs").glob(f"{case.split('/')[0]}-*")).joinpath(*case.split("/")[1:])
    return (folder / "stream.sse").read_bytes(), json.loads((folder / "response.json").read_text())["delay_s"]


def ask(server: CloudServer, model: str, **kwargs):
    payload = {"model": model, "messages": MESSAGES, "stream_options": {"include_usage": True}, "max_tokens": 512}
    limits = {name: kwargs.pop(name) for name in list(kwargs) if name in RequestLimits.__dataclass_fields__}
    limits = RequestLimits(**{"read_timeout_s": 10.0, "connect_timeout_s": 5.0, **limits})
    return stream_chat_completion(server.base_url, payload, limits=limits, **kwargs)


def sse(*chunks: dict, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def delta(finish=None, **fields) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def usage(prompt: int, completion: int) -> dict:
    return {"object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


# ------------------------------------------------------------------ B13: finish values
def test_b13_empty_finish_reason_is_not_an_end(corpus):
    """Ollama / SGLang send "finish_reason": "" on every chunk: the answer goes on to "stop"."""
    streamed = []
    with CloudServer(replay={"b13": recorded(corpus, "B13")}) as server:
        result = ask(server, "b13", on_text=streamed.append)
    assert result.text.rstrip().endswith("first Monday of each month .") and result.text.strip() == BACKUP
    assert "".join(streamed) == result.text
    assert result.finish_reason == "stop" and result.finish is Finish.STOP and result.complete
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (812, 38, 850)
    assert outcome(result, 900, 512) == ("end", None, [])


PROVIDER_VALUES = {
    # OpenAI, Azure
    "stop": Finish.STOP, "length": Finish.LENGTH, "content_filter": Finish.FILTERED,
    "tool_calls": Finish.TOOL_CALLS, "function_call": Finish.TOOL_CALLS,
    # vLLM, SGLang
    "abort": Finish.ABORTED, "error": Finish.ERROR,
    # llama.cpp (native stop_type), TGI
    "eos": Finish.STOP, "eos_token": Finish.STOP, "stop_sequence": Finish.STOP, "limit": Finish.LENGTH,
    # Mistral
    "model_length": Finish.CONTEXT,
    # Anthropic's words, as proxies pass them through
    "end_turn": Finish.STOP, "max_tokens": Finish.LENGTH, "tool_use": Finish.TOOL_CALLS,
    "pause_turn": Finish.ABORTED, "refusal": Finish.FILTERED,
    # Gemini (upper case), Cohere, DeepSeek, Ollama native
    "MAX_TOKENS": Finish.LENGTH, "SAFETY": Finish.FILTERED, "RECITATION": Finish.FILTERED, "STOP": Finish.STOP,
    "COMPLETE": Finish.STOP, "insufficient_system_resource": Finish.ABORTED, "load": Finish.ABORTED,
    # not finished yet
    "": None, None: None, "  ": None,
    # nobody's
    "banana": Finish.UNKNOWN, "OTHER": Finish.UNKNOWN, 7: Finish.UNKNOWN,
}


@pytest.mark.parametrize("raw", list(PROVIDER_VALUES), ids=[repr(v) for v in PROVIDER_VALUES])
def test_every_providers_finish_value_has_its_meaning(raw):
    assert parse_finish(raw) is PROVIDER_VALUES[raw]


EXPECTED_STOP = {Finish.STOP: "end", Finish.LENGTH: "max_tokens", Finish.CONTEXT: "max_tokens",
                 Finish.FILTERED: "cut", Finish.TOOL_CALLS: "cut", Finish.ABORTED: "cut", Finish.ERROR: "cut",
                 Finish.UNKNOWN: "cut"}
STREAMED = ["stop", "length", "model_length", "content_filter", "tool_calls", "abort", "error", "MAX_TOKENS",
            "end_turn", "banana"]


@pytest.mark.parametrize("raw", STREAMED)
def test_a_streamed_finish_value_decides_how_the_answer_ended(raw):
    """SGLang style ("" until the last chunk), then `raw`: only a normal end is "end"; an unknown
    value is reported by name as possibly incomplete, never as complete."""
    body = sse(delta("", content="The backup "), delta("", content="runs nightly."), delta(raw, content=""), usage(812, 9))
    with CloudServer(replay={"m": body}) as server:
        result = ask(server, "m")
    finish = PROVIDER_VALUES[raw]
    assert result.text == "The backup runs nightly." and result.finish is finish and result.finish_reason == raw
    stop, cut_reason, notices = outcome(result, 900, 512)
    assert stop == EXPECTED_STOP[finish]
    if stop == "cut":
        assert repr(raw) in cut_reason
    if finish is Finish.UNKNOWN:
        assert "does not know" in cut_reason and "incomplete" in cut_reason
    if stop == "max_tokens":
        assert notices and repr(raw) in notices[0]


def test_a_stream_that_only_ever_says_empty_finish_is_cut_not_complete():
    body = sse(delta("", content="The backup "), delta("", content="runs"), done=False)
    with CloudServer(replay={"m": body}) as server:
        result = ask(server, "m", total_timeout_s=2.0)
    assert result.finish is None and not result.complete and result.cut_reason
    assert outcome(result, 900, 512)[0] == "cut"


# ------------------------------------------------------------------ B16: typed content parts
def test_b16_content_parts_text_is_the_answer_thinking_is_not(corpus):
    streamed = []
    with CloudServer(replay={"b16": recorded(corpus, "B16")}) as server:
        result = ask(server, "b16", on_text=streamed.append)
    assert result.text.strip() == BACKUP and "".join(streamed) == result.text
    assert result.reasoning == "The user asks about the backup schedule; the document says nightly."
    assert result.finish is Finish.STOP


def test_content_parts_of_other_shapes():
    """Text and thinking parts in one chunk, thinking as a plain string, a reference part (Mistral
    cites with them) and a bare string item: only text is the answer."""
    body = sse(delta(content=[{"type": "thinking", "thinking": "Look at page 3. "},
                              {"type": "text", "text": "Nightly"}]),
               delta(content=[{"type": "reference", "reference_ids": [1]}, " at 02:00."]),
               delta("stop", content=[]), usage(100, 9))
    with CloudServer(replay={"m": body}) as server:
        result = ask(server, "m")
    assert result.text == "Nightly at 02:00." and result.reasoning == "Look at page 3."


def test_content_that_is_neither_text_nor_parts_is_a_protocol_error():
    with CloudServer(replay={"m": sse(delta(content={"text": "x"}))}) as server, pytest.raises(CloudError) as info:
        ask(server, "m")
    assert info.value.kind == "protocol" and "neither text nor a list of parts" in str(info.value)


# ------------------------------------------------------------------ B18: reasoning apart
def test_b18a_reasoning_only_then_length_says_the_budget_went_to_reasoning(corpus):
    with CloudServer(replay={"b18": recorded(corpus, "B18/reasoning-only")}) as server:
        result = ask(server, "b18")
    assert result.text == "" and result.reasoning.startswith("Okay , the user wants the backup schedule")
    assert result.finish is Finish.LENGTH and result.usage.completion_tokens == 512
    stop, cut_reason, notices = outcome(result, 900, 512)
    assert stop == "max_tokens" and cut_reason is None
    assert notices == ["the model spent the whole answer budget (512 tokens) reasoning and wrote no answer: "
                       "raise 'max tokens' in cloud settings (its reasoning is kept apart)"]


def test_b18b_inline_think_tags_are_not_the_answer(corpus):
    streamed = []
    with CloudServer(replay={"b18": recorded(corpus, "B18/think-tags-inline")}) as server:
        result = ask(server, "b18", on_text=streamed.append)
    assert result.text.strip() == BACKUP and "<think>" not in result.text and "Okay" not in result.text
    assert "".join(streamed) == result.text  # the monologue was never streamed as the answer
    assert result.reasoning.startswith("Okay , the user wants the backup schedule") and "</think>" not in result.reasoning


@pytest.mark.parametrize("case", ["reasoning_content", "reasoning", "split-tag", "thinking-tag", "closing-only"])
def test_reasoning_in_each_providers_shape(case):
    """DeepSeek / vLLM `reasoning_content`; OpenRouter / Ollama `reasoning`; a <think> tag cut
    between two chunks; <thinking>; only </think> (Qwen3's template opened the tag in the prompt)."""
    chunks = {
        "reasoning_content": [delta(reasoning_content="Page 3 says so."), delta(content="Nightly.")],
        "reasoning": [delta(reasoning="Page 3 says so."), delta(content="Nightly.")],
        "split-tag": [delta(content="<thi"), delta(content="nk>Page 3 says so.</th"), delta(content="ink>\n\nNightly.")],
        "thinking-tag": [delta(content="<thinking>Page 3 says so.</thinking>"), delta(content="Nightly.")],
        "closing-only": [delta(content="Page 3 says so.\n</think>\n\n"), delta(content="Nightly.")],
    }[case]
    with CloudServer(replay={"m": sse(*chunks, delta("stop", content=""), usage(100, 9))}) as server:
        result = ask(server, "m")
    assert (result.text, result.reasoning) == ("Nightly.", "Page 3 says so.")


# ------------------------------------------------------------------ context-length errors
CONTEXT_ERRORS = {
    "openai": (400, {"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages "
                                          "resulted in 20000 tokens.", "type": "invalid_request_error",
                               "code": "context_length_exceeded"}}),
    "vllm": (400, {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you "
                   "requested 5000 tokens (4488 in the messages, 512 in the completion).", "type": "BadRequestError",
                   "code": 400}),
    "vllm-decoder-prompt": (400, {"object": "error", "message": "The decoder prompt (length 5000) is longer than the "
                                  "maximum model length of 4096. Make sure that `max_model_len` is no smaller than the "
                                  "number of text tokens.", "type": "BadRequestError", "code": 400}),
    "sglang": (400, {"object": "error", "message": "The input (5000 tokens) is longer than the model's context length "
                     "(4096 tokens).", "type": "BadRequestError", "code": 400}),
    "llama.cpp": (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try "
                                  "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5000,
                                  "n_ctx": 4096}}),
    "llama.cpp-500": (500, {"error": {"code": 500, "message": "the request exceeds the available context size",
                                      "type": "server_error"}}),
    "ollama": (400, {"error": {"message": "input length exceeds the context length", "type": "invalid_request_error"}}),
    "ollama-native": (500, {"error": "input length exceeds maximum context length"}),
    "anthropic": (400, {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "prompt is too long: 215000 tokens > 200000 maximum"}}),
    "anthropic-limit": (400, {"type": "error", "error": {"type": "invalid_request_error", "message":
                              "input length and `max_tokens` exceed context limit: 197000 + 21333 > 200000, decrease "
                              "input length or `max_tokens` and try again"}}),
    "mistral": (400, {"object": "error", "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for "
                      "model with 32768 maximum context length", "type": "invalid_request_error", "code": None}),
    "gemini": (400, [{"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number "
                                "of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}]),
    "tgi": (422, {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000 "
                  "`inputs` tokens and 512 `max_new_tokens`", "error_type": "validation"}),
    "payload-413": (413, {"error": {"message": "Request Entity Too Large"}}),
}


@pytest.mark.parametrize("server_name", list(CONTEXT_ERRORS))
def test_context_length_errors_in_every_servers_words_are_recognised_and_not_retried(server_name):
    status, body = CONTEXT_ERRORS[server_name]
    with CloudServer(canned={"m": (status, json.dumps(body).encode())}) as server, pytest.raises(CloudError) as info:
        ask(server, "m", backoff_s=0.01)
    assert info.value.kind == "context_length", str(info.value)
    assert server.counts["m"] == 1  # the same request would fail the same way: never retried
    assert "lower 'context tokens' in cloud settings" in str(info.value)


@pytest.mark.parametrize("status, body, kind", [
    (400, {"error": {"message": "temperature must be at most 2", "code": "invalid_value"}}, "bad_request"),
    (429, {"error": {"message": "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 45000",
                     "code": "rate_limit_exceeded"}}, "rate_limited"),
])
def test_other_errors_keep_their_kind(status, body, kind):
    with CloudServer(canned={"m": (status, json.dumps(body).encode())}) as server, pytest.raises(CloudError) as info:
        ask(server, "m", backoff_s=0.01, max_retries=1)
    assert info.value.kind == kind


def test_a_context_length_error_event_mid_stream_is_named_as_such():
    body = sse(delta(content="The "), {"error": {"message": "This model's maximum context length is 4096 tokens.",
                                                 "code": 400}}, done=False)
    with CloudServer(replay={"m": body}) as server, pytest.raises(CloudError) as info:
        ask(server, "m")
    assert info.value.kind == "context_length" and info.value.partial_text == "The "


# ------------------------------------------------------------------ the prompt the endpoint counted
def test_far_fewer_prompt_tokens_than_planned_warn_that_the_document_was_probably_cut(corpus):
    with CloudServer(replay={"b13": recorded(corpus, "B13")}) as server:
        result = ask(server, "b13")  # usage: 812 prompt tokens
    assert outcome(result, 1_200, 512)[2] == []  # tokenizers differ; 68 % is not a cut
    notices = outcome(result, 9_000, 512)[2]
    assert len(notices) == 1 and notices[0].startswith("the endpoint counted only 812 prompt tokens of about 9,000 sent: "
                                                       "it probably cut the document")


# ------------------------------------------------------------------ through ask_cloud, on a real session
SMALL = EngineSettings(cache=CachePolicy(budget_tokens=512, window_tokens=128, residual_tokens=64, chunk_tokens=256),
                       max_new_tokens=8)


@pytest.fixture(scope="module")
def long_session(smol, tmp_path_factory):
    path = tmp_path_factory.mktemp("providers") / "policy.txt"
    path.write_text("The backup policy. " + "Each night the database is copied to the second site. " * 250)
    session = DocumentSession(smol, SMALL)
    session.open(str(path))
    return session


def test_ask_cloud_carries_reasoning_finish_and_notices_on_the_answer(long_session, corpus):
    """B18a end to end: the answer is empty, its reasoning kept apart, finish LENGTH, the notice
    about the budget, and (the endpoint counted 812 of ~2,500 tokens) the truncation warning."""
    with CloudServer(replay={"b18": recorded(corpus, "B18/reasoning-only")}) as server:
        settings = dataclasses.replace(SMALL, cloud=CloudSettings(enabled=True, base_url=server.base_url, model="b18",
                                                                  ask_before_sending=False, read_timeout_s=10.0,
                                                                  max_tokens=512))
        answer = ask_cloud(long_session, "When does the backup run?", settings)
    assert answer.text == "" and answer.reasoning.startswith("Okay , the user wants")
    assert answer.stop_reason == "max_tokens" and answer.cloud.finish is Finish.LENGTH and not answer.incomplete
    assert answer.cloud.plan.prompt_tokens_estimate > 2 * 812
    assert [n.split(":")[0] for n in answer.cloud.notices] == [
        "the model spent the whole answer budget (512 tokens) reasoning and wrote no answer",
        "the endpoint counted only 812 prompt tokens of about "
        f"{answer.cloud.plan.prompt_tokens_estimate:,} sent"]
