"""The RoPE positions a chunk's attention uses, for the three ways of numbering the tokens.

Keys are cached before RoPE, so every `LayerKV.attend` chooses the positions anew from the slots'
stream positions (`index`), the recalled tokens and the chunk:

- original: each token at its stream position (valid while the stream fits the model's context).
- compact: tokens numbered by slot order (StreamingLLM), so a long stream never runs past the
  model's context; with recalled tokens, held and recalled tokens are numbered together in document
  order (`compact_order_positions`) and the tail follows them.
- focus (`RecalledTokens.focus_from`, any mode): only the recalled tokens of the document are seen,
  at 0..R-1; held tokens before `focus_from` are masked and every later one sits at
  R + (its stream position − focus_from).

The layer's tokens are split into the *stable* part (sinks + quantized tokens, slots
`0..stable_tokens-1`) and the *tail* (the 16-bit residual followed by the chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from engine.kvcache.recall import RecalledTokens, compact_order_positions


class PositionKind(Enum):
    """How the stable part's positions follow its slots, which decides whether a decode workspace of
    its rotated keys survives a flush (appended) and an eviction (compacted)."""

    INDEX = "index"  # each slot at its stream position: keys keep their rotation when slots move
    SLOTS = "slots"  # slot s at position s in every head: rows of the RoPE table, no gather


@dataclass(frozen=True)
class CompactOrder:
    """Held and recalled tokens numbered together in document order (`compact_order_positions`):
    stable `[kv_heads, stable_tokens]`, recalled `[kv_heads, R]` (invalid slots 0) and the first
    tail position `offset` `[kv_heads]`. The same while neither set changes, so a decode workspace
    keeps it."""

    stable: torch.Tensor
    recalled: torch.Tensor
    offset: torch.Tensor


@dataclass(frozen=True)
class AttentionPositions:
    """Positions (int tensors) of everything one chunk attends.

    stable: `[kv_heads, stable_tokens - hidden]`, or None with kind SLOTS (slot s at s).
    tail: `[kv_heads, residual + chunk]`, or `[residual + chunk]` where every head agrees.
    query: the chunk's own, `[kv_heads, chunk]` or `[chunk]` (the last `chunk` of `tail`).
    recalled: `[kv_heads, R]`, None without recalled tokens.
    hidden: leading stable slots left out of the attention altogether (focus: held document tokens
        precede the question's in every head, so they are skipped rather than masked).
    kind: see `PositionKind`; None where the stable positions follow neither (focus, compact recall).
    bound: every position attended is below it, where known without reading a tensor back.
    stable_mask / tail_mask: False where a token is not attended (focus), None: all are.
    order: the compact document order it used (compact mode with recalled tokens), to keep.
    """

    stable: torch.Tensor | None
    tail: torch.Tensor
    query: torch.Tensor
    recalled: torch.Tensor | None = None
    hidden: int = 0
    kind: PositionKind | None = None
    bound: int | None = None
    stable_mask: torch.Tensor | None = None
    tail_mask: torch.Tensor | None = None
    order: CompactOrder | None = None


def attention_positions(index: torch.Tensor, stable_tokens: int, *, start: int, chunk: int,
                        recalled: RecalledTokens | None, compact: bool,
                        order: CompactOrder | None = None) -> AttentionPositions:
    """Positions for a chunk of `chunk` tokens at stream positions `start..start + chunk - 1`
    attending a layer whose slots hold stream positions `index` `[kv_heads, held_tokens]` (the
    first `stable_tokens` of them stable, the rest the residual) and `recalled` (or None).
    `order`: the `CompactOrder` of these same held and recalled sets, if already known."""
    if recalled is not None and recalled.focus_from is not None:
        return _focus_positions(index, stable_tokens, start, chunk, recalled)
    if compact:
        return _compact_positions(index, stable_tokens, chunk, recalled, order)
    heads, device = index.shape[0], index.device
    new_index = torch.arange(start, start + chunk, device=device, dtype=index.dtype).expand(heads, -1)
    return AttentionPositions(
        stable=index[:, :stable_tokens], tail=torch.cat((index[:, stable_tokens:], new_index), dim=1), query=new_index,
        recalled=recalled.index if recalled is not None else None, kind=PositionKind.INDEX, bound=start + chunk,
    )


def _compact_positions(index: torch.Tensor, stable_tokens: int, chunk: int, recalled: RecalledTokens | None,
                       order: CompactOrder | None) -> AttentionPositions:
    held, device = index.shape[1], index.device
    if recalled is None:  # slot s at position s in every head: no per-head positions at all
        tail = torch.arange(stable_tokens, held + chunk, device=device)
        return AttentionPositions(stable=None, tail=tail, query=tail[-chunk:], kind=PositionKind.SLOTS, bound=held + chunk)
    if order is None:
        order = CompactOrder(*compact_order_positions(index[:, :stable_tokens], recalled))
    tail = order.offset[:, None] + torch.arange(held - stable_tokens + chunk, device=device)
    return AttentionPositions(stable=order.stable, tail=tail, query=tail[:, -chunk:], recalled=order.recalled, order=order)


def _focus_positions(index: torch.Tensor, stable_tokens: int, start: int, chunk: int,
                     recalled: RecalledTokens) -> AttentionPositions:
    heads, device = index.shape[0], index.device
    focus_from, n_recalled = recalled.focus_from, recalled.index.shape[1]
    shift = n_recalled - focus_from
    stable_index = index[:, :stable_tokens].long()
    visible = stable_index >= focus_from
    # Held document tokens precede the question's and answer's in every head's slot order (arrival
    # order, kept by eviction): skip them rather than dequantize, rotate and score them every step.
    hidden = stable_tokens - int(visible.sum(dim=1).max())
    new_index = torch.arange(start, start + chunk, device=device).expand(heads, -1)
    tail_index = torch.cat((index[:, stable_tokens:].long(), new_index), dim=1)
    tail = (tail_index + shift).clamp_min(0)
    return AttentionPositions(
        stable=(stable_index[:, hidden:] + shift).clamp_min(0), tail=tail, query=tail[:, -chunk:],
        recalled=torch.arange(n_recalled, device=device).expand(heads, -1), hidden=hidden,
        stable_mask=visible[:, hidden:], tail_mask=tail_index >= focus_from,
    )
