"""The estimator against the formula and against what a real LayerKV holds at rest and at its peak."""

import pytest
import torch

from engine.estimate import KNOWN_SHAPES, compressed_cache_bytes, full_cache_bytes, peak_cache_bytes
from engine.kvcache.attention import RotaryTable
from engine.kvcache.cache import CacheShape, LayerKV, StepOptions
from engine.kvcache.quant import SUPPORTED_BITS, KVFormat
from engine.kvcache.sizes import token_bytes
from engine.models.profile import ModelProfile
from engine.settings import CachePolicy


class _Rotary(torch.nn.Module):
    """Default RoPE (theta 10000), shaped like transformers' rotary_emb(x, position_ids)."""

    def __init__(self, head_dim):
        super().__init__()
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def test_llama_3b_headline():
    llama = KNOWN_SHAPES["llama-3.2-3b"]
    assert full_cache_bytes(llama, 1) == 2 * 28 * 8 * 128 * 2 == 114_688
    assert round(full_cache_bytes(llama, 131_072) / 2**30, 1) == 14.0


@pytest.mark.parametrize("n_tokens", [200, 1000])
def test_rest_and_peak_match_a_real_layer(n_tokens):
    profile = ModelProfile("llama", 1, 3, 64, 3, 8192, 100)
    policy = CachePolicy(budget_tokens=256, sink_tokens=4, window_tokens=64, residual_tokens=32, chunk_tokens=64, block_tokens=16)
    layer = LayerKV(CacheShape(1, 3, 64, 3), policy, store_dtype=torch.float16, device=torch.device("cpu"))
    rope = RotaryTable(_Rotary(64), 64, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    peak = 0
    for start in range(0, n_tokens, policy.chunk_tokens):
        c = min(policy.chunk_tokens, n_tokens - start)
        q, k, v = (torch.randn((3, c, 64), generator=gen) for _ in range(3))
        layer.attend(q, k, v, start=start, rope=rope, scaling=0.125, options=StepOptions())
        peak = max(peak, layer.memory().total_bytes)  # the chunk is in, still 16-bit
        layer.compress(start + c, 0)
        peak = max(peak, layer.memory().total_bytes)
    layer.paged.shrink()
    assert sum(t.nbytes for t in layer.tensors().values()) == compressed_cache_bytes(profile, policy, n_tokens)
    if n_tokens > policy.budget_tokens:
        assert peak == peak_cache_bytes(profile, policy, n_tokens)  # exact once evicting
    else:
        assert peak <= peak_cache_bytes(profile, policy, n_tokens)


def test_ratio_text_says_larger_when_a_short_document_costs_more_than_fp16():
    from engine.estimate import estimate
    from engine.units import size_ratio

    smollm, policy = KNOWN_SHAPES["smollm2-135m"], CachePolicy()
    short = estimate(smollm, policy, 100)  # all in the 16-bit residual, plus whole blocks and scores
    assert short.compressed_bytes > short.full_bytes
    assert size_ratio(short.full_bytes, short.compressed_bytes) == f"{short.compressed_bytes / short.full_bytes:.1f}× larger"
    long = estimate(KNOWN_SHAPES["llama-3.2-3b"], policy, 131_072)
    assert size_ratio(long.full_bytes, long.compressed_bytes) == f"{long.full_bytes / long.compressed_bytes:.1f}× smaller"
    assert size_ratio(1, 0) == "—"


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("head_dim,group_size", [(64, 32), (128, 64), (64, 16)])
def test_torch_free_token_bytes_match_the_tensors_a_format_allocates(bits, head_dim, group_size):
    """engine.kvcache.sizes (what the estimator counts) against KVFormat.field_specs (what is stored)."""
    assert token_bytes(head_dim, bits=bits, group_size=group_size) == KVFormat(bits, group_size).bytes_per_token(head_dim)


def test_no_archive_is_estimated_for_a_document_the_cache_keeps_whole():
    """The session writes no archive when the budget keeps the whole document and a question; the
    estimate (the window's header, `halaman estimate`) must not promise one on disk."""
    from engine.estimate import QUESTION_RESERVE_TOKENS, estimate, kept_whole
    from engine.settings import RecallSettings

    policy, recall = CachePolicy(), RecallSettings()
    profile = KNOWN_SHAPES["smollm2-135m"]
    whole = policy.budget_tokens - QUESTION_RESERVE_TOKENS
    assert kept_whole(whole, policy) and not kept_whole(whole + 1, policy)
    assert estimate(profile, policy, whole, recall).archive_bytes == 0
    assert estimate(profile, policy, whole + 1, recall).archive_bytes > 0
    assert estimate(profile, policy, 10 * whole, RecallSettings(archive=False)).archive_bytes == 0


def test_a_3b_model_at_128k_keeps_recall_on_under_a_2_gib_disk_budget():
    """On a disk with little room (the smallest default budget, 2 GiB) a 3B model's archive does
    not fit: its questions re-read their spans; the 135M model's archive fits."""
    from engine.disk_budget import DEFAULT_MIN_BYTES
    from engine.estimate import estimate
    from engine.recall_plan import RecallSource, plan_recall
    from engine.settings import EngineSettings

    settings = EngineSettings(prefix_cache_disk_bytes=DEFAULT_MIN_BYTES)
    budget = settings.prefix_cache_disk_bytes
    llama = KNOWN_SHAPES["llama-3.2-3b"]
    result = estimate(llama, settings.cache, 131_072, settings.recall)
    # 2·L·H_kv·D·½ + scales, zero points, block bounds; then two block digests and one of the bounds per layer
    assert result.archive_bytes == 131_072 * 39_424 + 28 * (2 * 4096 + 1) * 16
    assert result.archive_bytes > budget
    assert plan_recall(settings, llama, 131_072, disk_budget_bytes=budget).source is RecallSource.REREAD
    smol = KNOWN_SHAPES["smollm2-135m"]
    assert plan_recall(settings, smol, 131_072, disk_budget_bytes=budget).source is RecallSource.ARCHIVE
    blocks = settings.replace(recall=settings.recall.replace(selection="blocks"))
    assert plan_recall(blocks, llama, 131_072, disk_budget_bytes=budget).source is RecallSource.OFF


def test_halaman_estimate_says_where_recall_reads_from(tmp_path):
    import os
    import subprocess
    import sys

    from engine.settings import EngineSettings, save_settings

    # A user whose disk budget is 2 GiB (a nearly full disk's default, or chosen).
    (tmp_path / "config").mkdir()
    save_settings(EngineSettings(prefix_cache_disk_bytes=2 * 1024**3), tmp_path / "config" / "settings.toml")
    out = subprocess.run([sys.executable, "-m", "engine.cli", "estimate", "--model", "llama-3.2-3b", "--tokens", "131072"],
                         capture_output=True, text=True, check=True, env={**os.environ, "HALAMAN_HOME": str(tmp_path)}).stdout
    assert "4.8 GiB" in out and "not written" in out and "recall          re-read: its archive (4.8 GiB)" in out


def test_the_default_disk_budget_follows_the_free_disk():
    """Issue 44, item 3: the fixed 2 GiB default evicted a book's reading (its archive alone ~1 GiB)
    within the hour. A new installation's budget is a quarter of the free disk, 2 to 32 GiB."""
    from engine.disk_budget import GIB, default_disk_budget_bytes, sized_for_this_disk
    from engine.settings import EngineSettings

    assert default_disk_budget_bytes(70 * GIB) == 17 * GIB
    assert default_disk_budget_bytes(3 * GIB) == 2 * GIB          # a full disk: the minimum
    assert default_disk_budget_bytes(10_000 * GIB) == 32 * GIB    # a huge one: bounded
    assert EngineSettings().prefix_cache_disk_bytes == sized_for_this_disk()


def test_sizes_print_in_the_unit_they_round_into():
    """SmolLM2-360M's int4 weights (just under 1 GiB) were listed as "1,024.0 MiB" beside "1.0 GiB" rows."""
    from engine.units import format_bytes

    assert format_bytes(0) == "0 B" and format_bytes(1023) == "1,023 B" and format_bytes(1536) == "1.5 KiB"
    assert format_bytes(1024**3 - 1024) == "1.0 GiB"  # 1,023.999 MiB
    assert format_bytes(int(1023.94 * 1024**2)) == "1,023.9 MiB"
    assert format_bytes(5 * 1024**4) == "5.0 TiB" and format_bytes(2048 * 1024**4) == "2,048.0 TiB"
