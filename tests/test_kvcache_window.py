"""Heavy-hitter scores from a prefill chunk's observation window (SnapKV), against brute force.

The window path computes a chunk's output without its probabilities and scores keys by the last
queries only; the output must be today's, the scores SnapKV's (softmax of the last W queries over
the keys, summed per KV group, average-pooled over 5 keys, scaled to the chunk).
"""

import pytest
import torch

from engine.kvcache.attention import (
    SNAP_POOL_KERNEL,
    SNAP_WINDOW_QUERIES,
    chunk_attention,
    window_scores,
)
from engine.settings import CachePolicy, SettingsError
from tests.test_kvcache_attention import reference


def pooled(mass: torch.Tensor, kernel: int = SNAP_POOL_KERNEL) -> torch.Tensor:
    """Average over `kernel` neighbouring keys, zero beyond the ends, by explicit loops (float64)."""
    half, total = kernel // 2, mass.shape[-1]
    out = torch.zeros_like(mass)
    for j in range(total):
        out[..., j] = mass[..., max(0, j - half) : min(total, j + half + 1)].sum(-1) / kernel
    return out


def reference_window(query, keys, masks, scaling, window):
    """SnapKV's scores by brute force: each of the last `window` queries' softmax (float64), summed
    over the group and those queries, pooled, zero where masked, times chunk / window."""
    kv_heads, group, chunk, _ = query.shape
    k = torch.cat(keys, dim=1).double()
    total = k.shape[1]
    keep = torch.cat([torch.ones(p.shape[:2], dtype=torch.bool) if m is None else m for p, m in zip(keys, masks)], dim=1)
    w = min(window, chunk)
    mass = torch.zeros(kv_heads, total, dtype=torch.float64)
    for h in range(kv_heads):
        for g in range(group):
            for i in range(chunk - w, chunk):
                visible = keep[h].clone()
                visible[total - chunk + i + 1 :] = False
                logits = (k[h] @ query[h, g, i].double()) * scaling
                p = torch.where(visible, torch.exp(logits - logits[visible].max()), torch.zeros_like(logits))
                mass[h] += p / p.sum()
    return torch.where(keep, pooled(mass), torch.zeros_like(mass)) * (chunk / w)


def case(seed, group=3, chunk=40, with_mask=False):
    torch.manual_seed(seed)
    kv_heads, d = 2, 16
    sizes = [30, 9, chunk]  # held, recalled, the chunk itself
    query = torch.randn(kv_heads, group, chunk, d) * 1.5
    keys = tuple(torch.randn(kv_heads, n, d) * 1.5 for n in sizes)
    values = tuple(torch.randn(kv_heads, n, d) for n in sizes)
    masks = (None, torch.rand(kv_heads, sizes[1]) > 0.5 if with_mask else None, None)
    return query, keys, values, masks, d**-0.5


@pytest.mark.parametrize("window", [8, 40, 64])  # fewer queries than the chunk, all of them, more
@pytest.mark.parametrize("with_mask", [False, True])
def test_window_scores_equal_brute_force(window, with_mask):
    query, keys, _, masks, scaling = case(0, with_mask=with_mask)
    keep = torch.cat([torch.ones(p.shape[:2], dtype=torch.bool) if m is None else m for p, m in zip(keys, masks)], dim=1)
    scores = window_scores(query, torch.cat(keys, dim=1), keep if with_mask else None, window=window, scaling=scaling)
    expected = reference_window(query, keys, masks, scaling, window)
    torch.testing.assert_close(scores.double(), expected, atol=1e-5, rtol=1e-5)
    # scaled to the chunk: as much mass as H2O's sum over every query, less what pooling pushes past the ends
    total_mass = scores.sum(dim=1)
    assert bool((total_mass <= 3 * 40 + 1e-3).all()) and bool((total_mass > 0.8 * 3 * 40).all())


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("attention_dtype", [None, torch.bfloat16])  # float32 flash kernel; the bfloat16 fused path
def test_window_path_output_is_todays_and_scores_are_snapkv(with_mask, attention_dtype):
    query, keys, values, masks, scaling = case(1, with_mask=with_mask)
    out, scores = chunk_attention(query, keys, values, scaling=scaling, masks=masks, attention_dtype=attention_dtype,
                                  scoring="window")
    today, h2o = chunk_attention(query, keys, values, scaling=scaling, masks=masks, attention_dtype=attention_dtype)
    ref_out, _ = reference(query, keys, values, scaling, masks)
    tolerance = 1e-5 if attention_dtype is None else 1e-2  # bfloat16 rounds inputs to 8 mantissa bits
    assert float((out.double() - ref_out).norm() / ref_out.norm()) < tolerance
    assert float((out - today).norm() / today.norm()) < tolerance
    expected = reference_window(query, keys, masks, scaling, SNAP_WINDOW_QUERIES)  # 32 of the chunk's 40
    torch.testing.assert_close(scores.double(), expected, atol=1e-3 if attention_dtype else 1e-5, rtol=1e-2 if attention_dtype else 1e-5)
    assert not torch.allclose(scores, h2o, rtol=0.05, atol=0.05)  # really another scoring than H2O's


