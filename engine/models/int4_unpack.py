"""An `Int4Linear`'s weights as float32, unpacked just in time for a prefill chunk on a CPU without
AVX-512 BF16 (`float32_chunks`), so the chunk runs as a float32 matrix product (MKL's sgemm).

Without AVX-512 BF16 a chunk has no bfloat16 reading copy to run on (bfloat16 matmuls are slower
than float32 there, and a float32 copy would hold four times the int4 bytes), so it took torch's
int4 kernel, which is built for a decode step's few rows: on the AVX-512 EPYC held to AVX2 (two
threads) the 1.5B shape's projections at 512 rows ran at 79-103 GFLOP/s on the kernel against
128-144 unpacked to float32 first, the unpacking included, and the 1.5B shape read 1.32x faster
(docs/BENCHMARKS.md §5r). A chunk of 512 rows does 1,024 multiply-adds per weight, so unpacking
each weight once per chunk (read half a byte, write four) cost 20-24 % of the float32 product
there. That is a fixed cost per chunk, where the kernel's grows with the rows: from the same
measurements unpacking pays from ~120-155 rows on, so only chunks of `MIN_ROWS` rows or more unpack
(a document's 512-token chunks; not a short question's chunk, nor a draft's check of up to 65).

The codes are read from the kernel's own packed layout (`aten._convert_weight_to_int4pack_for_cpu`):
per block of `block` output features and each input feature, `block / 2` bytes, byte j holding
output j in its low nibble and output j + block / 2 in its high one. The block is 64 where torch's
kernels run AVX-512 and 32 where they run AVX2; `pack_block` finds it by packing a probe, and a
layout it does not recognise keeps the int4 kernel. Weights are `(code - 8) · scale + zero` in
float32 with the bfloat16 scales and zeros the kernel holds: exactly the weights the kernel applies
(`Int4Linear._quantize`), while the activations stay float32 (the kernel rounds them to bfloat16).

The unpacked weights live in one buffer per thread, grown to the largest layer (the 1.5B shape's
fused gate|up: 110 MB of weights and 27 MB of codes; the 3B-4B shapes' up to ~200 MB and ~50 MB) and
reused by every layer and chunk until `release()` (`Workspace.unload_model` calls it).

`pack_block` recognises the layouts of torch's x86 kernels (AVX-512, AVX2) as built here; where it
does not (other builds or CPUs, unmeasured), chunks keep the int4 kernel.
"""

from __future__ import annotations

import threading
from functools import cache

import torch

MIN_ROWS = 160
"""Rows (tokens) a chunk needs before it unpacks (module docstring)."""

FLOAT32_CHUNKS = "auto"
""""auto" (unpack where the CPU runs no bfloat16 matmuls natively and `pack_block()` is known), "on" or "off":
benchmarks and tests set it to compare with the int4 kernel."""

_buffers: dict[tuple[int, str], torch.Tensor] = {}
"""(thread, name) -> that thread's buffer `name` (`_buffer`)."""


def float32_chunks(bf16_matmuls: bool) -> bool:
    """Whether chunks of int4 layers run unpacked to float32 here (module docstring), on a CPU that
    does (`bf16_matmuls`: `int4_cpu.dense_chunks()`) or does not run bfloat16 matmuls natively.
    Raises ValueError for an unknown `FLOAT32_CHUNKS`."""
    if FLOAT32_CHUNKS == "off":
        return False
    if FLOAT32_CHUNKS not in ("auto", "on"):
        raise ValueError(f"int4_unpack.FLOAT32_CHUNKS must be 'auto', 'on' or 'off', got {FLOAT32_CHUNKS!r}")
    return pack_block() is not None and (FLOAT32_CHUNKS == "on" or not bf16_matmuls)


@cache
def pack_block() -> int | None:
    """Output features per block of this process's int4 packed layout (module docstring), or None."""
    with torch.inference_mode(False):
        codes = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        for block in (64, 32, 16):
            if packed.shape == (128, 32) and torch.equal(_codes_t(packed, 128, 64, block).reshape(64, 128).T.int(), codes):
                return block
    return None


def unpacks(rows: int, out_features: int, bf16_matmuls: bool) -> bool:
    """Whether a chunk of `rows` through a layer with `out_features` runs unpacked: at least
    `MIN_ROWS` rows, `float32_chunks`, and whole blocks."""
    return rows >= MIN_ROWS and float32_chunks(bf16_matmuls) and out_features % pack_block() == 0


def release() -> None:
    """Drop every thread's buffers (the next chunk that unpacks makes them again)."""
    _buffers.clear()


def weight_t(packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, out_features: int) -> torch.Tensor:
    """The weights the int4 kernel applies, transposed: float32 `[in_features, out_features]`, in this
    thread's buffer (valid until its next call). `packed` `[out, in / 2]` uint8 and
    `scales_and_zeros` `[in / 32, out, 2]` bfloat16 as `Int4Linear` holds them; `out_features` in whole
    `pack_block()` blocks."""
    block = pack_block()
    codes_t = _codes_t(packed, out_features, in_features, block, out=_buffer("codes", out_features * in_features, torch.uint8))
    wt = _buffer("weights", out_features * in_features, torch.float32).view(in_features, out_features)
    wt.view(codes_t.shape).copy_(codes_t)
    wt.sub_(8)
    groups = wt.view(in_features // 32, 32, out_features)
    holds = scales_and_zeros.float()
    groups.mul_(holds[:, None, :, 0]).add_(holds[:, None, :, 1])
    return wt


def _codes_t(packed: torch.Tensor, out_features: int, in_features: int, block: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The codes of `packed` read with `block` (module docstring), uint8 `[in_features, out_features /
    block, block]` (a view: output feature b · block + j at `[:, b, j]`)."""
    half = block // 2
    nibbles = packed.view(out_features // block, in_features, half)
    codes = torch.empty((out_features // block, in_features, block), dtype=torch.uint8) if out is None else out.view(
        out_features // block, in_features, block)
    torch.bitwise_and(nibbles, 15, out=codes[..., :half])
    torch.bitwise_right_shift(nibbles, 4, out=codes[..., half:])
    return codes.permute(1, 0, 2)


def _buffer(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's buffer `name`, at least `numel` elements of `dtype` (grown until `release`)."""
    key = (threading.get_ident(), name)
    held = _buffers.get(key)
    if held is None or held.numel() < numel:
        with torch.inference_mode(False):  # usable inside and outside inference mode
            held = torch.empty(numel, dtype=dtype)
        _buffers[key] = held
    return held[:numel]
