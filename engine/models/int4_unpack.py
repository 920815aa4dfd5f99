"""An `Int4Linear`'s weights unpacked just in time for a prefill chunk, for a layer that keeps no
bfloat16 reading copy: to float32 on a CPU without AVX-512 BF16 (MKL's sgemm), to bfloat16 on one
with it (oneDNN's bfloat16 matmul, AMX where present), one tile of output features at a time
(`product`).

Why: torch's int4 kernel is built for a decode step's few rows. Without AVX-512 BF16 a chunk has no
bfloat16 copy to run on (bfloat16 matmuls are slower than float32 there), and on the AVX-512 EPYC
held to AVX2 (two threads) the 1.5B shape's projections at 512 rows ran at 79-103 GFLOP/s on the
kernel against 128-144 unpacked to float32 first, the unpacking included; the 1.5B shape read 1.32x
faster (docs/BENCHMARKS.md §5r). With AVX-512 BF16 a model whose bfloat16 weights pass
`weight_format.READING_COPY_MAX_BYTES` keeps no reading copy (~3.2x its int4 layers' codes, scales
and zeros: 2.6 GB for a 1.5B model), and its chunks unpack to bfloat16 instead of taking the kernel,
2.4-3.5x the kernel's rate on the AMX Xeon of §5s.

Unpacking each weight once per chunk is a fixed cost per chunk, where the kernel's grows with the
rows: to float32 (held to AVX2) it paid between 128 and 256 rows (§5s), so only chunks of
`MIN_ROWS` rows or more unpack (a document's 512-token chunks; not a short question's chunk, nor a
draft's check of up to 65).

The codes are read from the kernel's own packed layout (`aten._convert_weight_to_int4pack_for_cpu`):
per block of `block` output features and each input feature, `block / 2` bytes, byte j holding
output j in its low nibble and output j + block / 2 in its high one. The block is 64 where torch's
kernels run AVX-512 and 32 where they run AVX2; `pack_block` finds it by packing a probe, and a
layout it does not recognise keeps the int4 kernel. Weights are `(code - 8) · scale + zero` in
float32 with the bfloat16 scales and zeros the kernel holds: exactly the weights the kernel applies
(`Int4Linear._quantize`); to bfloat16 they are rounded once from those, exactly the reading copy a
smaller model keeps. On the float32 path the activations stay float32 (the kernel rounds them to
bfloat16).

A tile is about `TILE_WEIGHTS` weights (whole blocks of output features), unpacked into buffers of
this thread and multiplied at once, so the buffers stay ~15 MB whatever the layer; `release()`
drops them (`Workspace.unload_model` calls it).

`pack_block` recognises the layouts of torch's x86 kernels (AVX-512, AVX2) as built here; where it
does not (other builds or CPUs, unmeasured), chunks keep the int4 kernel.
"""

from __future__ import annotations

import threading
from functools import cache

import torch

MIN_ROWS = 160
"""Rows (tokens) a chunk needs before it unpacks (module docstring)."""

TILE_WEIGHTS = 1 << 21
"""Weights unpacked and multiplied at a time (module docstring): 2 Mi weights are 14 MB of codes,
float32 and bfloat16 buffers (tiles of 1,344 output features of the 1.5B shape's gate|up, 192 of
its down projection); tiles of 1,024 and 256 read fastest of those tried on the AMX Xeon (§5s)."""

UNPACKED_CHUNKS = True
"""Chunks of layers without a reading copy unpack (module docstring); benchmarks and tests set False
to compare with the int4 kernel."""

_buffers: dict[tuple[int, str], torch.Tensor] = {}
"""(thread, name) -> that thread's buffer `name` (`_buffer`)."""


