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

    def prefix(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of positions `0..n-1`, each `[n, head_dim]` float32: the rows `lookup(arange(n))`
        returns, as views (no gather), broadcastable over heads."""
        self._ensure(n)
        return self._cos[:n], self._sin[:n]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[..., head_dim]` (rotate-half convention of Llama / Qwen), computed in float32."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class Scratch:
    """A reusable float32 buffer for the attention probabilities of one chunk, shared by all layers.

    On the CPU a fresh 85 MB tensor per layer (a 512-token chunk over 4.6k held tokens) comes from
    `mmap` and page-faults on first touch: that fault cost more than the softmax itself (a chunk's
    attention took 206 ms with fresh tensors, 116 ms with the pages kept). The buffer grows to the
    largest chunk seen and is held until `release` (the decoder releases it after a prefill).
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def take(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """An uninitialised float32 tensor of `shape` on `device` backed by the buffer."""
        n = 1
        for size in shape:
            n *= size
        if self._buffer is None or self._buffer.numel() < n or self._buffer.device != device:
            self._buffer = None  # drop the old one before allocating the new one
            self._buffer = torch.empty(n, dtype=torch.float32, device=device)
        return self._buffer[:n].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer (0 when released)."""
        return self._buffer.nbytes if self._buffer is not None else 0

    def release(self) -> None:
        """Free the buffer (it is allocated again on demand)."""
        self._buffer = None


SCORE_QUERIES = 64
"""A prefill chunk's H2O scores are summed from at most this many of its queries (evenly spaced)."""


def chunk_attention(
    query: torch.Tensor,
    keys: tuple[torch.Tensor, ...],
    values: tuple[torch.Tensor, ...],
    *,
    scaling: float,
    masks: tuple[torch.Tensor | None, ...] | None = None,
    scratch: Scratch | None = None,
    per_query: bool = False,
    attention_dtype: torch.dtype | None = None,
    score_queries: int = SCORE_QUERIES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over cached keys followed by the chunk's own keys.

    query: `[kv_heads, group, chunk, head_dim]` (RoPE applied); query head `kv * group + g` reads
        KV head `kv`, as in transformers' `repeat_kv` (GQA/MQA).
    keys, values: parts `[kv_heads, n_i, head_dim]` (RoPE applied to keys) that concatenate to
        `n_cached + chunk` tokens in slot order; the last `chunk` tokens are the chunk itself.
    masks: optional, one per part: `[kv_heads, n_i]` bool (False = not attended, e.g. a recalled
        slot whose token the cache already holds), or None for a part attended in full.
    Returns `(output [kv_heads, group, chunk, head_dim], scores [kv_heads, n_cached + chunk] float32)`
    where `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]`: the attention mass key j received from this
    chunk, summed over the query heads of its group (H2O's accumulated attention).
    scratch: where float32 probabilities are computed (see `Scratch`); a fresh tensor if None.
    per_query: return scores `[kv_heads, chunk, n_cached + chunk]`, not yet summed over the chunk's
        queries (speculative decoding commits only the queries of accepted tokens); always exact.
    attention_dtype: the dtype a prefill chunk's output is computed in (default: the query's);
        bfloat16 where the model's linear layers already round their inputs to it (int4 CPU weights).
    score_queries: a chunk of more queries than this (per head) sums its scores from every
        `ceil(chunk / score_queries)`-th query only, ending at its last, times that stride.

    Two paths. A decode step (group·chunk < head_dim) attends the parts separately and joins only
    their few logits, so the cached keys are never copied. A prefill chunk joins the parts and
    computes its output with `scaled_dot_product_attention` (a fused kernel: the probabilities of
    512 queries over 4.6k keys, 85 MB per layer, are never written) and its H2O scores from a
    subsample of its queries: an unbiased estimate of H2O's column sums at 1/8 of the cost for a
    512-token chunk. Materialising every probability for the scores was 75 % of a prefill chunk
    (docs/BENCHMARKS.md, section 5g, which also measures what the subsample costs in quality).
    """
    kv_heads, group, chunk, head_dim = query.shape
    if group * chunk >= head_dim or per_query:
        return _prefill_attention(query, keys, values, scaling=scaling, masks=masks, scratch=scratch,
                                  per_query=per_query, attention_dtype=attention_dtype, score_queries=score_queries)
    q = query.reshape(kv_heads, group * chunk, head_dim) * scaling
    total = sum(k.shape[1] for k in keys)
    # Its few logits per part are smaller than the keys: join the logits, not the keys.
    logits = torch.cat([torch.matmul(q.to(part.dtype), part.transpose(1, 2)) for part in keys], dim=-1).float()
    keep = _keep_mask(keys, masks)
    if keep is not None:
        logits.masked_fill_(~keep[:, None, :], float("-inf"))
    # Query i of the chunk may see the chunk's keys 0..i only.
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu_(1)
    logits.view(kv_heads, group, chunk, total)[..., total - chunk :].masked_fill_(future, float("-inf"))
    # Softmax in place, left unnormalised: the output and the column sums take 1/Σ instead.
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    inverse = weights.sum(dim=-1, keepdim=True).reciprocal_()  # [kv_heads, group·chunk, 1]
    scores = torch.matmul(inverse.transpose(1, 2), weights).squeeze(1)
    output, offset = None, 0
    for part in values:
        term = torch.matmul(weights[..., offset : offset + part.shape[1]].to(part.dtype), part)
        output = term.float() if output is None else output.add_(term)  # a 16-bit workspace's term too
        offset += part.shape[1]
    output = (output * inverse).to(query.dtype)
    return output.view(kv_heads, group, chunk, head_dim), scores


def _keep_mask(keys: tuple[torch.Tensor, ...], masks: tuple[torch.Tensor | None, ...] | None) -> torch.Tensor | None:
    """The parts' masks joined `[kv_heads, total]` (True = attended), or None if every key is attended."""
    if masks is None or all(m is None for m in masks):
        return None
    return torch.cat([torch.ones(part.shape[:2], dtype=torch.bool, device=part.device) if m is None else m
                      for part, m in zip(keys, masks, strict=True)], dim=1)


def _prefill_attention(query, keys, values, *, scaling, masks, scratch, per_query, attention_dtype, score_queries):
    """`chunk_attention` of a prefill chunk (see there): fused output, H2O scores from sampled queries."""
    kv_heads, group, chunk, head_dim = query.shape
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    total = k.shape[1]
    device = query.device
    # Query i sees every cached key and the chunk's keys 0..i: [chunk, total], True = attended.
    visible = torch.ones(chunk, total, dtype=torch.bool, device=device).tril_(total - chunk)
    keep = _keep_mask(keys, masks)
    if keep is not None:  # [kv_heads, chunk, total], then one row per query head (kv * group + g)
        visible = (visible & keep[:, None, :]).repeat_interleave(group, dim=0)
    dtype = attention_dtype or query.dtype
    output = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(1, kv_heads * group, chunk, head_dim).to(dtype), k[None].to(dtype), v[None].to(dtype),
        attn_mask=visible, scale=scaling, enable_gqa=True,
    ).to(query.dtype).view(kv_heads, group, chunk, head_dim)
    stride = 1 if per_query else -(-chunk // score_queries)
    rows = torch.arange(chunk - 1, -1, -stride, device=device).flip(0)  # ends at the chunk's last query
    sampled = query if stride == 1 else query[:, :, rows]
    n = sampled.shape[2]
    q = sampled.reshape(kv_heads, group * n, head_dim) * scaling
    if scratch is not None and q.dtype == torch.float32:
        logits = torch.matmul(q, k.transpose(1, 2), out=scratch.take((kv_heads, group * n, total), device))
    else:  # 16-bit compute on GPUs: softmax and scores in float32
        logits = torch.matmul(q, k.transpose(1, 2)).float()
    hidden = ~(visible if keep is not None else visible[None])  # [kv_heads·group or 1, chunk, total]
    hidden = hidden[:, rows] if stride > 1 else hidden
    logits.view(kv_heads, group, n, total).masked_fill_(hidden.view(-1, group if keep is not None else 1, n, total), float("-inf"))
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    inverse = weights.sum(dim=-1, keepdim=True).reciprocal_()  # [kv_heads, group·n, 1]
    if per_query:
        return output, (weights * inverse).view(kv_heads, group, chunk, total).sum(dim=1)
    # Σ_i P[i, j] = Σ_i w[i, j] / Σ_j' w[i, j'], as one matrix-vector product per KV head
    scores = torch.matmul(inverse.transpose(1, 2), weights).squeeze(1)
    return output, scores * stride if stride > 1 else scores
