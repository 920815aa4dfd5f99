"""The fused prefill path (bfloat16 attention on a CPU) after its speed changes: what a chunk's
attention returns, and what a prefill of a real document keeps, against the code before them."""

import pytest
import torch

from engine.kvcache import attention, column_sums
from engine.kvcache.attention import chunk_attention

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def per_head_flash(q, k, v):
    """The cached keys' flash call as it was: one kernel head per query head, keys and values
    broadcast over the group (stride 0)."""
    group = q.shape[1]
    return FLASH(q, k[:, None].expand(-1, group, -1, -1), v[:, None].expand(-1, group, -1, -1), 0.0, scale=1.0)[:2]


def random_chunk(seed, held=300, chunk=100, kv_heads=3, group=3, d=64):
    torch.manual_seed(seed)
    query = torch.randn(kv_heads, group, chunk, d) * 2
    keys = (torch.randn(kv_heads, held, d) * 2, torch.randn(kv_heads, chunk, d) * 2)
    values = (torch.randn(kv_heads, held, d), torch.randn(kv_heads, chunk, d))
    return query, keys, values


def test_folded_flash_is_the_per_head_call_bit_for_bit():
    query, keys, values = random_chunk(0)
    q = (query * 0.125).to(torch.bfloat16)
    k, v = keys[0].to(torch.bfloat16), values[0].to(torch.bfloat16)
    output, lse = attention._folded_flash(q, k, v)
    old_output, old_lse = per_head_flash(q, k, v)
    assert torch.equal(output, old_output) and torch.equal(lse, old_lse)


def test_fused_chunk_attention_unchanged(monkeypatch):
    """A whole fused chunk (output and H2O scores) equals the one computed with the per-head call."""
    query, keys, values = random_chunk(1)
    new = chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)
    monkeypatch.setattr(attention, "_folded_flash", per_head_flash)
    old = chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])


def test_blocked_column_sums_without_masks(monkeypatch):
    """column_sums.METHOD = "blocked" (the matmul pass a masked chunk takes) on an unmasked chunk: the scores
    of the masked path with every key kept but for the log-sum-exps' last bits (one flash call with
    a mask there, two merged here), within 1 % of the flash kernel's column sums (L1), and the mass
    per KV head kept (group · chunk)."""
    query, keys, values = random_chunk(2, held=260, chunk=90)
    monkeypatch.setattr(column_sums, "METHOD", "flash")
    flash = chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)[1]
    keep_all = (torch.ones(keys[0].shape[:2], dtype=torch.bool), None)
    masked = chunk_attention(query, keys, values, scaling=0.125, masks=keep_all, attention_dtype=torch.bfloat16)[1]
    monkeypatch.setattr(column_sums, "METHOD", "blocked")
    blocked = chunk_attention(query, keys, values, scaling=0.125, masks=(None, None), attention_dtype=torch.bfloat16)[1]
    assert float((blocked - masked).abs().sum() / masked.sum()) < 1e-3
    assert float((blocked - flash).abs().sum() / flash.sum()) < 1e-2
    assert not torch.equal(blocked, flash)  # a different rounding: why it is not the default
    torch.testing.assert_close(blocked.sum(dim=1), torch.full((3,), 3.0 * 90), rtol=1e-2, atol=0)


@pytest.fixture(scope="module")
def book_ids(corpus):
    from engine.documents import load_document
    from engine.models.loader import load_model

    lm = load_model("default", device="cpu", weights="int4")
    doc = load_document(corpus / "pdf" / "P16_thinkpython2.pdf")
    text = "\n\n".join(s.text for s in doc.segments[:60])
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 5120
    return lm, torch.tensor(ids[:5120])


def test_prefill_keeps_the_same_tokens_on_a_real_document(book_ids, monkeypatch):
    """The int4 default model on the fused path (bfloat16 attention, forced on any CPU), 5,120 tokens
    of Think Python in the default policy (compact positions; the budget of 4,096 is passed twice,
    so two evictions): every layer's kept positions and scores equal those of the per-head call."""
    from engine.settings import CachePolicy

    lm, ids = book_ids
    monkeypatch.setattr(lm.decoder, "attention_dtype", torch.bfloat16)
    policy = CachePolicy(position_mode="compact")
    caches = []
    for flash in (attention._folded_flash, per_head_flash):
        monkeypatch.setattr(attention, "_folded_flash", flash)
        cache = lm.decoder.new_cache(policy, "compact")
        lm.decoder.prefill(ids, cache)
        caches.append(cache)
    new, old = caches
    assert new.layers[0].n_tokens == policy.budget_tokens  # evicted down to the budget
    for a, b in zip(new.layers, old.layers, strict=True):
        assert torch.equal(a.index, b.index) and torch.equal(a.score, b.score)
