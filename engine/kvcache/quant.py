"""Asymmetric group quantization of K/V vectors: pure tensor functions, no state.

A head vector `x` of `head_dim` channels is cut into groups of `group_size` channels; each group
keeps a scale and a zero point (both float16) and `bits`-bit codes:

    scale = (max - min) / (2**bits - 1),  zero = min,  code = round((x - zero) / scale)
    x_hat = code * scale + zero,           |x - x_hat| <= scale / 2   (per element)

Quantization is per token along the channel axis for keys *and* values. KIVI (Liu et al. 2024,
arXiv 2402.02750) quantizes keys per channel across tokens, which is more accurate at 2 bits, but a
per-channel group spans many tokens and Halaman evicts single tokens (H2O): a per-token group travels
with its token when the cache is compacted, so eviction never re-quantizes anything. Keys are
quantized before RoPE, where their outlier channels are stable (KVQuant, arXiv 2401.18079).

4-bit codes are packed two per byte (low nibble = even channel), 2-bit codes four per byte (lowest
bits = first channel); 2 bits serve the on-disk archive (`engine.kvcache.archive`) for comparison,
not the cache. `bits=16` stores float16 and no metadata, for comparison runs. Shapes: `x` is
`[..., head_dim]`; codes `[..., head_dim * bits / 8]` uint8; scale and zero
`[..., head_dim / group_size]` float16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import ModelError

SUPPORTED_BITS = (2, 4, 8, 16)
_META_DTYPE = torch.float16
# Smallest scale we store: float16 can hold it and it keeps constant groups from dividing by zero.
_MIN_SCALE = 1e-6


class GroupSizeError(ModelError, ValueError):
    """A model whose attention heads have a number of channels the KV group size does not divide
    (open_llama_3b: 100 channels, groups of 32), with the group size that would fit."""

    def __init__(self, head_dim: int, group_size: int) -> None:
        fits = max((g for g in range(1, min(group_size, head_dim) + 1) if head_dim % g == 0 and g % 2 == 0), default=head_dim)
        super().__init__(
            f"this model's attention heads have {head_dim} channels, and the KV cache quantizes them in groups "
            f"of {group_size}, which does not divide {head_dim}: set group_size = {fits} under [cache] in "
            "settings.toml (a divisor of the head size), or kv_bits = 16")


@dataclass(frozen=True)
class KVFormat:
    """How one of K or V is stored: `bits` in (2, 4, 8, 16), `group_size` channels per scale/zero.

    `field_specs(head_dim)` names the tensors a token slot holds, so that a storage backend (the
    block pool) can allocate them without knowing about quantization.
    """

    bits: int = 4
    group_size: int = 32

    def validate(self, head_dim: int) -> None:
        """Raise ValueError if this format cannot store vectors of `head_dim` channels: a
        GroupSizeError (also a ModelError, shown as it is) when the group size does not divide it."""
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"KV bits must be one of {SUPPORTED_BITS}, got {self.bits}")
        if self.bits < 16 and (self.group_size <= 0 or head_dim % self.group_size):
            raise GroupSizeError(head_dim, self.group_size)

    def field_specs(self, head_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-token tensors of one head: name -> (trailing shape, dtype)."""
        if self.bits == 16:
            return {"codes": ((head_dim,), torch.float16)}
        groups = head_dim // self.group_size
        return {
            "codes": ((head_dim * self.bits // 8,), torch.uint8),
            "scale": ((groups,), _META_DTYPE),
            "zero": ((groups,), _META_DTYPE),
        }

    def bytes_per_token(self, head_dim: int) -> int:
        """Bytes one token of one head takes in this format, metadata included."""
        total = 0
        for shape, dtype in self.field_specs(head_dim).values():
            total += shape[0] * torch.empty((), dtype=dtype).element_size()
        return total

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Quantize `x` `[..., head_dim]` into the fields of `field_specs`."""
        if self.bits == 16:
            return {"codes": x.to(torch.float16)}
        codes, scale, zero = quantize(x, self.bits, self.group_size)
        return {"codes": codes, "scale": scale, "zero": zero}

    def decode(self, fields: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Inverse of `encode`: `[..., head_dim]` in `dtype`."""
        if self.bits == 16:
            return fields["codes"].to(dtype)
        return dequantize(fields["codes"], fields["scale"], fields["zero"], self.bits, self.group_size, dtype)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes in [0, 2**bits) `[..., n * 8/bits]` into bytes `[..., n]`, `bits` 2 or 4;
    the first channel of each byte goes to its lowest bits."""
    per_byte = 8 // bits
    packed = codes[..., 0::per_byte].clone()
    for i in range(1, per_byte):
        packed |= codes[..., i::per_byte] << (bits * i)
    return packed


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_codes`: bytes `[..., n]` -> uint8 codes `[..., n * 8/bits]`."""
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * i)) & mask for i in range(8 // bits)]
    return torch.stack(parts, dim=-1).flatten(-2)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes in [0, 15] `[..., 2n]` into bytes `[..., n]` (even channel in the low nibble)."""
    return pack_codes(codes, 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: bytes `[..., n]` -> uint8 codes `[..., 2n]`."""
    return unpack_codes(packed, 4)


def quantize(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group quantization of `x` `[..., D]` along its last axis.

    Returns `(codes, scale, zero)`: codes uint8 `[..., D]` for 8 bits, `[..., D/2]` (packed) for
    4 bits, `[..., D/4]` for 2 bits; scale and zero float16 `[..., D/group_size]`. The codes are computed from the *stored*
    (float16-rounded) scale and zero, so the error bound scale/2 holds for what is decoded.
    Raises ValueError for unsupported bits or a group size that does not divide D.
    """
    if bits not in (2, 4, 8):
        raise ValueError(f"quantize supports 2, 4 or 8 bits, got {bits}")
    *lead, dim = x.shape
    if dim % group_size:
        raise ValueError(f"group size {group_size} must divide {dim}")
    qmax = (1 << bits) - 1
    groups = x.float().reshape(*lead, dim // group_size, group_size)
    low = groups.amin(dim=-1)
    high = groups.amax(dim=-1)
    # Round the zero point down and the scale up to float16, so that [zero, zero + qmax * scale]
    # still covers the group after rounding: no code clips, and the error stays within scale / 2.
    zero = round_fp16(low, toward=float("-inf"))
    scale = round_fp16(((high - zero.float()) / qmax).clamp_min(_MIN_SCALE), toward=float("inf"))
    codes = ((groups - zero.float()[..., None]) / scale.float()[..., None]).round_().clamp_(0, qmax)
    codes = codes.to(torch.uint8).reshape(*lead, dim)
    if bits < 8:
        codes = pack_codes(codes, bits)
    return codes, scale, zero


def dequantize(
    codes: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of `quantize`: returns `[..., D]` in `dtype` (D = groups * group_size).

    Packed codes are looked up byte by byte in a table of their channels' values (one gather,
    where shifting and masking took five passes), and `code · scale + zero` is one `addcmul`
    (a broadcast `mul` then `add` was 6x slower on the CPU): 4x faster for a 4k-token layer.
    Dequantizing is on the path of every prefill chunk and of every decode workspace build."""
    if bits < 8:
        values = torch.nn.functional.embedding(codes.int(), _byte_table(bits, dtype, codes.device)).flatten(-2)
    else:
        values = codes.to(dtype)
    *lead, dim = values.shape
    groups = values.reshape(*lead, dim // group_size, group_size)
    out = torch.addcmul(zero.to(dtype)[..., None], groups, scale.to(dtype)[..., None])
    return out.view(*lead, dim)


_BYTE_TABLES: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _byte_table(bits: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[256, 8 / bits]`: the codes a packed byte holds (as `unpack_codes` reads them), in `dtype`."""
    key = (bits, dtype, device)
    if key not in _BYTE_TABLES:
        _BYTE_TABLES[key] = unpack_codes(torch.arange(256, dtype=torch.uint8), bits).view(256, 8 // bits).to(device, dtype)
    return _BYTE_TABLES[key]


def round_fp16(values: torch.Tensor, toward: float) -> torch.Tensor:
    """float32 -> float16, rounding toward `toward` (+inf or -inf) instead of to nearest."""
    rounded = values.to(_META_DTYPE)
    wrong_side = (rounded.float() < values) if toward > 0 else (rounded.float() > values)
    stepped = torch.nextafter(rounded, torch.full_like(rounded, toward))
    return torch.where(wrong_side, stepped, rounded)
