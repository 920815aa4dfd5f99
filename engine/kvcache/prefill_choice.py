"""Which way a CPU computes a prefill chunk's attention and H2O scores: measured once per process and
model shape, before the first chunk.

The ways (`attention.chunk_attention` builds them; each returns the output and the scores):
- "float32": `row_blocks.row_block_attention`, float32 throughout, per KV head in blocks of rows.
- "flash": the fused path (`attention._fused_attention`): the output from the bfloat16 flash
  kernel, H2O's sums from it with queries and keys swapped (`column_sums.swapped_flash_sums`).
- "blocked": the fused path with the sums as bfloat16 matmuls in blocks (`column_sums.blocked_sums`).
The last two exist only where the CPU runs bfloat16 natively (AVX-512 BF16); elsewhere "float32" is
the only way and nothing is measured. They differ in rounding only: float32 rounds least, then the
flash sums (0.16 % L1 in the scores, 0.6 % in the output), then the blocked ones (0.21 %). Their
speed depends on the CPU (docs/BENCHMARKS.md §5n, §5p): on the Xeon of §5a the flash kernel with
AMX was fastest; on an AMD EPYC with AVX-512 BF16 and no AMX, float32 was 1.27x the blocked sums
and 1.84x the flash sums.

`METHOD = "auto"` (the default) times each way twice, alternating, on one layer's chunk of the
steady state (`CALIBRATION_CHUNK` queries over `CALIBRATION_KEYS` cached keys, random values), and
takes the first way in `PREFERENCE` whose fastest time is within 1 / `WITHIN` of the fastest's: a
way that rounds less wins a near tie, so a noisy timing cannot flip the choice between two runs.
Every chunk of the process is then computed the same way, so reading the same tokens twice keeps
the same tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

METHOD = "auto"
"""Either "auto" (measured, module docstring) or one way's name, forced (benchmarks and tests)."""

PREFERENCE = ("float32", "flash", "blocked")
"""The ways from the least rounding to the most: the order a near tie is broken in."""
WITHIN = 0.9
"""A way is as fast as the fastest if the fastest takes at least this share of its time."""
CALIBRATION_CHUNK = 512
"""Queries per query head in the timed chunk: the engine's prefill chunk."""
CALIBRATION_KEYS = 4096
"""Cached keys in the timed chunk: the default budget, where a long read spends its time."""
CALIBRATION_ROUNDS = 2
"""Alternating timed calls of each way; the fastest of each is compared."""

Way = Callable[[torch.Tensor, tuple, tuple, float, tuple | None], tuple[torch.Tensor, torch.Tensor]]
"""(query, keys, values, scaling, masks) -> (output, scores), as `attention.chunk_attention` takes them."""


@dataclass(frozen=True)
class Choice:
    """What `METHOD = "auto"` chose for one model shape, and each way's fastest time in ms (one
    layer's chunk: `CALIBRATION_CHUNK` queries per query head over `CALIBRATION_KEYS` + the chunk)."""

    way: str
    ms: dict[str, float] = field(default_factory=dict)


_choices: dict[tuple, Choice] = {}
_lock = threading.Lock()


def way_for(kv_heads: int, group: int, head_dim: int, ways: dict[str, Way]) -> str:
    """The name of the way to compute a chunk of this model shape with, among `ways` (module
    docstring). Raises ValueError if `METHOD` names a way not in `ways`."""
    if METHOD != "auto":
        if METHOD not in ways:
            raise ValueError(f"prefill_choice.METHOD must be 'auto' or one of {sorted(ways)}, got {METHOD!r}")
        return METHOD
    if len(ways) == 1:
        return next(iter(ways))
    key = (kv_heads, group, head_dim, tuple(sorted(ways)), torch.get_num_threads())
    with _lock:
        if key not in _choices:
            _choices[key] = _measure(kv_heads, group, head_dim, ways)
        return _choices[key].way


def measured() -> list[Choice]:
    """The choices made so far in this process (for benchmark reports)."""
    with _lock:
        return list(_choices.values())


def forget_choices() -> None:
    """Drop the measured choices, so the next chunk measures again (tests, benchmarks)."""
    with _lock:
        _choices.clear()


def _measure(kv_heads: int, group: int, head_dim: int, ways: dict[str, Way]) -> Choice:
    generator = torch.Generator().manual_seed(0)
    chunk = CALIBRATION_CHUNK
    query = torch.randn((kv_heads, group, chunk, head_dim), generator=generator)
    keys = (torch.randn((kv_heads, CALIBRATION_KEYS, head_dim), generator=generator),
            torch.randn((kv_heads, chunk, head_dim), generator=generator))
    values = tuple(torch.randn(k.shape, generator=generator) for k in keys)
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(CALIBRATION_ROUNDS):
        for name, way in ways.items():
            began = time.perf_counter()
            way(query, keys, values, head_dim**-0.5, None)
            best[name] = min(best[name], (time.perf_counter() - began) * 1000)
    fastest = min(best.values())
    chosen = next(name for name in (*PREFERENCE, *ways) if name in best and fastest >= WITHIN * best[name])
    return Choice(chosen, {name: round(ms, 2) for name, ms in best.items()})