@cache
def pack_block() -> int | None:
    """Output features per block of this process's int4 packed layout (module docstring), or None."""
    with torch.inference_mode(False):
        codes = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        for block in (64, 32, 16):
            if packed.shape != (128, 32):
                break
            unpacked = _codes(packed.view(128 // block, 64, block // 2), block)  # [blocks, in, block]
            if torch.equal(unpacked.permute(0, 2, 1).reshape(128, 64).int(), codes):
                return block
    return None


def unpacks(rows: int, out_features: int) -> bool:
    """Whether a chunk of `rows` through a layer with `out_features` (and no reading copy) runs
    unpacked: at least `MIN_ROWS` rows, `UNPACKED_CHUNKS`, a known packed layout and whole blocks."""
    block = pack_block() if UNPACKED_CHUNKS and rows >= MIN_ROWS else None
    return block is not None and out_features % block == 0


def release() -> None:
    """Drop every thread's buffers (the next chunk that unpacks makes them again)."""
    _buffers.clear()


def product(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int,
            out_features: int) -> torch.Tensor:
    """`x` `[rows, in_features]` (float32 or bfloat16) times the transposed weights the int4 kernel
    applies, unpacked a tile at a time (module docstring): `[rows, out_features]` in `x`'s dtype,
    the weights unpacked to that dtype. `packed` `[out, in / 2]` uint8 and `scales_and_zeros`
    `[in / 32, out, 2]` bfloat16 as `Int4Linear` holds them; `out_features` in whole `pack_block()`
    blocks. Raises RuntimeError (torch's) on shapes that do not match."""
    block = pack_block()
    per_tile = max(1, TILE_WEIGHTS // (in_features * block))
    blocks = out_features // block
    out = torch.empty((x.shape[0], out_features), dtype=x.dtype, device=x.device)
    for first in range(0, blocks, per_tile):
        last = min(blocks, first + per_tile)
        wt = _unpacked(packed, scales_and_zeros, in_features, (first, last), x.dtype)
        out[:, first * block : last * block].copy_(torch.mm(x, wt))
    return out


def weight_t(packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, out_features: int,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weights the int4 kernel applies, transposed, `[in_features, out_features]` of `dtype`
    (float32, or bfloat16 rounded once from it), in this thread's buffers (valid until its next
    call); arguments as `product`'s. For tests and benchmarks: chunks run `product`."""
    return _unpacked(packed, scales_and_zeros, in_features, (0, out_features // pack_block()), dtype)


def _unpacked(packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, blocks: tuple[int, int],
              dtype: torch.dtype) -> torch.Tensor:
    """The transposed weights of output blocks `first <= b < last` (`blocks`), `[in_features, (last -
    first) · block]` of `dtype`, in this thread's buffers: the codes widened to float32, then - 8, ·
    scale and + zero in place, as `Int4Linear._quantize` computes them (for bfloat16 then rounded
    once). Every step keeps one dtype: torch's elementwise kernels cast mixed dtypes element by
    element, 3-5x slower here."""
    block = pack_block()
    first, last = blocks
    count, groups = last - first, in_features // 32
    n = count * block
    nibbles = packed.view(-1, in_features, block // 2)[first:last]
    codes = _codes(nibbles, block, out=_buffer("codes", in_features * n, torch.uint8))
    wt = _buffer("float32", in_features * n, torch.float32).view(in_features, count, block)
    wt.copy_(codes.permute(1, 0, 2)).sub_(8)
    holds = scales_and_zeros.view(groups, 1, -1, block, 2)[:, :, first:last]
    grouped = wt.view(groups, 32, count, block)
    grouped.mul_(holds[..., 0].float()).add_(holds[..., 1].float())
    if dtype == torch.float32:
        return wt.view(in_features, n)
    return _buffer(str(dtype), in_features * n, dtype).view(in_features, n).copy_(wt.view(in_features, n))


def _codes(nibbles: torch.Tensor, block: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The codes of packed blocks `nibbles` `[blocks, in_features, block / 2]` uint8 (module
    docstring) as uint8 `[blocks, in_features, block]`: output feature b · block + j of the blocks
    at `[b, :, j]` (written into `out` if given)."""
    half = block // 2
    shape = (*nibbles.shape[:2], block)
    codes = torch.empty(shape, dtype=torch.uint8) if out is None else out.view(shape)
    torch.bitwise_and(nibbles, 15, out=codes[..., :half])
    torch.bitwise_right_shift(nibbles, 4, out=codes[..., half:])
    return codes


def _buffer(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's buffer `name`, at least `numel` elements of `dtype` (grown until `release`)."""
    key = (threading.get_ident(), name)
    held = _buffers.get(key)
    if held is None or held.numel() < numel:
        with torch.inference_mode(False):  # usable inside and outside inference mode
            held = torch.empty(numel, dtype=dtype)
        _buffers[key] = held
    return held[:numel]
