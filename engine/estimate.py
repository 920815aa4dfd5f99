"""KV-cache memory before anything is loaded: full cache vs. the compressed cache.

Full cache: bytes = 2 (K and V) · L (layers) · H_kv (KV heads) · D (head dim) · bytes per element · N.
For Llama-3.2-3B (L=28, H_kv=8, D=128) at 16 bits that is 114,688 bytes per token and 14.0 GiB at
131,072 tokens.

Compressed cache (what `engine.kvcache.cache` holds at rest, per layer and KV head):
    kept = min(N, budget)
    16-bit: sinks + residual tokens, 2 · D · 2 bytes each
    quantized: the other kept tokens, codes + scale + zero point per group (`KVFormat`, counted
               by `engine.kvcache.sizes`), rounded up to whole blocks of the pool
    per kept token: one float32 score and one int32 position
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kvcache.sizes import HEADER_BYTES_PER_LAYER, archive_bytes, token_bytes
from engine.models.profile import ModelProfile
from engine.settings import CachePolicy, RecallSettings

# Shapes from the public config.json of each model (num_hidden_layers, num_key_value_heads,
# head_dim, num_attention_heads, max_position_embeddings, vocab_size, hidden_size, intermediate_size),
# for estimates without downloading.
KNOWN_SHAPES: dict[str, ModelProfile] = {
    "smollm2-135m": ModelProfile("llama", 30, 3, 64, 9, 8192, 49152, 576, 1536),
    "llama-3.2-1b": ModelProfile("llama", 16, 8, 64, 32, 131072, 128256, 2048, 8192),
    "llama-3.2-3b": ModelProfile("llama", 28, 8, 128, 24, 131072, 128256, 3072, 8192),
    "qwen2.5-3b": ModelProfile("qwen2", 36, 2, 128, 16, 32768, 151936, 2048, 11008),
    "qwen3-4b": ModelProfile("qwen3", 36, 8, 128, 32, 40960, 151936, 2560, 9728),
}


@dataclass(frozen=True)
class KVEstimate:
    """Estimated KV bytes for `n_tokens` tokens of one sequence."""

    n_tokens: int
    full_bytes: int            # 16-bit full cache (the formula above)
    compressed_bytes: int      # compressed cache at rest, metadata included
    kept_tokens: int           # tokens kept per layer and KV head
    peak_bytes: int            # compressed cache at its prefill peak (a 16-bit chunk just arrived)
    recall_bytes: int = 0      # tokens a question may recall, held beside the cache while it is answered
    archive_bytes: int = 0     # disk: the archive of every token (0: the archive is off, or the cache keeps
                               # the whole document); whether it is written: `engine.recall_plan`


def full_cache_bytes(profile: ModelProfile, n_tokens: int, bytes_per_element: int = 2) -> int:
    """2 · L · H_kv · D · bytes_per_element · N."""
    return 2 * profile.num_layers * profile.kv_heads * profile.head_dim * bytes_per_element * n_tokens


def compressed_cache_bytes(profile: ModelProfile, policy: CachePolicy, n_tokens: int) -> int:
    """Bytes the compressed cache holds at rest after `n_tokens` tokens (see module docstring)."""
    kept = min(n_tokens, policy.budget_tokens)
    full_precision = min(kept, policy.sink_tokens + policy.residual_tokens)
    quantized = kept - full_precision
    blocks = -(-quantized // policy.block_tokens)
    per_token = token_bytes(profile.head_dim, bits=policy.kv_bits, group_size=policy.group_size)
    per_head = (
        2 * profile.head_dim * 2 * full_precision
        + 2 * per_token * blocks * policy.block_tokens
        + 8 * kept  # float32 score + int32 position
        + 8 * blocks  # block table entry (int64)
    )
    return profile.num_layers * profile.kv_heads * per_head


def peak_cache_bytes(profile: ModelProfile, policy: CachePolicy, n_tokens: int) -> int:
    """Bytes the compressed cache holds at its prefill peak: a chunk has just arrived, still 16-bit.

    At that moment a layer holds, per KV head: sinks + residual + the new chunk in 16 bits; the
    pool sized for the budget's quantized tokens plus one chunk (blocks freed by the last eviction
    stay in the pool for the next chunk); a score and a position for budget + chunk tokens. Exact
    once the cache has started evicting (n_tokens > budget), an upper bound before.
    """
    kept = min(n_tokens, policy.budget_tokens)
    chunk = min(n_tokens, policy.chunk_tokens)
    full_precision = min(n_tokens, policy.sink_tokens + policy.residual_tokens + chunk)
    quantized_cap = max(0, min(n_tokens, kept + chunk) - policy.sink_tokens - policy.residual_tokens)
    quantized_used = max(0, kept - policy.sink_tokens - policy.residual_tokens)
    per_token = token_bytes(profile.head_dim, bits=policy.kv_bits, group_size=policy.group_size)
    per_head = (
        2 * profile.head_dim * 2 * full_precision
        + 2 * per_token * -(-quantized_cap // policy.block_tokens) * policy.block_tokens
        + 8 * min(n_tokens, kept + chunk)
        + 8 * -(-quantized_used // policy.block_tokens)
    )
    return profile.num_layers * profile.kv_heads * per_head


def recall_cache_bytes(profile: ModelProfile, recall: RecallSettings, group_size: int) -> int:
    """Bytes the recalled tokens of one question hold: per layer and KV head, `recall_tokens` K and V
    in the archive's format plus an int32 position and a float32 attention sum each."""
    per_token = 2 * token_bytes(profile.head_dim, bits=recall.archive_bits, group_size=group_size) + 8
    return profile.num_layers * profile.kv_heads * recall.recall_tokens * per_token if recall.archive else 0


