"""How a `Bf16Int8Workspace` holds its bfloat16 keys for a decode step's q·kᵀ on this CPU and model
shape: one row per token `[kv_heads, n, head_dim]` ("rows", read through a transposed view) or
transposed `[kv_heads, head_dim, n]` ("transposed", read as a plain matrix).

A decode step's batched bfloat16 product `[kv_heads, group, head_dim] × [kv_heads, head_dim, n]`
runs oneDNN kernels whose speed depends on the layout, the shape and the CPU. On the AVX-512 EPYC
(BF16, no AMX) of docs/BENCHMARKS.md §5q, over 4,096 held keys read from memory:
- SmolLM2-135M (3 KV heads, group 3, head_dim 64): rows 1.2-1.6x faster; whole decode steps at
  8k 1.03-1.08x;
- Qwen2.5-1.5B (2, 6, 128) and Llama-3.2-3B (8, 3, 128): transposed 1.1-1.3x faster; rows cost
  the 1.5B shape's decode steps 0-3 % at 2k.
So `METHOD = "auto"` (the default) times both once per process and model shape (`transposed_keys`)
when the first workspace is built: random keys at `CALIBRATION_KEYS` tokens, `CALIBRATION_BYTES`
of them in distinct copies read in turn (so that they come from memory as a step's do),
one untimed round, then `CALIBRATION_ROUNDS` alternating rounds, the fastest round of each kept;
60-100 ms here. The two layouts gave equal logits (`torch.equal`) in every measurement here; the
choice is kept for the process, so a process holds every workspace of a shape one way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.kvcache.measured_choices import MeasuredChoices

METHOD = "auto"
""""auto" (measured, module docstring), "rows" or "transposed". Tests and benchmarks set it."""

CALIBRATION_KEYS = 4096
"""Held tokens in the timed products: the default budget, where a long answer decodes."""
CALIBRATION_BYTES = 48 * 1024**2
"""Distinct layers' keys read in turn per round: at least this many bytes of them (at least
`MIN_COPIES` layers), more than a laptop CPU's last-level cache, so that the products read memory
as a decode step's do (within 32 MB of L3 the 135M shape's margin for rows fell from ~1.5x to ~1.1x)."""
MIN_COPIES = 4
CALIBRATION_ROUNDS = 3
"""Alternating rounds of each layout; the fastest of each is compared."""


@dataclass(frozen=True)
class KeyLayout:
    """What `METHOD = "auto"` measured for one model shape: the layout chosen and each layout's
    fastest time per product in µs, with the copies read per round and the torch threads it was
    timed on."""

    transposed: bool
    rows_us: float
    transposed_us: float
    copies: int
    threads: int


_choices: MeasuredChoices[KeyLayout] = MeasuredChoices()


def transposed_keys(kv_heads: int, group: int, head_dim: int, device: torch.device) -> bool:
    """Whether a workspace for this shape (`group` query heads per KV head) holds its keys
    transposed: `METHOD`, or when it is "auto" the measured `KeyLayout` (60-100 ms here, once per
    process and shape; timed with one decode token's `group` query rows, and a draft chunk's few
    rows take the same layout). Raises ValueError for an unknown `METHOD`."""
    if METHOD in ("rows", "transposed"):
        return METHOD == "transposed"
    if METHOD != "auto":
        raise ValueError(f"key_layout.METHOD must be 'auto', 'rows' or 'transposed', got {METHOD!r}")
    key = (kv_heads, group, head_dim, device.type)
    return _choices.get(key, lambda: _measure(kv_heads, group, head_dim, device)).transposed


def measured() -> list[KeyLayout]:
    """The layouts measured so far in this process (for benchmark reports)."""
    return _choices.measured()


def forget_choices() -> None:
    """Drop the measured layouts, so the next workspace measures again (tests, benchmarks)."""
    _choices.forget()


def _measure(kv_heads: int, group: int, head_dim: int, device: torch.device) -> KeyLayout:
    generator = torch.Generator(device="cpu").manual_seed(0)
    keys = torch.randn((kv_heads, CALIBRATION_KEYS, head_dim), generator=generator).to(device, torch.bfloat16)
    query = torch.randn((kv_heads, group, head_dim), generator=generator).to(device, torch.bfloat16)
    copies = max(MIN_COPIES, -(-CALIBRATION_BYTES // keys.nbytes))
    rows = [keys.clone() for _ in range(copies)]
    transposed = [keys.transpose(1, 2).contiguous() for _ in range(copies)]
    ways = {"rows": lambda: rows_products(query, rows), "transposed": lambda: transposed_products(query, transposed)}
    for way in ways.values():  # untimed: oneDNN builds each product's kernel on its first call
        way()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(CALIBRATION_ROUNDS):
        for name, way in ways.items():
            began = time.perf_counter()
            way()
            best[name] = min(best[name], (time.perf_counter() - began) * 1e6 / copies)
    return KeyLayout(best["transposed"] < best["rows"], round(best["rows"], 1), round(best["transposed"], 1), copies,
                     torch.get_num_threads())


def rows_products(query: torch.Tensor, keys: list[torch.Tensor]) -> list[torch.Tensor]:
    """q·kᵀ `[kv_heads, group, n]` of `query` `[kv_heads, group, head_dim]` with each of `keys`
    held one row per token `[kv_heads, n, head_dim]` (bfloat16), as the workspace computes it."""
    return [torch.bmm(query, k.transpose(1, 2)) for k in keys]


def transposed_products(query: torch.Tensor, keys: list[torch.Tensor]) -> list[torch.Tensor]:
    """The same products with each of `keys` held transposed `[kv_heads, head_dim, n]`."""
    return [torch.bmm(query, k) for k in keys]