def test_decode_steps_keep_their_own_probabilities():
    """group·chunk < head_dim (a decode step): the window is ignored, the step's exact sums stay."""
    query, keys, values, masks, scaling = case(2, group=3, chunk=2)
    out, scores = chunk_attention(query, keys, values, scaling=scaling, masks=masks, scoring="window")
    ref_out, ref_scores = reference(query, keys, values, scaling, masks)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores.double(), ref_scores, atol=1e-5, rtol=1e-5)


def test_window_is_a_valid_policy_value():
    CachePolicy(heavy_hitter_score="window").validate()
    with pytest.raises(SettingsError, match="'window'"):
        CachePolicy(heavy_hitter_score="snap").validate()


@pytest.fixture(scope="module")
def book_ids(smol):
    text = ("Attention sinks, a recent window and heavy hitters decide which tokens a compressed cache keeps. "
            "The observation window at the end of each chunk predicts which keys later queries will need. ") * 12
    return torch.tensor(smol.tokenizer(text, add_special_tokens=False)["input_ids"][:192])


def test_model_scores_are_snapkv_of_the_eager_attention(smol, book_ids):
    """No eviction, 64-token chunks: each layer's scores are the sum over the three chunks of the
    pooled attention of each chunk's last 32 queries (transformers' eager weights), times 64 / 32."""
    model = smol.decoder.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(book_ids[None], output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
    policy = CachePolicy(budget_tokens=512, window_tokens=256, kv_bits=16, chunk_tokens=64, heavy_hitter_score="window")
    cache = smol.decoder.new_cache(policy, "original")
    smol.decoder.prefill(book_ids, cache)
    kv_heads = smol.profile.kv_heads
    group = smol.profile.query_heads // kv_heads
    for layer, attn in zip(cache.layers, attentions, strict=True):
        weights = attn[0].double().reshape(kv_heads, group, len(book_ids), len(book_ids))
        expected = torch.zeros(kv_heads, len(book_ids), dtype=torch.float64)
        for end in (64, 128, 192):
            mass = weights[:, :, end - 32 : end, :end].sum(dim=(1, 2))
            expected[:, :end] += pooled(mass) * 2
        torch.testing.assert_close(layer.score.double(), expected, rtol=2e-2, atol=2e-3)


def test_model_output_is_todays_and_only_the_kept_set_changes(smol, book_ids):
    """The same logits as the default scorer without eviction; with eviction both keep sinks, window
    and budget, and the heavy hitters they pick differ."""
    def run(score, budget):
        policy = CachePolicy(budget_tokens=budget, window_tokens=32, residual_tokens=16, sink_tokens=4, kv_bits=16,
                             chunk_tokens=64, block_tokens=16, heavy_hitter_score=score)
        cache = smol.decoder.new_cache(policy, "original")
        logits = torch.cat([smol.decoder.forward(book_ids[i : i + 64], cache, all_logits=True) for i in range(0, 192, 64)])
        return logits, cache

    window_logits, _ = run("window", 512)
    mean_logits, _ = run("mean", 512)
    # the flash kernel against materialised float32 probabilities: measured max |Δlogit| 0.002 of ~20
    assert float((window_logits - mean_logits).abs().max()) < 1e-2
    assert torch.equal(window_logits.argmax(-1), mean_logits.argmax(-1))
    _, window_cache = run("window", 96)
    _, mean_cache = run("mean", 96)
    n = len(book_ids)
    for layer in window_cache.layers:
        assert layer.index.shape == (smol.profile.kv_heads, 96)
        for row in layer.index.tolist():
            assert set(range(4)) <= set(row) and set(range(n - 32, n)) <= set(row)
    assert any(not torch.equal(w.index, m.index) for w, m in zip(window_cache.layers, mean_cache.layers, strict=True))
