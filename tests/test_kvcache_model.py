"""The compressed cache on the real embedded model, against transformers' DynamicCache.

Reference runs use the very same 4-bit model through transformers' own forward, so any difference
comes from the cache: 16-bit storage must match tightly, INT4 within a measured KL bound.
"""

import pytest
import torch
from transformers import DynamicCache

from engine.estimate import compressed_cache_bytes, full_cache_bytes
from engine.settings import CachePolicy

PROMPT = (
    "The KV cache stores the keys and values of every token a transformer has seen, so decoding the "
    "next token costs one pass instead of a pass over the whole prompt. Long documents make it large: "
    "it grows linearly with the number of tokens, the number of layers and the number of KV heads. "
    "Halaman keeps attention sinks, a recent window and the heavy hitters, and stores them in four bits."
)


@pytest.fixture(scope="module")
def text_ids(smol):
    ids = smol.tokenizer(PROMPT * 3, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids[:300])


def reference_run(model, ids, steps):
    """Prefill logits and `steps` greedy decode steps with transformers' DynamicCache."""
    with torch.no_grad():
        cache = DynamicCache()
        out = model(ids[None], past_key_values=cache, use_cache=True)
        prefill = out.logits[0].float()
        tokens, step_logits = [], []
        nxt = int(prefill[-1].argmax())
        for _ in range(steps):
            tokens.append(nxt)
            logits = model(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True).logits[0, -1].float()
            step_logits.append(logits)
            nxt = int(logits.argmax())
    return prefill, tokens, torch.stack(step_logits)


def compressed_run(decoder, ids, policy, tokens, mode="original"):
    """The same computation through the compressed cache; decode steps are teacher-forced with `tokens`."""
    cache = decoder.new_cache(policy, mode)
    chunks = [decoder.forward(ids[i : i + policy.chunk_tokens], cache, all_logits=True) for i in range(0, len(ids), policy.chunk_tokens)]
    steps = [decoder.forward(torch.tensor([t]), cache)[0] for t in tokens]
    return torch.cat(chunks), torch.stack(steps), cache


def kl(reference_logits, logits):
    p = torch.log_softmax(reference_logits, -1)
    q = torch.log_softmax(logits, -1)
    return (p.exp() * (p - q)).sum(-1)


def test_16bit_without_eviction_matches_dynamic_cache(smol, text_ids):
    ref_prefill, ref_tokens, ref_steps = reference_run(smol.decoder.model, text_ids, 20)
    policy = CachePolicy(budget_tokens=1024, window_tokens=512, kv_bits=16, chunk_tokens=128)
    prefill, steps, cache = compressed_run(smol.decoder, text_ids, policy, ref_tokens)
    assert cache.n_tokens == len(text_ids) + 20  # nothing evicted
    # float16 storage of K/V against transformers' float32 cache: measured max |Δlogit| 0.009
    assert float((prefill - ref_prefill).abs().max()) < 0.05
    assert float((steps - ref_steps).abs().max()) < 0.05
    assert float(kl(ref_prefill, prefill).max()) < 1e-4
    assert torch.equal(prefill.argmax(-1), ref_prefill.argmax(-1))
    assert steps.argmax(-1)[:-1].tolist() == ref_tokens[1:]  # the same 20 greedy tokens


def test_int4_without_eviction_stays_close(smol, text_ids):
    ref_prefill, ref_tokens, ref_steps = reference_run(smol.decoder.model, text_ids, 20)
    policy = CachePolicy(budget_tokens=1024, window_tokens=512, kv_bits=4, group_size=32, residual_tokens=32, chunk_tokens=64)
    prefill, steps, _ = compressed_run(smol.decoder, text_ids, policy, ref_tokens)
    divergence = kl(torch.cat([ref_prefill, ref_steps]), torch.cat([prefill, steps]))
    # measured here: mean KL 1.2e-3-3e-3 nats, 97-99 % greedy agreement (INT4, group 32)
    assert float(divergence.mean()) < 1e-2
    agree = (torch.cat([prefill, steps]).argmax(-1) == torch.cat([ref_prefill, ref_steps]).argmax(-1)).float().mean()
    assert float(agree) > 0.9
    # and quantization really happened: INT4 is measurably different from the 16-bit run
    assert float(divergence.mean()) > 1e-6


