"""What an endpoint's `finish_reason` means, for every provider's words (B13).

The OpenAI API defines `stop`, `length`, `content_filter`, `tool_calls` and the deprecated
`function_call`; servers that speak it add their own, or pass their native stop reason through:

| provider | values seen |
|---|---|
| OpenAI, Azure OpenAI | stop, length, content_filter, tool_calls, function_call |
| vLLM | stop, length, abort, error, tool_calls |
| SGLang | stop, length, abort; `""` on every chunk before the last (B13) |
| llama.cpp server | stop, length, tool_calls; native `stop_type` eos, word, limit |
| Ollama | stop, length, tool_calls; `""` before the last chunk (B13); native done_reason load, unload |
| Mistral | stop, length, model_length, error, tool_calls |
| Anthropic (native, and passed through by proxies) | end_turn, max_tokens, stop_sequence, tool_use, pause_turn, refusal |
| Hugging Face TGI | eos_token, length, stop_sequence |
| Google Gemini (native words through proxies) | STOP, MAX_TOKENS, SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII, OTHER |
| Cohere | COMPLETE, MAX_TOKENS, STOP_SEQUENCE, ERROR, TOOL_CALL |
| DeepSeek | insufficient_system_resource |

`null` and `""` mean "not finished yet". Values are compared without case. A value not in the
table is `Finish.UNKNOWN`: reported as such, never taken for a normal end.
"""

from __future__ import annotations

import enum


class Finish(enum.Enum):
    """Why the model stopped, as Halaman acts on it. Only STOP is a whole answer."""

    STOP = "stop"              # the model ended its answer
    LENGTH = "length"          # the answer-length limit (max_tokens) cut it
    CONTEXT = "context"        # the model's context window filled up before it ended
    FILTERED = "filtered"      # a content filter or safety system stopped or refused it
    TOOL_CALLS = "tool_calls"  # it asked to call a tool (Halaman offers none): no answer text
    ABORTED = "aborted"        # the server stopped the request (overload, shutdown, a paused turn)
    ERROR = "error"            # the server reports an error instead of an end
    UNKNOWN = "unknown"        # a value Halaman does not know

    @property
    def complete(self) -> bool:
        """Whether the answer ended on its own."""
        return self is Finish.STOP

    def notice(self, raw: str) -> str | None:
        """One line telling the user what this end means (None for a normal end). `raw`: the
        value as the endpoint sent it."""
        return None if self is Finish.STOP else _NOTICES[self].format(raw=raw)


_VALUES: dict[str, Finish] = {
    **dict.fromkeys(("stop", "eos", "eos_token", "end_turn", "stop_sequence", "complete", "word"), Finish.STOP),
    **dict.fromkeys(("length", "max_tokens", "limit"), Finish.LENGTH),
    **dict.fromkeys(("model_length",), Finish.CONTEXT),
    **dict.fromkeys(("content_filter", "safety", "recitation", "blocklist", "prohibited_content", "spii", "refusal"),
                    Finish.FILTERED),
    **dict.fromkeys(("tool_calls", "function_call", "tool_use", "tool_call"), Finish.TOOL_CALLS),
    **dict.fromkeys(("abort", "pause_turn", "insufficient_system_resource", "load", "unload"), Finish.ABORTED),
    **dict.fromkeys(("error",), Finish.ERROR),
}

_NOTICES = {
    Finish.LENGTH: "the answer was cut at the answer length limit (finish_reason {raw!r}): raise 'max tokens' in cloud settings",
    Finish.CONTEXT: "the model's context window filled up before the answer ended (finish_reason {raw!r}): "
                    "lower 'context tokens' in cloud settings",
    Finish.FILTERED: "the endpoint's content filter stopped the answer (finish_reason {raw!r}): it is incomplete",
    Finish.TOOL_CALLS: "the model asked to call a tool instead of answering (finish_reason {raw!r}): it is incomplete",
    Finish.ABORTED: "the endpoint stopped the answer before it was finished (finish_reason {raw!r}): try again",
    Finish.ERROR: "the endpoint reported an error instead of finishing the answer (finish_reason {raw!r}): try again",
    Finish.UNKNOWN: "the endpoint ended the answer with finish_reason {raw!r}, which Halaman does not know: "
                    "it may be incomplete",
}


def parse_finish(value: object) -> Finish | None:
    """The meaning of a chunk's `finish_reason`: None while not finished (`null`, `""`, absent);
    Finish.UNKNOWN for a value in no provider's list (or one that is not a string)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return Finish.UNKNOWN
    key = value.strip().lower()
    if not key:
        return None
    return _VALUES.get(key, Finish.UNKNOWN)
