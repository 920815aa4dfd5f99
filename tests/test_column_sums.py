"""The fused prefill's H2O column sums: the way chosen by measurement (`column_sums.METHOD = "auto"`)
scores every chunk, the first included, and is chosen once per process and model shape."""

import pytest
import torch
from fake_clock import FakeClock

from engine.kvcache import column_sums
from engine.kvcache.attention import chunk_attention
from tests.test_prefill_exact import random_chunk

REAL_FLASH, REAL_BLOCKED = column_sums.swapped_flash_sums, column_sums.blocked_sums


def fused_scores(seed=0):
    query, keys, values = random_chunk(seed)
    return chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)[1]


@pytest.fixture
def fresh(monkeypatch):
    """Measure again in this test, and forget what it measured afterwards."""
    monkeypatch.setattr(column_sums, "METHOD", "auto")
    column_sums.forget_choices()
    yield
    column_sums.forget_choices()


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(column_sums, "time", fake)
    return fake


def cost(monkeypatch, clock, flash_s, blocked_s):
    """Each way's real function, charged `flash_s` / `blocked_s` on the fake clock per call."""
    monkeypatch.setattr(column_sums, "swapped_flash_sums", clock.costing(REAL_FLASH, flash_s))
    monkeypatch.setattr(column_sums, "blocked_sums", clock.costing(REAL_BLOCKED, blocked_s))


def reference(monkeypatch, method, seed=0):
    with monkeypatch.context() as m:
        m.setattr(column_sums, "METHOD", method)
        return fused_scores(seed)


def test_blocked_sums_chosen_where_they_are_faster(fresh, clock, monkeypatch):
    flash, blocked = reference(monkeypatch, "flash"), reference(monkeypatch, "blocked")
    assert not torch.equal(flash, blocked)  # else the check below could not tell them apart
    cost(monkeypatch, clock, 0.2, 0.05)
    scores = fused_scores()  # the first chunk of the process is already scored the chosen way
    [choice] = column_sums.measured()
    assert (choice.method, choice.flash_ms, choice.blocked_ms) == ("blocked", 200.0, 50.0)
    assert choice.threads == torch.get_num_threads()
    assert torch.equal(scores, blocked)


def test_flash_sums_chosen_where_they_are_faster(fresh, clock, monkeypatch):
    flash = reference(monkeypatch, "flash")
    cost(monkeypatch, clock, 0.05, 0.2)
    scores = fused_scores()
    assert column_sums.measured()[0].method == "flash"
    assert torch.equal(scores, flash)


def test_a_near_tie_keeps_the_flash_sums(fresh, clock, monkeypatch):
    """The blocked sums 5 % faster: the flash sums, which round less, are kept; 15 % faster: not."""
    flash = reference(monkeypatch, "flash")
    cost(monkeypatch, clock, 0.1, 0.095)
    assert torch.equal(fused_scores(), flash)
    assert column_sums.measured()[0].method == "flash"
    column_sums.forget_choices()
    cost(monkeypatch, clock, 0.1, 0.085)
    fused_scores()
    assert column_sums.measured()[0].method == "blocked"


def test_the_choice_stays_when_the_thread_count_changes(fresh, clock, monkeypatch):
    """The thread governor changes torch's threads between chunks: one read must not measure again
    and switch ways halfway."""
    cost(monkeypatch, clock, 0.2, 0.05)
    threads = torch.get_num_threads()
    fused_scores(0)
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        fused_scores(1)
    finally:
        torch.set_num_threads(threads)
    assert len(column_sums.measured()) == 1


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
