"""One decode step's attention over a layer's decode workspace in a few operators (`attend_step`).

A CPU decode step of the 135M model was ~10,500 operators, 58 % of its time in `LayerKV.attend`,
whose general path (any chunk, recall, focus, speculative drafts) recomputes per layer what every
layer of a step shares: the new token's position, its RoPE rows and the positions of the residual,
and converts the same keys and values to the same dtypes several times. `attend_step` does the
same arithmetic, bit for bit, for the common cases (one token over a decode workspace whose
residual is already rotated: `RotatedTail`; with or without recalled tokens), with the step's RoPE
rows taken once for all layers (`DecodeStep`) and the residual's rotation written straight into its
buffer. Any other case returns None before changing anything, and the caller runs `LayerKV.attend`.

Recalled tokens (`LayerKV.set_recalled`; an app's answer holds them from its question to its last
token) are covered where their positions allow it, exactly as `engine.kvcache.positions` gives them:
- focus (span recall's default, any position mode): the recalled tokens at 0..R-1 (rotated once,
  `RotatedRecall`), every later token at R + (stream position - focus_from): the residual and the
  new token are again one run of the table, `shift` = R - focus_from rows down. Held document
  tokens are hidden (the workspace starts past them) or masked (`_RecallView`), as are residual
  tokens of the document. The general path keeps no rotated residual there (a flush or eviction
  drops the workspace), so this step keeps its own in `DecodeWorkspace.tail`.
- original positions without focus (block recall): positions as without recall, the recalled set a
  third part of the attention with its `valid` mask.
- compact positions without focus: held and recalled tokens numbered together in document order
  (`CompactOrder`, kept with the rotated set); the residual and the new token follow at an offset
  of their own in each KV head, so their RoPE rows are gathered per head (`_rows`). As under focus,
  a flush or an eviction drops the workspace, and this step keeps its own rotated residual.

Why the rows can be shared: the residual holds the newest tokens of the stream, never evicted, in
every layer and KV head alike, at stream positions `start - residual .. start - 1` (original
positions) or slots `held - residual .. held - 1` (compact positions without recall), and the new
token sits at `start` or `held`: one contiguous run of the RoPE table, the same in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import torch

from engine.kvcache.attention import RotaryTable, part_logits, part_output
from engine.kvcache.layer_workspace import DecodeWorkspace, RotatedTail
from engine.kvcache.positions import PositionKind
from engine.kvcache.recall import RecalledTokens


@dataclass
class DecodeStep:
    """What every layer of one decode step shares. The new token's stream position `start` (and as
    `new_index` `[kv_heads, 1]` int32), its RoPE position `base` (`start`, or the held tokens' count
    with compact positions: `kind`), `cos` and signed `sin` `[positions, head_dim]` float32 views of
    the model's table (`RotaryTable.joint`), `half_swap` `[head_dim]`: the permutation `torch.roll`
    by head_dim / 2 applies, the attention's `scaling` as a 0-dimensional float32 tensor (a
    Python number costs a conversion per use), and `query_bf16` `[kv_heads, group, head_dim]`: room
    for a layer's scaled query as the workspace's bfloat16 kernel takes it (one `copy_`, where
    `Tensor.to` is four operators); `rope`: the table itself (focus reads rows off the run)."""

    kind: PositionKind
    start: int
    base: int
    new_index: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    half_swap: torch.Tensor
    scaling: torch.Tensor
    query_bf16: torch.Tensor
    rope: RotaryTable
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
                   table[:, d:], _half_swap(d, table.device), scaling, query_bf16, rope)

    def run(self, fresh: int, top: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[fresh, head_dim]` of the last `fresh` positions up to the new token's
        (`base`), or up to position `top` (focus: the new token sits at start + R - focus_from,
        `top + 1 - fresh` ≥ 0; read from `rope`, which grows its table if it must)."""
        key = (fresh, top)
        if key not in self._runs:
            if top is None:
                rows = slice(self.base + 1 - fresh, self.base + 1)
                self._runs[key] = (self.cos[rows], self.sin[rows])
            else:
                table = self.rope.joint(rows=slice(top + 1 - fresh, top + 1))
                self._runs[key] = (table[:, : self.rope.head_dim], table[:, self.rope.head_dim :])
        return self._runs[key]

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


@dataclass
class _RecallView:
    """What a one-token step over the recalled set `recalled` reads beside the workspace, fixed while
    the set and the workspace's held tokens are (kept in `DecodeWorkspace.step_view`): `recall_hidden`
    `[kv_heads, 1, R]` True where a recalled slot is not attended (`RecalledTokens.valid`);
    `held_hidden` `[kv_heads, 1, n]` True where a held token past the workspace's `start` is a
    document token under focus (`positions._focus_positions`' stable mask); None: all attended.
    `shift`: focus's R - focus_from, the rows every later token sits below its stream position."""

    recalled: RecalledTokens
    recall_hidden: torch.Tensor | None
    held_hidden: torch.Tensor | None
    shift: int


