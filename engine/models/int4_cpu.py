"""Low-bit weights for a CPU on torch's int4 weight-only matmul (`aten._weight_int4pack_mm_for_cpu`,
the kernel torchao's `Int4WeightOnlyConfig` and gpt-fast use on a CPU), in groups of 32 input weights.

`Int4Linear`: a group's weights are w = (q - 8) · scale + zero with q in 0..15, scale =
(max - min) / 15 and zero = min + 8 · scale: the asymmetric min/max quantization of GGUF's Q4_1
(llama.cpp, ggml-quants.c `quantize_row_q4_1_ref`), so a layer converted from a Q4_1 GGUF (every
linear layer of the embedded default model) gets its exact codes back.

`Int8Linear`: w = q · d with q in -127..127 and d = max|w| / 127, GGUF's Q8_0 (the embedded model's
embedding, which its LM head shares), run on the same kernel as two 4-bit planes: q = 16 · high +
low with high in -8..7 and low in 0..15, so x · w = [x, x] · [16d · high | d · low], one call with
twice the input features. (torch's per-channel `_weight_int8pack_mm` was slower than float32 here,
and its dynamic int8 linear quantizes activations, which cost +2 % to +9 % perplexity.)

Only scales and zeros are rounded to bfloat16, which the kernel takes. Its fast path takes bfloat16
activations (the float32 one was 25x slower, measured here), so a layer's input is rounded to
bfloat16 and its output is returned in the input's dtype.

The kernel is built for a few rows (a decode step): at a prefill chunk's 512 rows it ran the
projections no faster than float32, and a read 8 % slower. On a CPU with AVX-512 BF16 an
`Int4Linear` of a small model therefore also keeps its weight dequantized to bfloat16 and runs
chunks of more than `KERNEL_ROWS` rows as a bfloat16 matmul (oneDNN), 2.5x float32's speed there
(`weight_format.keeps_reading_copy`: up to 1 GiB of weights at bfloat16). Otherwise a long chunk
unpacks each layer's codes just in time (`engine.models.int4_unpack`): to bfloat16 with AVX-512
BF16 (2.4-3.5x the kernel's rate at 512 rows on an AMX Xeon), to float32 without it, where
bfloat16 matmuls were slower than float32 (1.4-1.9x the kernel's rate at 512 rows there).

Without AVX-512 the int4 kernel is compute-bound on a decode step's one row: the LM head, as two
4-bit planes, took 4.6 ms of a 48 ms SmolLM2 step on an AMD EPYC without AVX-512 (2 threads).
There an `Int8Linear` also keeps a *step copy*: its weights (the values the planes apply) rounded
again to int8 per output feature, w ≈ c · s with s = max|w_row| / 127, run by torch's int8
weight-only kernel (`aten._weight_int8pack_mm`, bfloat16 activations) for inputs of at most
`KERNEL_ROWS` rows: 2.2 ms. The same copy of the int4 layers was no faster in a real step (twice
their bytes, and a step streams them from memory: 9.4 ms against 9.5) and cost more agreement
with the int4 weights, so they keep the kernel (docs/BENCHMARKS.md §5f).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.models import int4_unpack
from engine.models.weight_format import keeps_reading_copy, keeps_step_copy

GROUP_SIZE = 32
"""Input weights per scale: the block of Q4_1 and Q8_0."""
OUT_MULTIPLE = 16
"""The kernel packs output features in tiles of this many."""
KERNEL_ROWS = 16
"""Inputs of at most this many rows (tokens) take the int4 kernel (the LM head's step copy, if
kept); longer ones the bfloat16 copy, if kept."""
PACK_BLOCK_OUT = 64
"""The packed layout interleaves output features in blocks of this many: packed layers concatenate
along the output features only where every one but the last fills whole blocks (measured: a
96-feature part fused with others gave wrong outputs)."""
ROWS_PER_PASS = 16 * PACK_BLOCK_OUT
"""Output features quantized at a time: whole packing blocks, so the blocks' codes concatenate
exactly. Quantizing holds a few float32 temporaries the size of what it quantizes in one pass: a
block keeps them to a few times 37 MB (1,024 × 8,960), where a 49,152 × 1,536 LM head in one pass
held about 2 GB of them."""


def dense_chunks() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (AVX-512 BF16), so chunks should use them.
    False too when torch's kernels are held below AVX-512 (`ATEN_CPU_CAPABILITY=avx2`, which with
    `ONEDNN_MAX_CPU_ISA=AVX2` runs an AVX-512 machine as the common AVX2-only laptop CPU)."""
    return torch.cpu._is_avx512_bf16_supported() and "AVX512" in torch.backends.cpu.get_cpu_capability()


