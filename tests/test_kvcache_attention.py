"""chunk_attention against a brute-force float64 reference: GQA, parts, masks, causality, H2O scores."""

import pytest
import torch

from engine.kvcache.attention import Scratch, chunk_attention


def reference(query, keys, values, scaling, masks):
    """Per query head, per query: softmax over every attended key, in float64."""
    kv_heads, group, chunk, _ = query.shape
    k = torch.cat(keys, dim=1).double()
    v = torch.cat(values, dim=1).double()
    total = k.shape[1]
    keep = torch.cat([torch.ones(p.shape[:2], dtype=torch.bool) if m is None else m for p, m in zip(keys, masks)], dim=1)
    out = torch.zeros(kv_heads, group, chunk, v.shape[-1], dtype=torch.float64)
    scores = torch.zeros(kv_heads, total, dtype=torch.float64)
    for h in range(kv_heads):
        for g in range(group):
            for i in range(chunk):
                visible = keep[h].clone()
                visible[total - chunk + i + 1 :] = False  # the chunk's later tokens
                logits = (k[h] @ query[h, g, i].double()) * scaling
                p = torch.where(visible, torch.exp(logits - logits[visible].max()), torch.zeros_like(logits))
                p = p / p.sum()
                out[h, g, i] = p @ v[h]
                scores[h] += p
    return out, scores


@pytest.mark.parametrize("use_scratch", [False, True])
@pytest.mark.parametrize("group, chunk", [(1, 5), (3, 5), (3, 8)])  # group·chunk < head_dim: parts; ≥: joined
@pytest.mark.parametrize("with_mask", [False, True])
def test_matches_brute_force(group, chunk, with_mask, use_scratch):
    torch.manual_seed(0)
    kv_heads, d = 2, 16
    sizes = [7, 4, chunk]  # held, recalled, the chunk itself
    query = torch.randn(kv_heads, group, chunk, d)
    keys = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    values = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    masks = (None, torch.rand(kv_heads, sizes[1]) > 0.5 if with_mask else None, None)
    scratch = Scratch() if use_scratch else None
    if scratch is not None:  # a larger chunk first: the buffer is then reused, not reallocated
        big = torch.randn(kv_heads, group, 20, d)  # group·20 ≥ head_dim: the joined path, in the buffer
        chunk_attention(big, (torch.randn(kv_heads, 30, d), big[:, 0]), (torch.randn(kv_heads, 30, d), big[:, 0]), scaling=1.0, scratch=scratch)
        held = scratch.nbytes
    out, scores = chunk_attention(query, keys, values, scaling=d**-0.5, masks=masks, scratch=scratch)
    if scratch is not None:
        assert scratch.nbytes == held == 4 * kv_heads * group * 20 * 50
    ref_out, ref_scores = reference(query, keys, values, d**-0.5, masks)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores.double(), ref_scores, atol=1e-5, rtol=1e-5)
    # every query's probabilities sum to 1: the scores of a chunk sum to group · chunk per KV head
    torch.testing.assert_close(scores.sum(dim=1), torch.full((kv_heads,), float(group * chunk)))
    if with_mask:
        assert float(scores[:, 7:11][~masks[1]].abs().max()) == 0.0


def test_long_chunk_sums_scores_from_every_strided_query():
    """A chunk of more than `score_queries` queries: exact output; scores = the brute-force column
    sums of every stride-th query (ending at the last), times the stride."""
    torch.manual_seed(1)
    kv_heads, group, chunk, d = 2, 3, 40, 16
    sizes = [30, 6, chunk]
    query = torch.randn(kv_heads, group, chunk, d)
    keys = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    values = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    masks = (None, torch.rand(kv_heads, sizes[1]) > 0.5, None)
    out, scores = chunk_attention(query, keys, values, scaling=d**-0.5, masks=masks, score_queries=8)
    ref_out, _ = reference(query, keys, values, d**-0.5, masks)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    stride, rows = 5, list(range(4, chunk, 5))  # ceil(40 / 8); queries 4, 9, ..., 39
    sampled = torch.zeros(kv_heads, sum(sizes), dtype=torch.float64)
    for i in rows:  # one query at a time, seeing what query i of the chunk sees
        cut = sum(sizes) - chunk + i + 1
        _, part = reference(query[:, :, i : i + 1], (torch.cat(keys, 1)[:, :cut],), (torch.cat(values, 1)[:, :cut],),
                            d**-0.5, (torch.cat((torch.ones(kv_heads, 30, dtype=torch.bool), masks[1],
                                                 torch.ones(kv_heads, i + 1, dtype=torch.bool)), 1),))
        sampled[:, :cut] += part
    torch.testing.assert_close(scores.double(), stride * sampled, atol=1e-5, rtol=1e-5)
    assert float(scores[:, 30:36][~masks[1]].abs().max()) == 0.0
    # and the estimate is near the exact column sums (the sum over all 120 query rows per head)
    _, exact = reference(query, keys, values, d**-0.5, masks)
    assert float((scores.double() - exact).abs().sum() / exact.sum()) < 0.25


def test_bfloat16_prefill_output_stays_close_scores_stay_float32():
    """attention_dtype=bfloat16 (int4 CPU weights): the output within bfloat16's rounding of the
    float64 reference, the scores still computed from float32 probabilities."""
    torch.manual_seed(2)
    kv_heads, group, chunk, d = 2, 3, 24, 32
    sizes = [50, chunk]
    query = torch.randn(kv_heads, group, chunk, d)
    keys = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    values = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    out, scores = chunk_attention(query, keys, values, scaling=d**-0.5, attention_dtype=torch.bfloat16)
    ref_out, ref_scores = reference(query, keys, values, d**-0.5, (None, None))
    assert out.dtype == torch.float32 and scores.dtype == torch.float32
    error = float((out.double() - ref_out).abs().max())
    assert 1e-5 < error < 3e-2  # really rounded, but only by bfloat16's 8-bit mantissa
    torch.testing.assert_close(scores.double(), ref_scores, atol=1e-5, rtol=1e-5)