def test_h2o_scores_equal_attention_column_sums(smol, text_ids):
    """S_j = Σ_τ Σ_h A[h, τ, j] from transformers' eager attention weights, per KV group."""
    model = smol.decoder.model
    ids = text_ids[:160]
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(ids[None], output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
    policy = CachePolicy(budget_tokens=512, window_tokens=256, kv_bits=16, chunk_tokens=48)
    cache = smol.decoder.new_cache(policy, "original")
    smol.decoder.prefill(ids, cache)
    group = smol.profile.query_heads // smol.profile.kv_heads
    for layer, attn in zip(cache.layers, attentions, strict=True):
        reference = attn[0].float().reshape(smol.profile.kv_heads, group, len(ids), len(ids)).sum(dim=(1, 2))
        torch.testing.assert_close(layer.score, reference, rtol=2e-2, atol=2e-3)


def test_eviction_keeps_sinks_window_and_budget(smol, text_ids):
    policy = CachePolicy(budget_tokens=96, sink_tokens=4, window_tokens=32, residual_tokens=16, kv_bits=4, chunk_tokens=40, block_tokens=16)
    cache = smol.decoder.new_cache(policy, "original")
    smol.decoder.prefill(text_ids, cache)
    n = len(text_ids)
    for layer in cache.layers:
        assert layer.index.shape == (smol.profile.kv_heads, 96)
        for row in layer.index.tolist():
            assert row == sorted(row)
            assert set(range(4)) <= set(row)
            assert set(range(n - 32, n)) <= set(row)
    # heads choose different heavy hitters (selection is per KV head)
    assert any(len({tuple(r) for r in layer.index.tolist()}) > 1 for layer in cache.layers)
    # the pool never held more than budget + one chunk (+ a residual batch) per head
    for layer in cache.layers:
        assert layer.paged.pool.capacity_blocks <= layer.paged.pool.max_blocks


def test_byte_accounting_equals_tensor_nbytes_and_estimate(smol, text_ids):
    for policy in (
        CachePolicy(budget_tokens=96, window_tokens=32, residual_tokens=16, kv_bits=4, chunk_tokens=40, block_tokens=16),
        CachePolicy(budget_tokens=1024, window_tokens=256, residual_tokens=64, kv_bits=8, chunk_tokens=128),
        CachePolicy(budget_tokens=1024, window_tokens=256, residual_tokens=64, kv_bits=16, chunk_tokens=128),
    ):
        cache = smol.decoder.new_cache(policy, "compact")
        smol.decoder.prefill(text_ids, cache)
        held = sum(t.nbytes for layer in cache.layers for t in layer.tensors().values())
        assert cache.memory().total_bytes == held
        cache.shrink()
        held = sum(t.nbytes for layer in cache.layers for t in layer.tensors().values())
        assert cache.memory().total_bytes == held
        assert cache.memory().pool_free_bytes == 0
        assert compressed_cache_bytes(smol.profile, policy, len(text_ids)) == held


def test_16bit_payload_is_the_textbook_formula(smol, text_ids):
    # 4 sinks + 64 residual + 2 blocks of 64: the K/V payload is exactly 2·L·H_kv·D·2·N
    n = 4 + 64 + 128
    policy = CachePolicy(budget_tokens=1024, window_tokens=256, residual_tokens=64, kv_bits=16, chunk_tokens=256, block_tokens=64)
    cache = smol.decoder.new_cache(policy, "original")
    smol.decoder.prefill(text_ids[:n], cache)
    mem = cache.memory()
    assert mem.codes_bytes + mem.residual_bytes == full_cache_bytes(smol.profile, n) == 30 * 3 * 64 * 2 * 2 * n


def test_export_restore_and_fork_continue_identically(smol, text_ids):
    policy = CachePolicy(budget_tokens=128, window_tokens=48, residual_tokens=16, kv_bits=4, chunk_tokens=64, block_tokens=16)
    cache = smol.decoder.new_cache(policy, "compact")
    smol.decoder.prefill(text_ids, cache)
    cache.shrink()
    tensors, meta = cache.export()
    restored = type(cache).restore(tensors, meta, shape=smol.decoder.shape, policy=policy, device=torch.device("cpu"), store_dtype=cache.store_dtype)
    twin = cache.fork()
    probe = torch.tensor([42, 43, 44])
    a = smol.decoder.forward(probe, cache)
    b = smol.decoder.forward(probe, restored)
    c = smol.decoder.forward(probe, twin)
    assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ValueError):
        type(cache).restore(tensors, meta, shape=smol.decoder.shape, policy=policy.replace(kv_bits=8), device=torch.device("cpu"), store_dtype=cache.store_dtype)


@pytest.mark.parametrize("mode", ["original", "compact"])
def test_decode_workspace_changes_nothing(smol, text_ids, mode):
    """Reusing dequantized, rotated keys across decode steps gives the logits a rebuild from the
    same stored cache gives, step after step across flushes and evictions.

    The reference is a copy of the very cache the workspace decodes (a fork holds no workspace):
    two caches decoded side by side would drift apart by themselves, since a 1e-5 difference in a
    new token's key can round to another 16-bit value in the residual and change later evictions."""
    policy = CachePolicy(budget_tokens=96, window_tokens=32, residual_tokens=16, kv_bits=4, chunk_tokens=64, block_tokens=16)
    reused = smol.decoder.new_cache(policy, mode)
    smol.decoder.prefill(text_ids[:200], reused)
    evictions = 0
    for token in text_ids[200:280].tolist():  # 80 steps: several flushes and evictions with slack 8
        rebuilt = reused.fork()
        assert rebuilt.workspace_bytes() == 0
        held = reused.layers[3].n_tokens
        a = smol.decoder.forward(torch.tensor([token]), rebuilt, slack_tokens=8)
        b = smol.decoder.forward(torch.tensor([token]), reused, slack_tokens=8, reuse_workspace=True)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert torch.equal(rebuilt.layers[3].index, reused.layers[3].index)
        evictions += reused.layers[3].n_tokens < held
    assert evictions >= 2 and reused.workspace_bytes() > 0
    reused.release_workspace()
    assert reused.workspace_bytes() == 0


