"""One decode step's attention over a layer's decode workspace in a few operators (`attend_step`).

A CPU decode step of the 135M model was ~10,500 operators, 58 % of its time in `LayerKV.attend`,
whose general path (any chunk, recall, focus, speculative drafts) recomputes per layer what every
layer of a step shares: the new token's position, its RoPE rows and the positions of the residual,
and converts the same keys and values to the same dtypes several times. `attend_step` does the
same arithmetic, bit for bit, for the common case (one token, no recalled tokens, a decode
workspace whose residual is already rotated: `RotatedTail`), with the step's RoPE rows taken once
for all layers (`DecodeStep`) and the residual's rotation written straight into its buffer. Any
other case returns None before changing anything, and the caller runs `LayerKV.attend`.

Why the rows can be shared: the residual holds the newest tokens of the stream, never evicted, in
every layer and KV head alike, at stream positions `start - residual .. start - 1` (original
positions) or slots `held - residual .. held - 1` (compact positions without recall), and the new
token sits at `start` or `held`: one contiguous run of the RoPE table, the same in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import torch

from engine.kvcache.attention import RotaryTable
from engine.kvcache.decode_workspace import Bf16Int8Workspace
from engine.kvcache.layer_workspace import DecodeWorkspace
from engine.kvcache.positions import PositionKind


@dataclass
class DecodeStep:
    """What every layer of one decode step shares. The new token's stream position `start` (and as
    `new_index` `[kv_heads, 1]` int32), its RoPE position `base` (`start`, or the held tokens' count
    with compact positions: `kind`), `cos` and signed `sin` `[positions, head_dim]` float32 views of
    the model's table (`RotaryTable.joint`), `half_swap` `[head_dim]`: the permutation `torch.roll`
    by head_dim / 2 applies, the attention's `scaling` as a 0-dimensional float32 tensor (a
    Python number costs a conversion per use), and `query_bf16` `[kv_heads, group, head_dim]`: room
    for a layer's scaled query as the workspace's bfloat16 kernel takes it (one `copy_`, where
    `Tensor.to` is four operators)."""

    kind: PositionKind
    start: int
    base: int
    new_index: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    half_swap: torch.Tensor
    scaling: torch.Tensor
    query_bf16: torch.Tensor
    _runs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, rope: RotaryTable, *, compact: bool, start: int, held: int, kv_heads: int, group: int,
           scaling: torch.Tensor) -> DecodeStep:
        """The step of a token at stream position `start` over `held` tokens per layer and KV head
        (`group` query heads each)."""
        base = held if compact else start
        d = rope.head_dim
        table = rope.joint(rows=slice(0, base + 1))  # grows the table if it must
        new_index = torch.full((kv_heads, 1), start, dtype=torch.int32, device=table.device)
        query_bf16 = torch.empty((kv_heads, group, d), dtype=torch.bfloat16, device=table.device)
        return cls(PositionKind.SLOTS if compact else PositionKind.INDEX, start, base, new_index, table[:, :d],
                   table[:, d:], _half_swap(d, table.device), scaling, query_bf16)

    def run(self, fresh: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[fresh, head_dim]` of the last `fresh` positions up to the new token's."""
        if fresh not in self._runs:
            rows = slice(self.base + 1 - fresh, self.base + 1)
            self._runs[fresh] = (self.cos[rows], self.sin[rows])
        return self._runs[fresh]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """`attention.rotate(x, joint)` of float32 `x` `[..., head_dim]`, bit for bit (the same two
        products and sum; the roll as one gather), written into `out` if given (`x` itself may be it)."""
        return torch.add(x * cos, x[..., self.half_swap].mul_(sin), out=out)


