"""The fused prefill's H2O column sums: the way chosen by measurement (`column_sums.METHOD = "auto"`)
scores every chunk, the first included, and is chosen once per process and model shape."""

import time

import pytest
import torch

from engine.kvcache import column_sums
from engine.kvcache.attention import chunk_attention
from tests.test_prefill_exact import random_chunk


def fused_scores(seed=0):
    query, keys, values = random_chunk(seed)
    return chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)[1]


def slowed(function, seconds):
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return function(*args, **kwargs)
    return slow


@pytest.fixture
def fresh(monkeypatch):
    """Measure again in this test, and forget what it measured afterwards."""
    monkeypatch.setattr(column_sums, "METHOD", "auto")
    column_sums.forget_choices()
    yield
    column_sums.forget_choices()


def reference(monkeypatch, method, seed=0):
    with monkeypatch.context() as m:
        m.setattr(column_sums, "METHOD", method)
        return fused_scores(seed)


def test_blocked_sums_chosen_where_they_are_faster(fresh, monkeypatch):
    flash, blocked = reference(monkeypatch, "flash"), reference(monkeypatch, "blocked")
    assert not torch.equal(flash, blocked)  # else the check below could not tell them apart
    monkeypatch.setattr(column_sums, "swapped_flash_sums", slowed(column_sums.swapped_flash_sums, 0.2))
    scores = fused_scores()  # the first chunk of the process is already scored the chosen way
    [choice] = column_sums.measured()
    assert choice.method == "blocked" and choice.blocked_ms < 0.9 * choice.flash_ms
    assert torch.equal(scores, blocked)


def test_flash_sums_chosen_where_they_are_faster(fresh, monkeypatch):
    flash = reference(monkeypatch, "flash")
    monkeypatch.setattr(column_sums, "blocked_sums", slowed(column_sums.blocked_sums, 0.2))
    scores = fused_scores()
    assert column_sums.measured()[0].method == "flash"
    assert torch.equal(scores, flash)


def test_a_near_tie_keeps_the_flash_sums(fresh, monkeypatch):
    """Both ways take the same time (each a fixed sleep): the one that rounds less is kept."""
    flash = reference(monkeypatch, "flash")
    zeros = lambda rows, cols, chunk, *rest: torch.zeros(rows.shape[0], cols.shape[1])  # noqa: E731
    monkeypatch.setattr(column_sums, "swapped_flash_sums", slowed(zeros, 0.1))
    monkeypatch.setattr(column_sums, "blocked_sums", slowed(zeros, 0.098))
    column_sums.choice_for(3, 3, 66, torch.device("cpu"))
    monkeypatch.undo()
    monkeypatch.setattr(column_sums, "METHOD", "auto")
    assert column_sums.measured()[0].method == "flash"
    assert torch.equal(fused_scores(), flash)


def test_measured_once_per_process_and_shape(fresh, monkeypatch):
    calls = []
    real = column_sums._measure
    monkeypatch.setattr(column_sums, "_measure", lambda *shape: calls.append(shape) or real(*shape))
    fused_scores(0)
    fused_scores(1)
    assert len(calls) == 1 and calls[0][:3] == (3, 3, 66)
    query, keys, values = random_chunk(2, kv_heads=2, group=6)  # another model's shape: measured for it
    chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)
    assert [c[:3] for c in calls] == [(3, 3, 66), (2, 6, 66)]
    assert len(column_sums.measured()) == 2


def test_an_unknown_method_is_refused(monkeypatch):
    monkeypatch.setattr(column_sums, "METHOD", "fast")
    with pytest.raises(ValueError, match="'auto', 'flash' or 'blocked'"):
        fused_scores()