class Int4Linear(torch.nn.Module):
    """A drop-in for `torch.nn.Linear` (inference only) holding its weight as 4-bit codes, two per
    byte, with a bfloat16 scale and zero per `GROUP_SIZE` input weights (module docstring).
    `dense`: also keep a bfloat16 copy for chunks (module docstring). Raises ValueError unless `fits(linear)`."""

    UNPACKS_CHUNKS = True
    """Chunks may run on the weights unpacked (`engine.models.int4_unpack`: bfloat16 or float32)."""

    def __init__(self, linear: torch.nn.Linear, *, dense: bool = False) -> None:
        super().__init__()
        self._hold(linear, [self._quantize(rows, dense) for rows in _row_blocks(linear)])

    @staticmethod
    def _quantize(weight: torch.Tensor, dense: bool) -> tuple:
        """One block of output features, float32 `[rows, groups, GROUP_SIZE]`: its packed codes,
        scales and zeros, dense copy (or None) and no step copy (`_hold`'s parts)."""
        low, high = weight.amin(-1), weight.amax(-1)
        scale = ((high - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny)
        codes = torch.round((weight - low[..., None]) / scale[..., None]).clamp(0, 15)
        zero = low + 8 * scale
        # dense: the same weights dequantized, for chunks (module docstring)
        applied = ((codes - 8) * _as_kernel_holds(scale) + _as_kernel_holds(zero)).flatten(1).to(torch.bfloat16) if dense else None
        return (*_packed(codes.flatten(1), scale, zero), applied, None, None)

    def _hold(self, linear: torch.nn.Linear, blocks: list[tuple]) -> None:
        """Hold the blocks of `_quantize` (packed codes, scales and zeros, dense copy, step codes,
        step scales, in the order of the output features) as one layer: the kernel packs output
        features in blocks of `PACK_BLOCK_OUT` on their own, so they concatenate exactly (`fuse`)."""
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.cat([b[0] for b in blocks]))
        self.register_buffer("scales_and_zeros", torch.cat([b[1] for b in blocks], 1).contiguous())
        for index, name in ((2, "dense"), (3, "step_codes"), (4, "step_scales")):
            self.register_buffer(name, None if blocks[0][index] is None else torch.cat([b[index] for b in blocks]))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def _no_step_copy(self) -> None:
        self.register_buffer("step_codes", None)
        self.register_buffer("step_scales", None)

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        return flat if flat.dtype == torch.bfloat16 else flat.to(torch.bfloat16)  # (`to` itself is an operator)

    def _kernel_output(self, flat: torch.Tensor) -> torch.Tensor:
        """The kernel's bfloat16 output `[rows, out_features]` of `flat` `[rows, in_features]`, no
        bias: the int8 step copy for a step's few rows where it exists, the dense copy for a chunk's
        many rows where it exists, else for a long chunk the weights unpacked
        (`engine.models.int4_unpack`: to bfloat16 where the CPU runs bfloat16 matmuls natively, else
        to float32, with a float32 output), else the int4 kernel."""
        rows = flat.shape[0]
        if self.step_codes is not None and rows <= KERNEL_ROWS:
            return torch.ops.aten._weight_int8pack_mm(flat.to(torch.bfloat16), self.step_codes, self.step_scales)
        if self.dense is not None and rows > KERNEL_ROWS:
            return torch.nn.functional.linear(self._kernel_input(flat), self.dense)
        if rows > KERNEL_ROWS and self.UNPACKS_CHUNKS and int4_unpack.unpacks(rows, self.out_features):
            x = self._kernel_input(flat) if dense_chunks() else flat.float()
            return int4_unpack.product(x, self.packed, self.scales_and_zeros, self.in_features, self.out_features)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(self._kernel_input(flat), self.packed, GROUP_SIZE,
                                                          self.scales_and_zeros)

    def step_output(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` of a decode step's input `x` `[rows, in_features]` (rows <= `KERNEL_ROWS`) before its
        last conversion: the kernel's bfloat16 output `[rows, out_features]` (plus the float32 bias, if
        any). A caller that adds it to float32 activations gets `forward`'s sum, bit for bit (the
        addition widens it exactly), without a conversion operator per layer."""
        y = self._kernel_output(x)
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._kernel_output(x if x.dim() == 2 else x.reshape(-1, self.in_features)).to(x.dtype)
        if x.dim() != 2:
            y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int8Linear(Int4Linear):
    """A drop-in for `torch.nn.Linear` holding its weight as 8-bit codes with a bfloat16 scale per
    `GROUP_SIZE` input weights, run as two 4-bit planes (module docstring). Twice an `Int4Linear`'s
    bytes and time. `step_copy`: also keep its weights as int8 per output feature for decode steps
    (module docstring). Raises ValueError unless `fits(linear)`."""

    UNPACKS_CHUNKS = False  # its two planes take the input twice: chunks keep the kernel

    def __init__(self, linear: torch.nn.Linear, *, step_copy: bool = False) -> None:  # noqa: D107 - the class says it
        torch.nn.Module.__init__(self)
        self._hold(linear, [self._quantize(rows, step_copy) for rows in _row_blocks(linear)])

    @staticmethod
    def _quantize(weight: torch.Tensor, step_copy: bool) -> tuple:
        """`Int4Linear._quantize` for 8-bit codes as two 4-bit planes, with the step copy if asked."""
        d = (weight.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.bfloat16).tiny)
        q = torch.round(weight / d[..., None]).clamp(-127, 127)
        high = torch.floor(q / 16)
        low = q - 16 * high
        codes = torch.cat([(high + 8).flatten(1), low.flatten(1)], 1)
        packed = _packed(codes, torch.cat([16 * d, d], 1), torch.cat([torch.zeros_like(d), 8 * d], 1))
        # the weights the two planes apply, with 16d and d as the kernel holds them
        step = _step_copy((high * _as_kernel_holds(16 * d) + low * _as_kernel_holds(d)).flatten(1)) if step_copy else (None, None)
        return (*packed, None, *step)  # no dense copy: the LM head runs on one row in a prefill

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        return torch.cat([flat, flat], 1)


def can_fuse(parts: list[torch.nn.Module]) -> bool:
    """Whether `fuse(parts)` is exact: `Int4Linear`s with the same input features, all but the last
    with output features in whole `PACK_BLOCK_OUT` blocks."""
    return (bool(parts) and all(type(p) is Int4Linear and p.in_features == parts[0].in_features for p in parts)
            and all(p.out_features % PACK_BLOCK_OUT == 0 for p in parts[:-1]))


def fuse(parts: list[Int4Linear]) -> Int4Linear:
    """One `Int4Linear` whose output is the parts' outputs side by side (`[..., Σ out_features]`),
    bit for bit: the kernel packs output features in blocks of `PACK_BLOCK_OUT` on their own, so the
    parts' packed codes and scales concatenate. A decode step then makes one kernel call (and one
    rounding of its input) where it made three (q, k, v) or two (gate, up): fewer small ops per
    layer. The parts keep working: their codes and dense copies become views of the fused ones (no
    second copy of the weights); each keeps its own scales (a few KB; the kernel misreads a
    non-contiguous view of them).
    Raises ValueError unless `can_fuse(parts)`."""
    if not can_fuse(parts):
        raise ValueError(f"only Int4Linear layers with the same input features, all but the last with output features "
                         f"in multiples of {PACK_BLOCK_OUT}, can be fused")
    fused = Int4Linear.__new__(Int4Linear)
    torch.nn.Module.__init__(fused)
    fused.in_features, fused.out_features = parts[0].in_features, sum(p.out_features for p in parts)
    fused.register_buffer("packed", torch.cat([p.packed for p in parts]))
    fused.register_buffer("scales_and_zeros", torch.cat([p.scales_and_zeros for p in parts], 1))
    dense = None if any(p.dense is None for p in parts) else torch.cat([p.dense for p in parts])
    fused.register_buffer("dense", dense)
    fused._no_step_copy()
    fused.bias = None
    if any(p.bias is not None for p in parts):
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features, device=p.packed.device) for p in parts]
        fused.bias = torch.nn.Parameter(torch.cat(biases), requires_grad=False)
    first = 0
    for p in parts:
        rows = slice(first, first + p.out_features)
        p.packed = fused.packed[rows]
        if dense is not None:
            p.dense = dense[rows]
        first = rows.stop
    return fused


def _packed(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`codes` [out, in'] (0..15) with `scale` and `zero` [out, in' / GROUP_SIZE] in the kernel's
    layout: packed codes [out, in' / 2] uint8 and scales and zeros [in' / GROUP_SIZE, out, 2] bfloat16."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    return packed, torch.stack([scale.T, zero.T], -1).to(torch.bfloat16)


def _step_copy(applied: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`applied` [out, in] float32 as int8 codes [out, in] with a bfloat16 scale per output feature
    (module docstring)."""
    scales = (applied.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    return torch.round(applied / scales.float()[:, None]).clamp(-127, 127).to(torch.int8), scales


def _as_kernel_holds(groups: torch.Tensor) -> torch.Tensor:
    """Per-group scales or zeros `[out, groups]` rounded to bfloat16 as the kernel holds them, as
    float32 `[out, groups, 1]` to broadcast over each group's weights."""
    return groups.to(torch.bfloat16).float()[..., None]


def fits(linear: torch.nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape: input features in multiples of `GROUP_SIZE`,
    output features in multiples of `OUT_MULTIPLE`."""
    return linear.in_features % GROUP_SIZE == 0 and linear.out_features % OUT_MULTIPLE == 0


def _row_blocks(linear: torch.nn.Linear) -> Iterator[torch.Tensor]:
    """The weight as float32 [rows, in / GROUP_SIZE, GROUP_SIZE], `ROWS_PER_PASS` output features
    at a time (a block's float32 temporaries, not the whole matrix's, are what quantizing costs);
    ValueError unless `fits(linear)`."""
    out_features, in_features = linear.weight.shape
    if not fits(linear):
        raise ValueError(f"low-bit CPU weights need input features in multiples of {GROUP_SIZE} and output features "
                         f"in multiples of {OUT_MULTIPLE}, got {in_features} -> {out_features}")
    for first in range(0, out_features, ROWS_PER_PASS):
        rows = linear.weight.detach()[first : first + ROWS_PER_PASS]
        yield rows.float().view(rows.shape[0], in_features // GROUP_SIZE, GROUP_SIZE)


def quantize_for_cpu(model: torch.nn.Module, *, dense: bool | None = None, step_copy: bool | None = None) -> None:
    """Replace, in place, every `nn.Linear` of the decoder layers by an `Int4Linear` and the LM head
    by an `Int8Linear` (its own copy even when it is tied to the embedding, which stays float32 for
    the lookup). A layer whose shape the kernel does not take (`fits`) stays as it is. `dense`: keep
    a bfloat16 copy of each `Int4Linear` for chunks; `step_copy`: an int8 copy of the LM head for
    decode steps (None: as `keeps_reading_copy` / `keeps_step_copy` decide on this CPU)."""
    if dense is None:
        dense = keeps_reading_copy("int4", dense_chunks(), 2 * sum(p.numel() for p in model.parameters()))
    step_copy = keeps_step_copy("int4", dense_chunks()) if step_copy is None else step_copy
    head = getattr(model, "lm_head", None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and fits(child):
                setattr(parent, name, Int8Linear(child, step_copy=step_copy) if child is head else Int4Linear(child, dense=dense))
