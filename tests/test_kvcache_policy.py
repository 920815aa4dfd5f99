"""Eviction keeps exactly sink ∪ window ∪ top-k by score, against a brute-force reference."""

import random

import pytest
import torch

from engine.kvcache.policy import AttentionSinks, HeavyHitters, RecentWindow, select_kept


def brute_force(index_row, score_row, seen, budget, sinks, window):
    """Plain-Python H2O selection for one head: returns sorted slot numbers."""
    slots = range(len(index_row))
    protected = {s for s in slots if index_row[s] < sinks or index_row[s] >= seen - window}
    rest = sorted((s for s in slots if s not in protected), key=lambda s: -score_row[s])
    keep = protected | set(rest[: max(0, min(budget, len(index_row)) - len(protected))])
    return sorted(keep)


@pytest.mark.parametrize("seed", range(12))
def test_select_kept_matches_brute_force(seed):
    rng = random.Random(seed)
    heads = rng.choice([1, 2, 3, 8])
    seen = rng.randint(20, 400)
    sinks, window = rng.randint(0, 4), rng.randint(1, 40)
    budget = rng.randint(sinks + window, sinks + window + 60)
    # every head holds the sinks and the window, and its own subset of the middle (per-head H2O)
    fixed = set(range(min(sinks, seen))) | set(range(max(0, seen - window), seen))
    middle = sorted(set(range(seen)) - fixed)
    m = rng.randint(0, min(len(middle), 200))
    index = torch.tensor([sorted(fixed | set(rng.sample(middle, m))) for _ in range(heads)])
    scores = torch.rand(heads, index.shape[1])
    kept = select_kept(
        index, scores, seen_tokens=seen, budget_tokens=budget,
        protectors=(AttentionSinks(sinks), RecentWindow(window)), ranker=HeavyHitters(),
    )
    for h in range(heads):
        expected = brute_force(index[h].tolist(), scores[h].tolist(), seen, budget, sinks, window)
        assert kept[h].tolist() == expected


def test_heads_choose_different_heavy_hitters():
    index = torch.arange(10).expand(2, 10)
    scores = torch.tensor([[0, 9, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 9, 0, 0, 0, 0, 0]], dtype=torch.float)
    kept = select_kept(index, scores, seen_tokens=10, budget_tokens=4,
                       protectors=(AttentionSinks(1), RecentWindow(2)), ranker=HeavyHitters())
    assert kept.tolist() == [[0, 1, 8, 9], [0, 4, 8, 9]]


def test_protected_set_larger_than_budget_is_an_error():
    index = torch.arange(10)[None]
    with pytest.raises(ValueError):
        select_kept(index, torch.rand(1, 10), seen_tokens=10, budget_tokens=3,
                    protectors=(AttentionSinks(2), RecentWindow(4)), ranker=HeavyHitters())


def test_mean_heavy_hitter_score_divides_by_the_queries_that_saw_each_token():
    # Token 0 collected 3.0 from 10 queries, token 8 collected 1.0 from 2: the sum keeps token 0,
    # the mean (kvpress ObservedAttention) keeps token 8.
    index = torch.tensor([[0, 8, 9]])
    scores = torch.tensor([[3.0, 1.0, 0.1]])
    common = dict(seen_tokens=10, budget_tokens=2, protectors=(RecentWindow(1),))
    assert select_kept(index, scores, ranker=HeavyHitters("sum"), **common).tolist() == [[0, 2]]
    assert select_kept(index, scores, ranker=HeavyHitters("mean"), **common).tolist() == [[1, 2]]
