"""The answer being decoded (`engine.generate.AnswerBuilder`): streamed text, reasoning kept apart."""

import time

from engine.generate import AnswerBuilder


def test_a_local_model_thinking_aloud_streams_only_its_answer(smol):
    tokenizer = smol.tokenizer
    ids = tokenizer("<think>The user wants the code; it is on page 2.</think>The code is 17412.",
                    add_special_tokens=False)["input_ids"]
    shown: list[str] = []
    built = AnswerBuilder(tokenizer, time.perf_counter(), shown.append, None)
    for token in ids:
        built.emit(token, -0.5)
    split = built.finish()
    assert "".join(shown) == split.answer == "The code is 17412."
    assert split.reasoning == "The user wants the code; it is on page 2."
    assert built.generated == ids and built.mean_logprob() == -0.5 and built.ttft_s > 0


def test_an_answer_without_reasoning_streams_every_piece(smol):
    tokenizer = smol.tokenizer
    text = "Café au lait, 東京 and 17412."
    shown: list[str] = []
    built = AnswerBuilder(tokenizer, time.perf_counter(), shown.append, None)
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        built.emit(token, 0.0)
        assert "\ufffd" not in "".join(shown), "a split character is held until it is whole"
    assert built.finish().answer == "".join(shown) == text
