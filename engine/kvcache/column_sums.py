"""H2O's column sums of a prefill chunk on the fused path (bfloat16 attention on a CPU), and which of
two ways to compute them this CPU runs faster.

A chunk's heavy-hitter scores are `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]` with
`P[i, j] = exp(q_i·k_j·scale - L_i)`, `L_i` each query's log-sum-exp from the output's flash pass
(`attention._fused_attention`). Both ways below take `rows` `[kv_heads, group, chunk, d + 2]` (the
scaled queries with -L_i as two more columns: its bfloat16 high and low parts) and `cols`
`[kv_heads, total, d + 2]` (the keys with two columns of ones), so one product gives log P:

- "flash" (`swapped_flash_sums`): the flash kernel with queries and keys swapped. Less rounding
  (0.16 % L1 against float64 at 4.6k keys). On the Xeon with AVX-512 BF16 and AMX of
  docs/BENCHMARKS.md §5a it was 2-3x faster than "blocked".
- "blocked" (`blocked_sums`): bfloat16 matmuls in blocks of `FUSED_BLOCK_ROWS` query rows
  (oneDNN). 0.21 % L1. On an AMD EPYC with AVX-512 BF16 and no AMX the flash kernel reaches only
  ~30 GFLOP/s, and "blocked" was 2x faster per layer and 1.30x over a whole 8k prefill (§5n, §5p).
  A chunk with masks (a question with recall) always takes it.

Which is faster depends on the CPU, and the two differ only in rounding (0.5 % of the kept positions
after 8k; continuation KL and the needle the same, §5n), so `METHOD = "auto"` (the default) times
both once per process and model shape on a chunk of the steady state's size (`CALIBRATION_CHUNK`
queries over `CALIBRATION_KEYS` cached keys, random values) before the first chunk is scored, and
keeps "flash" unless "blocked" takes less than `SWITCH_BELOW` of its time. It is timed at the thread
count of that first chunk and kept when the thread governor changes the count later, so every chunk
of a process, the first included, is scored the same way, and reading the same tokens twice in one
process keeps the same tokens. Another process may choose otherwise where the two are close or the
CPU is busy while it measures; both ways are exact but for rounding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.kvcache.measured_choices import MeasuredChoices

FUSED_BLOCK_ROWS = 128
"""Query rows (of all KV heads at once) per block of `blocked_sums`: 128 was the fastest of
32-256 for SmolLM2's 3 KV heads over 4.6k keys on this project's 2-core Xeon (2 MB L2 per core)."""

METHOD = "auto"
"""How an unmasked chunk's sums are computed: "auto" (measured, module docstring), "flash" or
"blocked". Benchmarks set it to compare the two."""

CALIBRATION_CHUNK = 512
"""Queries per KV head and query head in the timed chunk: the engine's prefill chunk."""
CALIBRATION_KEYS = 4096
"""Cached keys in the timed chunk: the default budget, where a long read spends its time."""
CALIBRATION_ROUNDS = 2
"""Alternating timed calls of each way; the fastest of each is compared."""
SWITCH_BELOW = 0.9
"""The share of the flash sums' time under which the blocked ones are chosen: the flash sums round
less, so near a tie they are kept."""


@dataclass(frozen=True)
class Choice:
    """What `METHOD = "auto"` measured for one model shape: the way chosen, each way's fastest time
    in ms (one layer's chunk, `CALIBRATION_CHUNK` queries over `CALIBRATION_KEYS` keys) and the
    torch threads it was timed with."""

    method: str
    flash_ms: float
    blocked_ms: float
    threads: int


_choices: MeasuredChoices[Choice] = MeasuredChoices()


def unmasked_sums(rows: torch.Tensor, cols: torch.Tensor, chunk: int) -> torch.Tensor:
    """H2O's scores `[kv_heads, total]` float32 of a chunk without masks (module docstring for
    `rows` and `cols`), by `METHOD`. Raises ValueError for an unknown `METHOD`."""
    method = METHOD
    if method == "auto":
        method = choice_for(rows.shape[0], rows.shape[1], rows.shape[3], rows.device).method
    if method == "flash":
        return swapped_flash_sums(rows, cols, chunk)
    if method == "blocked":
        return blocked_sums(rows, cols, chunk, None)
    raise ValueError(f"column_sums.METHOD must be 'auto', 'flash' or 'blocked', got {method!r}")


def choice_for(kv_heads: int, group: int, width: int, device: torch.device) -> Choice:
    """The measured `Choice` for this model shape (`width` = head_dim + 2), timed on first use
    (a few hundred ms once per process and shape; module docstring)."""
    key = (kv_heads, group, width, device.type)  # not the threads: the governor changes them between chunks
    return _choices.get(key, lambda: _measure(kv_heads, group, width, device))


def measured() -> list[Choice]:
    """The choices made so far in this process (for benchmark reports)."""
    return _choices.measured()


def forget_choices() -> None:
    """Drop the measured choices, so the next chunk measures again (tests, benchmarks)."""
    _choices.forget()


def _measure(kv_heads: int, group: int, width: int, device: torch.device) -> Choice:
    generator = torch.Generator(device="cpu").manual_seed(0)
    chunk, total = CALIBRATION_CHUNK, CALIBRATION_KEYS + CALIBRATION_CHUNK
    rows = torch.randn((kv_heads, group, chunk, width), generator=generator).mul_(0.3)
    rows[..., -2], rows[..., -1] = -8.0, 0.0  # -L_i (high, low): log P near its real range, so exp neither overflows nor vanishes
    cols = torch.randn((kv_heads, total, width), generator=generator).mul_(0.3)
    cols[..., -2:] = 1.0
    rows, cols = rows.to(device, torch.bfloat16), cols.to(device, torch.bfloat16)
    best = {"flash": float("inf"), "blocked": float("inf")}
    ways = {"flash": lambda: swapped_flash_sums(rows, cols, chunk), "blocked": lambda: blocked_sums(rows, cols, chunk, None)}
    for _ in range(CALIBRATION_ROUNDS):
        for name, way in ways.items():
            began = time.perf_counter()
            way()
            best[name] = min(best[name], (time.perf_counter() - began) * 1000)
    method = "blocked" if best["blocked"] < SWITCH_BELOW * best["flash"] else "flash"
    return Choice(method, round(best["flash"], 2), round(best["blocked"], 2), torch.get_num_threads())


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
