"""engine.reasoning: `<think>` blocks apart from the answer (B18), whole and streamed, for cloud
answers and for local models that think aloud (Qwen3 in the model list)."""

from __future__ import annotations

import random

import pytest

from engine.reasoning import ReasoningSplitter, Split, split_reasoning

CASES = {
    "no reasoning": ("  The backup runs at 02:00. ", Split("  The backup runs at 02:00. ")),
    "qwen3": ("<think>\nThe user asks when.\n</think>\n\nAt 02:00.", Split("At 02:00.", "The user asks when.")),
    "template opened the tag": ("The user asks when.\n</think>\n\nAt 02:00.", Split("At 02:00.", "The user asks when.")),
    "empty block (thinking off)": ("<think>\n\n</think>\n\nAt 02:00.", Split("At 02:00.")),
    "cut while thinking": ("<think>The user asks", Split("", "The user asks", unfinished=True)),
    "thinking tag": ("<thinking>Look.</thinking>At 02:00.", Split("At 02:00.", "Look.")),
    "two blocks": ("<think>a</think><think>b</think> At 02:00.", Split("At 02:00.", "a\n\nb")),
    "a later tag is text": ("Use <think> tags like <think>this</think>.", Split("Use <think> tags like <think>this</think>.")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_reasoning(name):
    text, expected = CASES[name]
    assert split_reasoning(text) == expected


def streamed(text: str, seed: int) -> tuple[str, str]:
    """`text` fed to a ReasoningSplitter in random pieces of 1-6 characters."""
    rng, splitter, answer, reasoning, at = random.Random(seed), ReasoningSplitter(), [], [], 0
    while at < len(text):
        size = rng.randint(1, 6)
        shown, hidden = splitter.feed(text[at:at + size])
        answer.append(shown)
        reasoning.append(hidden)
        at += size
    shown, hidden = splitter.close()
    return "".join(answer + [shown]), "".join(reasoning + [hidden])


@pytest.mark.parametrize("name", ["no reasoning", "qwen3", "thinking tag", "cut while thinking", "two blocks",
                                  "a later tag is text", "empty block (thinking off)"])
@pytest.mark.parametrize("seed", range(20))
def test_streaming_in_any_pieces_agrees_with_the_whole_text(name, seed):
    """However the pieces fall (a tag cut in two, whitespace alone in a piece), the monologue never
    reaches the answer stream, and what streams is the split of the whole text."""
    text, expected = CASES[name]
    answer, reasoning = streamed(text, seed)
    assert answer == expected.answer
    assert " ".join(reasoning.split()) == " ".join(expected.reasoning.split())
