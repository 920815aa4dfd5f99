"""A model's reasoning kept apart from its answer (B18): `<think>…</think>` written into the text.

Reasoning models (DeepSeek-R1, QwQ, Qwen3 with thinking on, and a server without a reasoning parser
in front of them: Ollama, vLLM or llama.cpp's server started without `--reasoning-parser` /
`--reasoning-format`) put their monologue at the start of the answer between `<think>` and
`</think>`. When the chat template opens the tag itself (Qwen3's and DeepSeek-R1's do in the
generation prompt), only the closing tag appears in the output. The answer is what follows.

Both functions are pure. `split_reasoning` reads a whole text (the final answer: the cloud client's,
and a local model's, where `DocumentSession.ask` should apply it to the decoded text); the
`ReasoningSplitter` does the same for pieces as they stream, so the monologue is never shown as the
answer while it arrives. Only leading blocks count: a `<think>` later in an answer is text.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAGS = ("<think>", "<thinking>")
CLOSE_TAGS = ("</think>", "</thinking>")


@dataclass(frozen=True)
class Split:
    """answer: the text shown as the answer. reasoning: the monologue ("" when none).
    unfinished: a reasoning block was opened and never closed (the length limit hit it)."""

    answer: str
    reasoning: str = ""
    unfinished: bool = False


def split_reasoning(text: str) -> Split:
    """Split leading `<think>…</think>` blocks (or `<thinking>`) off `text`.

    "<think>a</think>\\n\\nB" -> Split("B", "a"); "a</think>B" (the template opened the tag) ->
    Split("B", "a"); "<think>a" (cut while thinking) -> Split("", "a", unfinished=True);
    text without a leading block is all answer, unchanged. The whitespace between the reasoning
    and the answer is dropped.
    """
    reasoning: list[str] = []
    rest = text
    while True:
        stripped = rest.lstrip()
        opener = next((tag for tag in OPEN_TAGS if stripped.startswith(tag)), None)
        if opener is None:
            break
        body = stripped[len(opener):]
        end, closer = _find_close(body)
        if end < 0:
            reasoning.append(body.strip())
            return Split("", _joined(reasoning), unfinished=True)
        reasoning.append(body[:end].strip())
        rest = body[end + len(closer):]
    if not reasoning:
        end, closer = _find_close(rest)
        if end >= 0 and not any(tag in rest[:end] for tag in OPEN_TAGS):
            reasoning.append(rest[:end].strip())
            rest = rest[end + len(closer):]
    if not reasoning:
        return Split(text)
    return Split(rest.lstrip(), _joined(reasoning))


def _find_close(text: str) -> tuple[int, str]:
    found = [(text.find(tag), tag) for tag in CLOSE_TAGS if tag in text]
    return min(found) if found else (-1, "")


def _joined(parts: list[str]) -> str:
    return "\n\n".join(part for part in parts if part)


class ReasoningSplitter:
    """`split_reasoning` for a stream: feed pieces, get (answer, reasoning) pieces back.

        splitter = ReasoningSplitter()
        for piece in pieces:
            answer, reasoning = splitter.feed(piece)
        answer, reasoning = splitter.close()

    Leading whitespace and a tag cut between two pieces ("<thi" + "nk>") are held back until it is
    clear what they are. A closing tag with no opening one cannot be seen coming while streaming:
    that text streams as answer, and `split_reasoning` on the whole text puts it right at the end.
    """

    def __init__(self) -> None:
        self._held = ""
        self._state = "start"   # "start": nothing but whitespace yet; "reasoning"; "answer"
        self._reasoned = False  # a block was closed: the whitespace after it is not the answer's

    def feed(self, piece: str) -> tuple[str, str]:
        """The answer text and the reasoning text that `piece` completes (either may be "")."""
        self._held += piece
        answer, reasoning = [], []
        while self._held:
            if self._state == "start":
                stripped = self._held.lstrip()
                opener = next((tag for tag in OPEN_TAGS if stripped.startswith(tag)), None)
                if opener is not None:
                    if self._reasoned:
                        reasoning.append("\n\n")  # a second block, apart as split_reasoning keeps it
                    self._held, self._state = stripped[len(opener):], "reasoning"
                    continue
                if not stripped or any(tag.startswith(stripped) for tag in OPEN_TAGS):
                    break  # whitespace, or the start of a tag: wait for more
                self._state = "answer"
                answer.append(stripped if self._reasoned else self._held)
                self._held = ""
            elif self._state == "reasoning":
                end, closer = _find_close(self._held)
                if end >= 0:
                    reasoning.append(self._held[:end])
                    self._held, self._state, self._reasoned = self._held[end + len(closer):], "start", True
                    continue
                keep = _partial_suffix(self._held, CLOSE_TAGS)
                reasoning.append(self._held[:len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
                break
            else:
                answer.append(self._held)
                self._held = ""
        return "".join(answer), "".join(reasoning)

    def close(self) -> tuple[str, str]:
        """What is still held at the end of the stream: a cut tag counts as what it was inside."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return "", held
        if self._state == "start" and (self._reasoned or not held.strip()):
            held = held.lstrip() if self._reasoned else held
        return held, ""


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that begins one of `tags` (held until the next piece)."""
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), 0, -1):
            if tag.startswith(text[-size:]):
                best = max(best, size)
                break
    return best