def _recall_view(layer, ws: DecodeWorkspace, resid: int) -> _RecallView | None:
    """The layer's `_RecallView`, or None where the general path must run first (it has not rotated
    this set into the workspace yet, or the workspace does not hold the stable tokens it should)."""
    recalled = layer.recalled
    view = ws.step_view
    if view is not None and view.recalled is recalled:
        return view
    if ws.recall is None or ws.recall.recalled is not recalled:
        return None
    held_hidden, shift = None, 0
    if recalled.focus_from is not None:
        # Under focus a flush or an eviction drops the workspace (its positions do not follow the
        # slots), so the held tokens it was built for are the layer's stable ones until it goes.
        stable = layer.n_tokens - resid
        if ws.held.n != stable - ws.start:
            return None
        hidden = layer.index[:, ws.start : stable] < recalled.focus_from
        held_hidden = hidden[:, None] if bool(hidden.any()) else None
        shift = recalled.index.shape[1] - recalled.focus_from
    invalid = ~recalled.valid
    ws.step_view = _RecallView(recalled, invalid[:, None] if bool(invalid.any()) else None, held_hidden, shift)
    return ws.step_view


def _step_tail(layer, ws: DecodeWorkspace | None, step: DecodeStep, key: torch.Tensor,
               resid: int) -> tuple[RotatedTail, _RecallView | None, int | None] | None:
    """Whether `attend_step` covers this layer: its rotated residual, its `_RecallView` (None without
    recalled tokens) and the new token's RoPE row where it is not `step.base` (focus: an int;
    compact positions with recalled tokens: `[kv_heads]`), or None. The only change it makes: an
    empty `RotatedTail` for a workspace the general path keeps none in (focus, compact recall)."""
    if ws is None or step.start < layer.policy.sink_tokens:
        return None
    recalled, view, top = layer.recalled, None, None
    if recalled is None:
        if ws.kind is not step.kind or ws.start != 0:
            return None
    else:
        view = _recall_view(layer, ws, resid)
        if view is None:
            return None
        if recalled.focus_from is None and step.kind is PositionKind.INDEX:  # held tokens at their stream positions
            if ws.kind is not PositionKind.INDEX or ws.start != 0:
                return None
        else:
            if recalled.focus_from is None:  # compact: held and recalled tokens in document order
                if ws.kind is not None or ws.start != 0 or ws.recall.order is None:
                    return None
                top = ws.recall.order.offset + resid  # [kv_heads]: the new token's position in each head
            else:
                top = step.start + view.shift
                if ws.kind is not None or top - resid < 0:  # a residual token's position clamped to 0
                    return None
            if ws.tail is None:
                ws.tail = RotatedTail.empty(key, layer.tail_capacity, ws.compute)
    tail = ws.tail
    if tail is None or tail.held > resid or tail.first + resid + 1 > tail.keys.shape[1]:
        return None
    return tail, view, top


