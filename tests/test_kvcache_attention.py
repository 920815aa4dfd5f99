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


@pytest.mark.parametrize("with_mask", [None, "recalled", "tail"])  # tail: masked keys beside the causal ones
def test_fused_bfloat16_prefill_matches_brute_force(with_mask):
    """attention_dtype=bfloat16 on a CPU (int4 weights): the flash kernel's output within bfloat16's
    rounding of the float64 reference, and H2O scores from its log-sum-exp within 1 %, with a
    sink-like key whose logits are large (where rounding logits to bfloat16 would cost most)."""
    torch.manual_seed(2)
    kv_heads, group, chunk, d = 2, 3, 100, 32  # 300 query rows: three score blocks, the last one short
    sizes = [150, 20, chunk]
    query = torch.randn(kv_heads, group, chunk, d) * 2
    keys = [torch.randn(kv_heads, n, d) * 2 for n in sizes]
    keys[0][:, 0] *= 5
    keys = tuple(keys)
    values = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    masks = [None, None, None]
    if with_mask == "recalled":
        masks[1] = torch.rand(kv_heads, sizes[1]) > 0.5
    elif with_mask == "tail":  # a held tail token and an earlier one of the chunk hidden from every query
        masks[2] = torch.ones(kv_heads, chunk, dtype=torch.bool)
        masks[2][0, 3], masks[1] = False, torch.rand(kv_heads, sizes[1]) > 0.5
    masks = tuple(masks)
    out, scores = chunk_attention(query, keys, values, scaling=d**-0.5, masks=masks, attention_dtype=torch.bfloat16)
    ref_out, ref_scores = reference(query, keys, values, d**-0.5, masks)
    assert out.dtype == torch.float32 and scores.dtype == torch.float32
    error = float((out.double() - ref_out).norm() / ref_out.norm())
    assert 1e-5 < error < 1e-2  # really rounded, but only by bfloat16's 8-bit mantissa
    assert float((scores.double() - ref_scores).abs().sum() / ref_scores.sum()) < 1e-2
    torch.testing.assert_close(scores.double(), ref_scores, atol=0.05, rtol=0.02)
    torch.testing.assert_close(scores.sum(dim=1).double(), torch.full((kv_heads,), float(group * chunk), dtype=torch.float64), rtol=1e-2, atol=0)
    if with_mask:
        assert float(scores[:, 150:170][~masks[1]].abs().max()) == 0.0
    if with_mask == "tail":
        assert float(scores[0, 173]) == 0.0 and float(scores[1, 173]) > 0