@pytest.mark.parametrize("attention", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("mode", ["original", "compact"])
def test_decode_workspace_survives_flushes_and_evictions_exactly(smol, text_ids, mode, attention):
    """Flushes append to the workspace and evictions compact it (recall off): the logits equal, bit
    for bit, those of a workspace rebuilt from the pool at every step, and it is never rebuilt.
    bfloat16 attention (int4 weights on AVX-512 BF16) decodes over a `Bf16Int8Workspace`, int8
    steps (int4 weights without it) over an `Int8Workspace`."""
    from engine.kvcache.decode_workspace import Bf16Int8Workspace, DenseWorkspace, Int8Workspace
    from engine.models.decoder import CompressedDecoder

    decoder = {"float32": lambda: smol.decoder,
               "bfloat16": lambda: CompressedDecoder(smol.decoder.model, attention_dtype=torch.bfloat16),
               "int8": lambda: CompressedDecoder(smol.decoder.model, int8_steps=True)}[attention]()
    policy = CachePolicy(budget_tokens=100, window_tokens=32, residual_tokens=16, kv_bits=4, chunk_tokens=64, block_tokens=16)
    rebuilt = decoder.new_cache(policy, mode)
    decoder.prefill(text_ids[:200], rebuilt)
    kept = rebuilt.fork()
    decoder.forward(text_ids[200:201], kept, slack_tokens=8, reuse_workspace=True)
    decoder.forward(text_ids[200:201], rebuilt, slack_tokens=8, reuse_workspace=True)
    held = kept.layers[5]._workspace.held
    assert type(held) is {"float32": DenseWorkspace, "bfloat16": Bf16Int8Workspace, "int8": Int8Workspace}[attention]
    for token in text_ids[201:281].tolist():  # 80 steps: a flush and an eviction every 9 tokens (slack 8)
        rebuilt.release_workspace()
        a = decoder.forward(torch.tensor([token]), rebuilt, slack_tokens=8, reuse_workspace=True)
        b = decoder.forward(torch.tensor([token]), kept, slack_tokens=8, reuse_workspace=True)
        assert torch.equal(a, b)
    assert kept.layers[5]._workspace.held is held  # appended to and compacted, never rebuilt


def test_compact_positions_run_past_the_models_context(smol):
    """A stream longer than max_position_embeddings (8192): compact positions stay below budget + chunk."""
    from engine.models.decoder import CompressedDecoder

    decoder = CompressedDecoder(smol.decoder.model)  # its own RoPE table: other tests grow the shared one (archives)
    policy = CachePolicy(budget_tokens=256, window_tokens=64, residual_tokens=32, kv_bits=4, chunk_tokens=512)
    cache = decoder.new_cache(policy, "compact")
    filler = torch.randint(100, 40000, (8192 + 700,), generator=torch.Generator().manual_seed(0))
    logits = decoder.prefill(filler, cache)
    assert cache.seen_tokens == 8892 and cache.n_tokens == 256
    assert torch.isfinite(logits).all()
    assert decoder.rope._cos.shape[0] < 8192  # positions never reached the model's limit


def test_decoding_evicts_in_batches_of_a_32nd_of_the_budget(smol):
    """An answer's cache grows past its budget by 1/32 of it, then evicts back down in one batch
    (`decode_eviction_slack`): 64 tokens at a 2,048-token budget, where a fixed batch would not scale."""
    from engine.generate import decode_one
    from engine.kvcache.cache import decode_eviction_slack

    ids = smol.tokenizer(PROMPT * 40, add_special_tokens=False)["input_ids"][:2200]
    policy = CachePolicy(budget_tokens=2048)
    cache = smol.decoder.new_cache(policy, "original")
    smol.decoder.prefill(torch.tensor(ids), cache)
    assert cache.n_tokens == 2048 and cache.decode_slack == decode_eviction_slack(2048) == 64
    held, token = [], ids[-1]
    with torch.inference_mode():
        for _ in range(100):
            token = int(decode_one(smol.decoder, token, cache, reuse_workspace=True)[-1].argmax())
            held.append(cache.n_tokens)
    assert max(held) == 2048 + 64 and held.count(2048) == 1
    assert held[held.index(2048) - 1] == 2048 + 64  # one eviction of 65 tokens, right after the cap