def attend_step(layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, stored: tuple[torch.Tensor, torch.Tensor],
                step: DecodeStep) -> torch.Tensor | None:
    """`layer.attend` (a `LayerKV`) of one decode token with `StepOptions(reuse_workspace=True)`, bit
    for bit, or None (nothing changed) where the general path is needed: a chunk, no reusable
    workspace or rotated residual, recalled tokens not yet in the workspace, a sink still to fill,
    a residual that must move, a residual token of the document whose focus position is below 0.

    query `[query_heads, 1, head_dim]`, key / value `[kv_heads, 1, head_dim]` float32 before RoPE;
    `stored`: key and value in the layer's store dtype (converted once by the caller); `step`: what
    every layer of the step shares (`DecodeStep`). Returns the output `[kv_heads, group, head_dim]`
    (query head kv · group + g at `[kv, g]`), float32.
    """
    ws: DecodeWorkspace | None = layer._workspace
    resid = layer.resid_k.shape[1]
    heads, group = layer.shape.kv_heads, layer.shape.group
    if query.shape[1] != 1 or group >= query.shape[2] or (ws is not None and ws.compute != query.dtype):
        return None
    covered = _step_tail(layer, ws, step, key, resid)
    if covered is None:
        return None
    tail, view, top = covered
    first, held = tail.first, tail.held
    # The residual tokens not yet rotated (as stored) and the new one (as computed): RotatedTail.rotated.
    # Written in place and rotated there (a cat of two dtypes is 12 operators inside torch).
    cos, sin = _rows(step, resid - held + 1, top, layer)
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
    cos, sin = _rows(step, 1, top, layer)
    if cos.dim() == 3:  # one row per KV head: broadcast over the group
        cos, sin = cos[:, None], sin[:, None]
    q = step.rotate(query.view(heads, group, 1, -1), cos, sin)
    q = q.view(heads, group, -1) * step.scaling
    recall = (ws.recall.keys, ws.recall.values) if view is not None else None
    # Focus: residual tokens of the document (before focus_from) are masked, as `_focus_positions` does.
    focus_from = layer.recalled.focus_from if layer.recalled is not None else None
    masked_tail = max(0, focus_from - (step.start - resid)) if focus_from is not None else 0
    out, scores = _attention(q, step.query_bf16.copy_(q), ws.held.attention_parts(), recall,
                             (tail.keys[:, window], tail.values[:, window]), view, masked_tail)
    if view is not None:  # LayerKV._held_scores: what the recalled tokens received, hidden slots at 0
        n, r = ws.held.n, view.recalled.index.shape[1]
        layer.recalled.mass += scores[:, n : n + r]
        parts = (scores[:, :n], scores[:, n + r :])
        scores = torch.cat((scores.new_zeros((heads, ws.start)), *parts) if ws.start else parts, dim=1)
    # LayerKV._append of one token past the sinks.
    scores[:, : layer.n_tokens].add_(layer.score)
    layer.score = scores
    layer.index = torch.cat((layer.index, step.new_index), dim=1)
    layer.resid_k = torch.cat((layer.resid_k, stored[0]), dim=1)
    layer.resid_v = torch.cat((layer.resid_v, stored[1]), dim=1)
    return out


def _rows(step: DecodeStep, fresh: int, top: int | torch.Tensor | None, layer) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the last `fresh` positions up to the new token's: `[fresh, head_dim]` where
    every KV head agrees (`DecodeStep.run`, `top` an int or None), else `[kv_heads, fresh,
    head_dim]` up to `top` `[kv_heads]` (compact positions with recalled tokens: each head's tail
    starts after its own held and valid recalled tokens, `CompactOrder.offset`)."""
    if not isinstance(top, torch.Tensor):
        return step.run(fresh, top)
    positions = top[:, None] - torch.arange(fresh - 1, -1, -1, device=top.device)
    # every position is below held + recalled + 1: the table's size without reading the tensor back
    table = step.rope.joint(positions, bound=step.base + layer.recalled.index.shape[1] + 1)
    d = step.rope.head_dim
    return table[..., :d], table[..., d:]


def _attention(q: torch.Tensor, q_bf16: torch.Tensor, held: tuple, recall: tuple | None, tail: tuple,
               view: _RecallView | None, masked_tail: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention._step_attention` of one token, bit for bit, with its parts' products
    (`attention.part_logits`, `part_output`): scaled rotated queries `q` `[kv_heads, group,
    head_dim]` (and rounded to bfloat16, `q_bf16`, as the packed workspaces' `logits` round them)
    over the held part (`held`: the workspace's `attention_parts`), the recalled part (`recall`:
    the workspace's `RotatedRecall` keys and values, or None) and the rotated residual + token
    (`tail`: keys and values `[kv_heads, t, head_dim]`). Masks: `view`'s (`_RecallView`), and the
    tail's first `masked_tail` tokens. Returns the output `[kv_heads, group, head_dim]` and the
    scores `[kv_heads, n + R + t]` float32."""
    tail_k, tail_v = tail
    held_logits = part_logits(q, held[0], q_bf16)
    n = held_logits.shape[-1]
    tail_logits = part_logits(q, tail_k)
    # (a cat of two dtypes widens the first part exactly, as `.float()` does, but in six more operators)
    if recall is None:
        logits, r = torch.cat((held_logits.float(), tail_logits), dim=-1), 0
    else:
        recall_logits = part_logits(q, recall[0], q_bf16)
        r = recall_logits.shape[-1]
        logits = torch.cat((held_logits.float(), recall_logits.float(), tail_logits), dim=-1)
        if view.held_hidden is not None:
            logits[..., :n].masked_fill_(view.held_hidden, float("-inf"))
        if view.recall_hidden is not None:
            logits[..., n : n + r].masked_fill_(view.recall_hidden, float("-inf"))
    if masked_tail:
        logits[..., n + r : n + r + masked_tail] = float("-inf")
    probs = torch.softmax(logits, dim=-1)  # [kv_heads, group, n + R + t]
    output = part_output(probs[..., :n], held[1])
    if recall is not None:
        output = output + part_output(probs[..., n : n + r], recall[1])
    return output + part_output(probs[..., n + r :], tail_v), probs.sum(dim=1)
