"""Attention of a chunk of queries over cached keys plus the chunk itself, returning H2O scores.

transformers' sdpa / flash paths return no attention weights, and the eager path materialises them
for the whole sequence; here the probabilities of one chunk (`[heads, chunk, cached + chunk]`) are
computed once, used for the output and summed into per-key scores, and dropped. No n×n matrix over
the document is ever built: memory is O(chunk × (budget + chunk)).

RoPE is applied here, at attention time, because the cache holds keys *before* RoPE: the positions
a key is rotated with depend on the position mode and on what has been evicted.
"""

from __future__ import annotations

import torch


class RotaryTable:
    """cos / sin tables of the model's own rotary embedding, grown on demand.

    Built by calling the model's `rotary_emb` module once per size, so any static RoPE variant the
    model implements (default, linear, Llama-3 frequency scaling, YaRN) is reproduced exactly.
    `cos(positions)` / `sin(positions)` take integer positions of any shape and return
    `[*positions.shape, head_dim]` float32.
    """

    def __init__(self, rotary_emb: torch.nn.Module, head_dim: int, device: torch.device) -> None:
        self.rotary_emb = rotary_emb
        self.head_dim = head_dim
        self.device = device
        self._cos = torch.empty((0, head_dim), device=device)
        self._sin = torch.empty((0, head_dim), device=device)

    def _ensure(self, size: int) -> None:
        if size <= self._cos.shape[0]:
            return
        size = max(size, 2 * self._cos.shape[0], 1024)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        positions = torch.arange(size, device=self.device)[None]
        with torch.no_grad():
            cos, sin = self.rotary_emb(probe, positions)
        self._cos, self._sin = cos[0].float(), sin[0].float()

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for `positions` (int tensor, any shape) -> each `[*shape, head_dim]` float32."""
        self._ensure(int(positions.max()) + 1 if positions.numel() else 0)
        return self._cos[positions], self._sin[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[..., head_dim]` (rotate-half convention of Llama / Qwen), computed in float32."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def chunk_attention(
    query: torch.Tensor,
    keys: tuple[torch.Tensor, ...],
    values: tuple[torch.Tensor, ...],
    *,
    scaling: float,
    masks: tuple[torch.Tensor | None, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over cached keys followed by the chunk's own keys.

    query: `[kv_heads, group, chunk, head_dim]` (RoPE applied); query head `kv * group + g` reads
        KV head `kv`, as in transformers' `repeat_kv` (GQA/MQA).
    keys, values: parts `[kv_heads, n_i, head_dim]` (RoPE applied to keys) that concatenate to
        `n_cached + chunk` tokens in slot order; the last `chunk` tokens are the chunk itself.
        Parts are attended separately and joined in one softmax, so the caller never copies the
        whole cache into one tensor.
    masks: optional, one per part: `[kv_heads, n_i]` bool (False = not attended, e.g. a recalled
        slot whose token the cache already holds), or None for a part attended in full.
    Returns `(output [kv_heads, group, chunk, head_dim], scores [kv_heads, n_cached + chunk] float32)`
    where `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]`: the attention mass key j received from this
    chunk, summed over the query heads of its group (H2O's accumulated attention).
    """
    kv_heads, group, chunk, head_dim = query.shape
    q = query.reshape(kv_heads, group * chunk, head_dim)
    logits = torch.cat([torch.matmul(q, k.transpose(1, 2)) for k in keys], dim=-1).float() * scaling
    total = logits.shape[-1]
    logits = logits.view(kv_heads, group, chunk, total)
    if masks is not None:
        offset = 0
        for k, mask in zip(keys, masks, strict=True):
            if mask is not None:
                logits[..., offset : offset + k.shape[1]].masked_fill_(~mask[:, None, None, :], float("-inf"))
            offset += k.shape[1]
    # Query i of the chunk may see the chunk's keys 0..i only.
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu_(1)
    logits[..., total - chunk :].masked_fill_(future, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    scores = probs.sum(dim=(1, 2))
    flat = probs.view(kv_heads, group * chunk, total)
    output, offset = None, 0
    for v in values:
        part = torch.matmul(flat[..., offset : offset + v.shape[1]].to(v.dtype), v)
        output = part if output is None else output + part
        offset += v.shape[1]
    return output.view(kv_heads, group, chunk, head_dim), scores
