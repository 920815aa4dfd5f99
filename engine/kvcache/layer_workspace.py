"""One layer's decode workspace: what `LayerKV` keeps between decode steps so that a step neither
dequantizes nor rotates the whole budget again.

- `held`: the rotated, dequantized sinks + quantized tokens from stable slot `start` on (a
  `DenseWorkspace` or `Bf16Int8Workspace`, `engine.kvcache.decode_workspace`).
- `tail`: the rotated residual, kept where the positions follow the slots (`kind` not None), and by
  the one-token step under focus (`engine.kvcache.step`: the general path does not read it there).
- `recall`: the current recalled set, rotated, once a chunk attended it.
- `step_view`: the masks a one-token step over a recalled set applies (`engine.kvcache.step`).

Where the positions follow the slots, a flush appends to `held` and an eviction compacts it;
otherwise (focus, a compact recall) either drops the workspace, as does, in compact mode, a new
recalled set. A workspace is rebuilt from the pool whenever it was dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kvcache.attention import RotaryTable, rotate
from engine.kvcache.decode_workspace import Bf16Int8Workspace, DenseWorkspace
from engine.kvcache.positions import CompactOrder, PositionKind
from engine.kvcache.recall import RecalledTokens


@dataclass
class RotatedTail:
    """The rotated residual: keys and values `[kv_heads, capacity, head_dim]` (compute dtype) whose
    slots `first .. first + held - 1` hold the residual's first `held` tokens as it stores them, so a
    step rotates only what arrived since (its chunk, and the last step's token, now 16-bit)."""

    keys: torch.Tensor
    values: torch.Tensor
    first: int = 0
    held: int = 0

    @classmethod
    def empty(cls, like: torch.Tensor, capacity: int, compute: torch.dtype) -> RotatedTail:
        """Room for `capacity` tokens of `like`'s heads and head dim (`[kv_heads, _, head_dim]`)."""
        h, d = like.shape[0], like.shape[2]
        return cls(like.new_empty((h, capacity, d), dtype=compute), like.new_empty((h, capacity, d), dtype=compute))

    def rotated(self, resid_k: torch.Tensor, resid_v: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                positions: torch.Tensor, rope: RotaryTable, bound: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rotated keys and values `[kv_heads, residual + chunk, head_dim]` of the residual
        (`resid_k` / `resid_v` `[kv_heads, residual, head_dim]`, 16-bit) followed by the chunk
        (`key` / `value` `[kv_heads, chunk, head_dim]`) at `positions` (`AttentionPositions.tail`),
        views into the buffers; None if they do not fit."""
        r, chunk, capacity = resid_k.shape[1], key.shape[1], self.keys.shape[1]
        if r + chunk > capacity:
            return None
        if self.first + r + chunk > capacity:  # move the held residual to the front
            for buf in (self.keys, self.values):
                buf[:, : self.held] = buf[:, self.first : self.first + self.held].clone()
            self.first = 0
        t0, tn, compute = self.first, self.held, self.keys.dtype
        # Residual tokens not yet held (as stored), then the chunk (as computed).
        fresh_k = torch.cat((resid_k[:, tn:].to(compute), key.to(compute)), dim=1)
        fresh_v = torch.cat((resid_v[:, tn:].to(compute), value.to(compute)), dim=1)
        self.keys[:, t0 + tn : t0 + r + chunk] = rotate(fresh_k, rope.joint(positions[..., tn:], bound=bound))
        self.values[:, t0 + tn : t0 + r + chunk] = fresh_v
        self.held = r  # the chunk's slots hold it unrounded: rewritten once the residual holds it
        return self.keys[:, t0 : t0 + r + chunk], self.values[:, t0 : t0 + r + chunk]


@dataclass
class RotatedRecall:
    """The recalled set `recalled`, rotated: keys and values `[kv_heads, R, head_dim]` in the compute
    dtype, or one `Bf16Int8Workspace` as both (with focus a decode step reads little else, so they
    set its speed). `order`: the compact positions of the held and recalled tokens together."""

    recalled: RecalledTokens
    keys: torch.Tensor | Bf16Int8Workspace
    values: torch.Tensor | Bf16Int8Workspace
    order: CompactOrder | None = None


@dataclass
class DecodeWorkspace:
    """See the module docstring. `compute`: the dtype everything here was computed in; `rope`: the
    table `held` was rotated with."""

    held: DenseWorkspace | Bf16Int8Workspace
    start: int
    rope: RotaryTable
    kind: PositionKind | None
    compute: torch.dtype
    tail: RotatedTail | None = None
    recall: RotatedRecall | None = None
    # What a one-token step (`engine.kvcache.step.attend_step`) keeps beside a recalled set: its masks.
    step_view: object = None

    @property
    def follows_slots(self) -> bool:
        """Whether the held tokens' positions follow their slots (flushes and evictions keep it)."""
        return self.kind is not None

    def residual_flushed(self, m: int) -> None:
        """The residual lost its first `m` tokens to the pool: they leave the front of `tail`."""
        if self.tail is not None and self.tail.held >= m:
            self.tail.first, self.tail.held = self.tail.first + m, self.tail.held - m
        else:
            self.tail = None

    @property
    def nbytes(self) -> int:
        parts = [self.held] + ([self.recall.keys, self.recall.values] if self.recall is not None else [])
        tail = (self.tail.keys.nbytes + self.tail.values.nbytes) if self.tail is not None else 0
        return sum(part.nbytes for part in {id(part): part for part in parts}.values()) + tail