def kv_peak_bytes(profile: ModelProfile, policy: CachePolicy, recall: RecallSettings | None = None) -> int:
    """The most the KV cache holds, in bytes: at its prefill peak (the budget plus one chunk just
    arrived in 16 bits) plus, with `recall`, what a question may recall beside it. The memory
    gauge's mark, the window's "peak", and what "fits" counts for the cache."""
    peak = peak_cache_bytes(profile, policy, policy.budget_tokens + policy.chunk_tokens)
    return peak + (recall_cache_bytes(profile, recall, policy.group_size) if recall else 0)


QUESTION_RESERVE_TOKENS = 512
"""Tokens kept free for the question and the answer: in the budget when deciding whether the cache
keeps a document whole, and in the position range when deciding whether it fits the model's context."""


def kept_whole(n_tokens: int, policy: CachePolicy) -> bool:
    """Whether the cache keeps a document of `n_tokens` whole, with room for a question: nothing is
    evicted, so there is nothing to recall."""
    return n_tokens + QUESTION_RESERVE_TOKENS <= policy.budget_tokens


def archive_disk_bytes(profile: ModelProfile, recall: RecallSettings, group_size: int, n_tokens: int) -> int:
    """Disk bytes of an archive of `n_tokens` tokens (`engine.kvcache.archive`), 0 with the archive off."""
    if not recall.archive or n_tokens < 1:
        return 0
    return archive_bytes(profile.num_layers, profile.kv_heads, profile.head_dim, n_tokens, bits=recall.archive_bits,
                         group_size=group_size, block_tokens=recall.block_tokens)


def snapshot_file_bound(profile: ModelProfile, policy: CachePolicy, n_tokens: int) -> int:
    """Upper bound, in bytes, of the snapshot file a document of `n_tokens` leaves in the prefix
    store: the compressed cache at rest (it saves only the blocks it uses) plus its header."""
    return compressed_cache_bytes(profile, policy, n_tokens) + profile.num_layers * HEADER_BYTES_PER_LAYER


def archive_file_bound(profile: ModelProfile, recall: RecallSettings, group_size: int, n_tokens: int) -> int:
    """Upper bound, in bytes, of the archive file of `n_tokens` tokens: `archive_disk_bytes` plus its header."""
    return archive_disk_bytes(profile, recall, group_size, n_tokens) + profile.num_layers * HEADER_BYTES_PER_LAYER


def estimate(profile: ModelProfile, policy: CachePolicy, n_tokens: int, recall: RecallSettings | None = None) -> KVEstimate:
    """Full vs. compressed KV bytes for `n_tokens`, at rest and at the prefill peak; with `recall`,
    also the memory a question's recalled tokens take and the archive's size on disk."""
    return KVEstimate(
        n_tokens=n_tokens,
        full_bytes=full_cache_bytes(profile, n_tokens),
        compressed_bytes=compressed_cache_bytes(profile, policy, n_tokens),
        kept_tokens=min(n_tokens, policy.budget_tokens),
        peak_bytes=peak_cache_bytes(profile, policy, n_tokens),
        recall_bytes=recall_cache_bytes(profile, recall, policy.group_size) if recall else 0,
        archive_bytes=(archive_disk_bytes(profile, recall, policy.group_size, n_tokens)
                       if recall and not kept_whole(n_tokens, policy) else 0),
    )
