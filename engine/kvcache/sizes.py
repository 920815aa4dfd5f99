"""Byte counts of the cache's storage formats, as plain arithmetic (no torch).

The estimator (`engine.estimate`) runs before any model is loaded, in the settings dialog and in
`halaman estimate`, so it must not pull in torch. These functions count what `quant.KVFormat`
and `archive.ArchiveLayout` allocate; tests check them against the real tensors and files.
"""

from __future__ import annotations

FLOAT16_BYTES = 2  # scale, zero point, 16-bit codes and the archive's key bounds are float16
DIGEST_BYTES = 16  # one BLAKE2b-128 digest of an archive block (`engine.kvcache.archive`)
HEADER_BYTES_PER_LAYER = 2048
"""An upper bound on the safetensors header (JSON: name, dtype, shape and offsets of each tensor)
that a snapshot or an archive file spends per layer; tests check it against real files."""


def token_bytes(head_dim: int, *, bits: int, group_size: int) -> int:
    """Bytes one token of one head (K or V) takes in `KVFormat(bits, group_size)`, metadata included:
    16 bits: `head_dim` float16 values; else `head_dim · bits / 8` bytes of codes plus a float16
    scale and zero point per group of `group_size` channels."""
    if bits == 16:
        return head_dim * FLOAT16_BYTES
    return head_dim * bits // 8 + 2 * (head_dim // group_size) * FLOAT16_BYTES


def archive_bytes(num_layers: int, kv_heads: int, head_dim: int, n_tokens: int, *, bits: int, group_size: int,
                  block_tokens: int) -> int:
    """Size on disk of an archive of `n_tokens` tokens (`engine.kvcache.archive`), header excluded
    (a few KiB, `HEADER_BYTES_PER_LAYER`): per layer, K and V of every token and head, a float16 key
    minimum and maximum per block of `block_tokens`, head and channel, and the block's two digests
    (keys, values) plus one for the layer's bounds."""
    n_blocks = -(-n_tokens // block_tokens)
    per_layer = (2 * n_tokens * kv_heads * token_bytes(head_dim, bits=bits, group_size=group_size)
                 + 2 * n_blocks * kv_heads * head_dim * FLOAT16_BYTES
                 + (2 * n_blocks + 1) * DIGEST_BYTES)
    return num_layers * per_layer
