"""MemoryBreakdown: the bytes a compressed KV cache holds, by kind.

Torch-free on purpose: an `Answer` carries one, and the command line's `find`, `history` and
`library` commands import `engine.answer` without ever touching a tensor (importing torch costs
seconds on a busy CPU). `engine.kvcache.cache` fills it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class MemoryBreakdown:
    """Bytes held by the cache, by kind. `total_bytes` is the sum of all fields."""

    codes_bytes: int = 0          # quantized K/V codes in used blocks
    quant_meta_bytes: int = 0     # scales and zero points in used blocks
    residual_bytes: int = 0       # 16-bit sinks and residual K/V
    score_bytes: int = 0          # accumulated attention, float32 per slot
    position_bytes: int = 0       # stream positions, int32 per slot
    block_table_bytes: int = 0
    pool_free_bytes: int = 0      # blocks allocated by the pool but not in use
    recalled_bytes: int = 0       # tokens recalled from the archive for the current question

    @property
    def total_bytes(self) -> int:
        return sum(asdict(self).values())

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        return MemoryBreakdown(**{k: v + getattr(other, k) for k, v in asdict(self).items()})
