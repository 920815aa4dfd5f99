"""bench/attention_rank.py's judge: the attention a question's queries give each candidate span,
against a brute-force loop, and its fusion with the words' order."""

import importlib.util
import math
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("attention_rank", BENCH / "attention_rank.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def brute_force(query, keys, owner, n_candidates, scaling):
    """Per head and query: softmax over every key with math.exp, each candidate's share summed,
    divided by its key count, averaged over the queries."""
    heads, group, m, _ = query.shape
    out = [[[0.0] * n_candidates for _ in range(group)] for _ in range(heads)]
    counts = [owner.tolist().count(c) for c in range(n_candidates)]
    for h in range(heads):
        for g in range(group):
            for j in range(m):
                logits = [float(query[h, g, j].double() @ keys[h, r].double()) * scaling for r in range(keys.shape[1])]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for r, w in enumerate(weights):
                    out[h][g][int(owner[r])] += w / total / m / counts[int(owner[r])]
    return torch.tensor(out, dtype=torch.float64)


def test_candidate_attention_matches_a_brute_force_softmax():
    bench = load_bench()
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(3, 3, 4, 16, generator=generator)
    keys = torch.randn(3, 23, 16, generator=generator)
    owner = torch.tensor([0] * 5 + [1] * 9 + [2] * 2 + [3] * 7)
    got = bench.candidate_attention(query, keys, owner, 4, 0.25)
    expected = brute_force(query, keys, owner, 4, 0.25)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)
    per_token_total = (got * torch.bincount(owner).float()).sum(dim=-1)
    torch.testing.assert_close(per_token_total, torch.ones(3, 3))  # every query's attention is shared out


def test_fusion_adds_reciprocal_ranks_of_the_words_order_and_the_attentions():
    bench = load_bench()
    fused = bench.fused_scores([0.1, 0.2, 0.9, 0.3])  # words rank 1..4; attention ranks 4, 3, 1, 2
    k = bench.FUSION_K
    expected = [1 / (k + 1) + 1 / (k + 4), 1 / (k + 2) + 1 / (k + 3), 1 / (k + 3) + 1 / (k + 1), 1 / (k + 4) + 1 / (k + 2)]
    assert fused == expected
    assert sorted(range(4), key=lambda i: -fused[i]) == [2, 0, 1, 3]
    assert bench.rank_of_evidence(fused, [False, False, True, False]) == 1
