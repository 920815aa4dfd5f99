"""Decoding as functions of (decoder, cache, settings) (`engine.generate`), without a model: a fake
decoder whose next token is a fixed function of the last one fed."""

import threading

import pytest
import torch

from engine.answer import StopReason
from engine.errors import Cancelled
from engine.generate import (
    RECALL_EVERY_TOKEN_UNTIL,
    RECALL_REFRESH_TOKENS,
    AnswerBuilder,
    Decoding,
    decode_answer,
    draft_room,
    pick,
    refresh_recall,
    stop_token_ids,
)
from engine.prompt_lookup import PromptLookup

VOCAB = 32
STOP = 0


class Tokenizer:
    eos_token_id = STOP

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)

    def get_vocab(self):
        return {"<|im_end|>": 5, "hello": 7}


class Cache:
    """What decoding asks of a cache: room before a flush, and commit after a pending pass."""

    decode_slack = 128

    def __init__(self, room: int = 1000) -> None:
        self.room = room
        self.fed: list[int] = []
        self.pending: list[int] = []

    def tokens_until_compress(self, slack_tokens: int) -> int:
        return self.room

    def commit(self, count: int, slack_tokens: int) -> None:
        self.fed += self.pending[:count]
        self.pending = []


class Decoder:
    """Logits `[n, VOCAB]` whose argmax after token t is `following[t]`; counts its passes."""

    def __init__(self, following: dict[int, int]) -> None:
        self.following = following
        self.passes = 0

    def forward(self, token_ids, cache, *, all_logits=False, pending=False, cancel=None, **_):
        if cancel is not None and cancel.is_set():
            raise Cancelled("stopped")
        self.passes += 1
        ids = token_ids.tolist()
        if pending:
            cache.pending = ids
        else:
            cache.fed += ids
        logits = torch.full((len(ids), VOCAB), -5.0)
        for row, token in enumerate(ids):
            logits[row, self.following.get(token, STOP)] = 5.0
        return logits if all_logits else logits[-1:]


def answer(following, first, decoding, lookup=None, cancel=None):
    built = AnswerBuilder(Tokenizer(), 0.0, None, lookup)
    decoder = Decoder(following)
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, first] = 5.0
    stop = decode_answer(decoder, Cache(), logits, built, decoding, cancel=cancel)
    return stop, built.generated, built.drafts, decoder.passes


def test_pick_is_greedy_and_gives_the_unpenalized_logprob():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]])
    assert pick(logits, []) == (1, pytest.approx(float(torch.log_softmax(logits[0], -1)[1])))
    token, logprob = pick(logits, [1], repetition_penalty=1.1)  # 3.0 / 1.1 < 2.9
    assert token == 2 and logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[2]))
    negative = torch.tensor([[-1.0, -1.05, -9.0]])
    assert pick(negative, [0], repetition_penalty=1.1)[0] == 1  # a negative logit is multiplied, not divided


def test_pick_samples_at_a_temperature():
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 0.0, -100.0]])
    assert {pick(logits, [], temperature=1.0)[0] for _ in range(50)} == {0, 1}


def test_decoding_stops_at_a_stop_token_or_the_limit():
    chain = {1: 2, 2: 3, 3: STOP}
    stop, generated, _, _ = answer(chain, 1, Decoding(frozenset({STOP}), max_new_tokens=10))
    assert stop is StopReason.END and generated == [1, 2, 3]
    stop, generated, _, _ = answer(chain, 1, Decoding(frozenset({STOP}), max_new_tokens=2))
    assert stop is StopReason.MAX_TOKENS and generated == [1, 2]


def test_drafts_give_the_same_answer_in_fewer_passes():
    chain = {i: i + 1 for i in range(1, 20)} | {20: STOP}
    plain = answer(chain, 1, Decoding(frozenset({STOP}), max_new_tokens=30))
    lookup = PromptLookup(list(range(1, 21)))  # the "document" quotes the answer
    lookup.reset([1])
    drafted = answer(chain, 1, Decoding(frozenset({STOP}), max_new_tokens=30, draft_tokens=8), lookup=lookup)
    assert drafted[:2] == plain[:2] == (StopReason.END, list(range(1, 21)))
    assert drafted[2].accepted > 0 and drafted[3] < plain[3]


def test_a_wrong_draft_is_rejected():
    chain = {1: 2, 2: 3, 3: 4, 4: STOP}
    lookup = PromptLookup([1, 2, 9, 9, 9])  # after (1, 2) the document says 9: the model says 3
    lookup.reset([])
    stop, generated, drafts, _ = answer(chain, 1, Decoding(frozenset({STOP}), max_new_tokens=10, draft_tokens=4),
                                        lookup=lookup)
    assert stop is StopReason.END and generated == [1, 2, 3, 4]
    assert drafts.drafted > drafts.accepted


def test_cancel_stops_decoding():
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        answer({1: 2}, 1, Decoding(frozenset({STOP}), max_new_tokens=10), cancel=cancel)


def test_draft_room():
    assert draft_room(Cache(1000), 40, 100, 8, recalling=False) == 8
    assert draft_room(Cache(1000), 95, 100, 8, recalling=False) == 5  # the length limit
    assert draft_room(Cache(4), 40, 100, 8, recalling=False) == 3  # no flush inside the pass
    # a refresh due at answer token 48 (every RECALL_REFRESH_TOKENS) ends the room before it
    assert RECALL_REFRESH_TOKENS == 8 and draft_room(Cache(1000), 41, 100, 8, recalling=True) == 6
    assert draft_room(Cache(1000), 5, 100, 8, recalling=True) == 0  # every early token refreshes


def test_refresh_recall():
    assert all(refresh_recall(n) for n in range(1, RECALL_EVERY_TOKEN_UNTIL + 1))
    later = [n for n in range(RECALL_EVERY_TOKEN_UNTIL + 1, 60) if refresh_recall(n)]
    assert later == [n for n in range(RECALL_EVERY_TOKEN_UNTIL + 1, 60) if n % RECALL_REFRESH_TOKENS == 0]


def test_stop_token_ids():
    class Generation:
        eos_token_id = [11, 12]

    assert stop_token_ids(Tokenizer()) == {STOP, 5}
    assert stop_token_ids(Tokenizer(), Generation()) == {STOP, 5, 11, 12}


def test_drafting_only_in_greedy_decoding():
    assert Decoding(frozenset(), 10, draft_tokens=4).drafts
    assert not Decoding(frozenset(), 10, draft_tokens=4, temperature=0.7).drafts
    assert not Decoding(frozenset(), 10).drafts


def test_the_thread_governor_is_asked_every_few_answer_tokens():
    from engine.generate import GOVERNOR_EVERY_TOKENS

    class Governor:
        def __init__(self):
            self.at: list[int] = []

        def step(self):
            self.at.append(len(built.generated))
            return 1

    following = {t: t + 1 for t in range(1, 30)}  # 1, 2, 3, … 30, then STOP
    built = AnswerBuilder(Tokenizer(), 0.0, None, None)
    governor = Governor()
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 1] = 5.0
    stop = decode_answer(Decoder(following), Cache(), logits, built, Decoding(stop_ids=frozenset({STOP}), max_new_tokens=20),
                         governor=governor)
    assert stop == StopReason.MAX_TOKENS and len(built.generated) == 20
    assert governor.at == list(range(GOVERNOR_EVERY_TOKENS, 21, GOVERNOR_EVERY_TOKENS))