@cache
def _half_swap(head_dim: int, device: torch.device) -> torch.Tensor:
    """`[head_dim]` int64: the indices `torch.roll(x, head_dim // 2, -1)` reads, `x[..., _half_swap(d)]`
    (made outside inference mode, so that any caller may use it)."""
    with torch.inference_mode(False):
        return torch.arange(head_dim, device=device).roll(head_dim // 2)


def attend_step(layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, stored: tuple[torch.Tensor, torch.Tensor],
                step: DecodeStep) -> torch.Tensor | None:
    """`layer.attend` (a `LayerKV`) of one decode token with `StepOptions(reuse_workspace=True)`, bit
    for bit, or None (nothing changed) where the general path is needed: a chunk, recalled tokens,
    no reusable workspace or rotated residual, a sink still to fill, a residual that must move.

    query `[query_heads, 1, head_dim]`, key / value `[kv_heads, 1, head_dim]` float32 before RoPE;
    `stored`: key and value in the layer's store dtype (converted once by the caller); `step`: what
    every layer of the step shares (`DecodeStep`). Returns the output `[kv_heads, group, head_dim]`
    (query head kv · group + g at `[kv, g]`), float32.
    """
    ws: DecodeWorkspace | None = layer._workspace
    resid = layer.resid_k.shape[1]
    tail = ws.tail if ws is not None else None
    heads, group = layer.shape.kv_heads, layer.shape.group
    if (query.shape[1] != 1 or group >= query.shape[2] or layer.recalled is not None or tail is None
            or ws.compute != query.dtype
            or ws.kind is not step.kind or ws.start != 0 or tail.held > resid
            or tail.first + resid + 1 > tail.keys.shape[1] or step.start < layer.policy.sink_tokens):
        return None
    first, held = tail.first, tail.held
    # The residual tokens not yet rotated (as stored) and the new one (as computed): RotatedTail.rotated.
    # Written in place and rotated there (a cat of two dtypes is 12 operators inside torch).
    cos, sin = step.run(resid - held + 1)
    fresh = slice(first + held, first + resid + 1)
    keys, values = tail.keys[:, fresh], tail.values[:, fresh]
    if resid > held:
        keys[:, :-1].copy_(layer.resid_k[:, held:])
        values[:, :-1].copy_(layer.resid_v[:, held:])
    keys[:, -1:].copy_(key)
    values[:, -1:].copy_(value)
    step.rotate(keys, cos, sin, out=keys)
    tail.held = resid
    window = slice(first, first + resid + 1)
    cos, sin = step.run(1)
    q = step.rotate(query.view(heads, group, 1, -1), cos, sin)
    q = q.view(heads, group, -1) * step.scaling
    out, scores = _attention(q, step.query_bf16.copy_(q), ws.held.attention_parts(), tail.keys[:, window],
                             tail.values[:, window])
    # LayerKV._append of one token past the sinks.
    scores[:, : layer.n_tokens].add_(layer.score)
    layer.score = scores
    layer.index = torch.cat((layer.index, step.new_index), dim=1)
    layer.resid_k = torch.cat((layer.resid_k, stored[0]), dim=1)
    layer.resid_v = torch.cat((layer.resid_v, stored[1]), dim=1)
    return out


def _attention(q: torch.Tensor, q_bf16: torch.Tensor, held: tuple, tail_k: torch.Tensor,
               tail_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention._step_attention` of one token without masks, bit for bit, its matrix products as
    plain `bmm`s (what `matmul` ran, without its reshapes): scaled rotated queries `q` `[kv_heads,
    group, head_dim]` (and rounded to bfloat16, `q_bf16`, as the packed workspaces' `logits` round
    them) over the held part (`held`: the workspace's `attention_parts`) and the rotated
    residual + token `tail_k` / `tail_v` `[kv_heads, t, head_dim]`. Returns the output `[kv_heads,
    group, head_dim]` and the scores `[kv_heads, n + t]` float32."""
    keys, values = held
    if isinstance(keys, Bf16Int8Workspace):
        held_logits = keys.logits(q_bf16)
    else:
        held_logits = torch.bmm(q.to(keys.dtype), keys.transpose(1, 2))
    n = held_logits.shape[-1]
    tail_logits = torch.bmm(q.to(tail_k.dtype), tail_k.transpose(1, 2))
    # (a cat of two dtypes widens the first part exactly, as `.float()` does, but in six more operators)
    probs = torch.softmax(torch.cat((held_logits.float(), tail_logits), dim=-1), dim=-1)  # [kv_heads, group, n + t]
    if isinstance(values, Bf16Int8Workspace):
        output = values.weighted_values(probs[..., :n])
    else:
        output = torch.bmm(probs[..., :n].to(values.dtype), values)
    return output + torch.bmm(probs[..., n:].to(tail_v.dtype), tail_v), probs.sum(dim=1)
