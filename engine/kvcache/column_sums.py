"""H2O's column sums of a prefill chunk on the fused path (bfloat16 attention on a CPU): two ways.

A chunk's heavy-hitter scores are `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]` with
`P[i, j] = exp(q_i·k_j·scale - L_i)`, `L_i` each query's log-sum-exp from the output's flash pass
(`attention._fused_attention`). Both ways take `rows` `[kv_heads, group, chunk, d + 2]` (the scaled
queries with -L_i as two more columns: its bfloat16 high and low parts) and `cols`
`[kv_heads, total, d + 2]` (the keys with two columns of ones), so one product gives log P:

- "flash" (`swapped_flash_sums`): the flash kernel with queries and keys swapped. Less rounding
  (0.16 % L1 against float64 at 4.6k keys). On the Xeon with AVX-512 BF16 and AMX of
  docs/BENCHMARKS.md §5a it was 2-3x faster than "blocked".
- "blocked" (`blocked_sums`): bfloat16 matmuls in blocks of `FUSED_BLOCK_ROWS` query rows
  (oneDNN). 0.21 % L1. On an AMD EPYC with AVX-512 BF16 and no AMX it was 2x faster (§5n). A chunk
  with masks (a question with recall) always takes it.

Which one a CPU runs is measured at start (`prefill_choice`).
"""

from __future__ import annotations

import torch

FUSED_BLOCK_ROWS = 128
"""Query rows (of all KV heads at once) per block of `blocked_sums`: 128 was the fastest of
32-256 for SmolLM2's 3 KV heads over 4.6k keys on this project's 2-core Xeon (2 MB L2 per core)."""


def swapped_flash_sums(rows: torch.Tensor, cols: torch.Tensor, chunk: int) -> torch.Tensor:
    """H2O's scores `[kv_heads, total]` float32 of a chunk without masks, from the flash kernel
    (`_scaled_dot_product_flash_attention_for_cpu`) with the roles of queries and keys swapped:
    each key becomes a query over the chunk's queries (all of its group), so the kernel's
    log-sum-exp of key j is log Σ_i exp(q_gi·k_j - L_gi) per query head g, and the score is the sum
    of their exponentials. bfloat16 in; the kernel accumulates, exponentiates and sums in float32.
    The chunk's own keys see only the queries at or after them: in reversed order that is the
    kernel's causal mask. The values the kernel must also multiply are the queries (it takes one
    head size); their output is dropped."""
    group, total = rows.shape[1], cols.shape[1]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    own_keys, own_queries = cols[:, None, total - chunk :].flip(2), rows.flip(2)
    _, own = flash(own_keys.expand(-1, group, -1, -1), own_queries, own_queries, 0.0, is_causal=True, scale=1.0)[:2]
    scores = own.exp().sum(dim=1).flip(-1)  # [kv_heads, chunk]
    if total > chunk:
        _, cached = flash(cols[:, None, : total - chunk].expand(-1, group, -1, -1), rows, rows, 0.0, scale=1.0)[:2]
        scores = torch.cat((cached.exp().sum(dim=1), scores), dim=1)
    return scores


def blocked_sums(rows: torch.Tensor, cols: torch.Tensor, chunk: int, hidden: torch.Tensor | None) -> torch.Tensor:
    """H2O's scores `[kv_heads, total]` float32 of a chunk in blocks of `FUSED_BLOCK_ROWS` query rows,
    each one bfloat16 matmul of `rows` against `cols` giving log P directly (the float32
    accumulator subtracts L_i, so log P is rounded only where it is near 0, for the probabilities
    that matter); `exp` and the block's column sum in bfloat16, the running sum float32.
    hidden: `[kv_heads, chunk, total]` bool (True = not attended) or None for a chunk without masks
    (then only the chunk's own later keys are hidden)."""
    kv_heads, group, _, width = rows.shape
    total, device = cols.shape[1], rows.device
    rows, cols = rows.reshape(kv_heads, group * chunk, width), cols.transpose(1, 2)  # rows kv, g·chunk + i
    ones = rows.new_ones((kv_heads, 1, FUSED_BLOCK_ROWS))
    later = None if hidden is not None else torch.ones(chunk, chunk, dtype=torch.bool, device=device).triu_(1)
    scores = torch.zeros((kv_heads, total), dtype=torch.float32, device=device)
    for first in range(0, group * chunk, FUSED_BLOCK_ROWS):
        block = slice(first, min(first + FUSED_BLOCK_ROWS, group * chunk))
        log_p = torch.matmul(rows[:, block], cols)  # [kv_heads, rows, total]
        queries = torch.arange(block.start, block.stop, device=device) % chunk
        if hidden is not None:
            log_p.masked_fill_(hidden[:, queries], float("-inf"))
        else:
            log_p[..., total - chunk :].masked_fill_(later[queries], float("-inf"))
        scores += torch.matmul(ones[..., : log_p.shape[1]], log_p.exp_()).squeeze(1)
    return scores
