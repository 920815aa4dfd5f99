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

from engine.kvcache import column_sums
from engine.kvcache.decode_workspace import Bf16Int8Workspace


class RotaryTable:
    """cos / sin tables of the model's own rotary embedding, grown on demand.

    Built by calling the model's `rotary_emb` module once per size, so any static RoPE variant the
    model implements (default, linear, Llama-3 frequency scaling, YaRN) is reproduced exactly.
    `lookup(positions)` takes integer positions of any shape and returns cos, sin
    `[*positions.shape, head_dim]` float32. `joint(positions)` returns both in one gather for `rotate`.
    """

    def __init__(self, rotary_emb: torch.nn.Module, head_dim: int, device: torch.device) -> None:
        self.rotary_emb = rotary_emb
        self.head_dim = head_dim
        self.device = device
        self._cos = torch.empty((0, head_dim), device=device)
        self._sin = torch.empty((0, head_dim), device=device)
        # [positions, 2 · head_dim]: cos | sin with rotate-half's sign folded in (see `rotate`)
        self._joint = torch.empty((0, 2 * head_dim), device=device)

    def _ensure(self, size: int) -> None:
        if size <= self._cos.shape[0]:
            return
        size = max(size, 2 * self._cos.shape[0], 1024)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        positions = torch.arange(size, device=self.device)[None]
        with torch.no_grad():
            cos, sin = self.rotary_emb(probe, positions)
        self._cos, self._sin = cos[0].float(), sin[0].float()
        half = self.head_dim // 2
        self._joint = torch.cat((self._cos, -self._sin[:, :half], self._sin[:, half:]), dim=-1)

    def _size_for(self, positions: torch.Tensor, bound: int | None) -> int:
        if bound is not None:
            return bound
        return int(positions.max()) + 1 if positions.numel() else 0

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for `positions` (int tensor, any shape) -> each `[*shape, head_dim]` float32."""
        self._ensure(self._size_for(positions, None))
        return self._cos[positions], self._sin[positions]

    def joint(self, positions: torch.Tensor | None = None, *, bound: int | None = None,
              rows: slice | None = None) -> torch.Tensor:
        """cos and signed sin of `positions` (int tensor, any shape) as one `[*shape, 2 · head_dim]`
        float32 tensor for `rotate`, in one gather; or of the positions in `rows` as a view (no
        gather). `bound`: a known upper bound (exclusive) of the positions, which spares reading
        their maximum back (a sync per call; a decode step makes several per layer)."""
        if rows is not None:
            self._ensure(rows.stop)
            return self._joint[rows]
        self._ensure(self._size_for(positions, bound))
        return self._joint[positions]


def rotate(x: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
    """`apply_rope(x, cos, sin)`, bit for bit, from `RotaryTable.joint` (broadcastable to
    `[..., 2 · head_dim]`): x·cos + roll(x, head_dim / 2)·sin' with sin' = (-sin_low | sin_high) is
    rotate-half's product with the sign moved onto the table; four ops instead of eight."""
    x32 = x.float()
    d = x32.shape[-1]
    return (x32 * joint[..., :d] + x32.roll(d // 2, -1) * joint[..., d:]).to(x.dtype)


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


def fused_prefill(attention_dtype: torch.dtype | None, device: torch.device) -> bool:
    """Whether a prefill chunk takes the fused path: bfloat16 attention on a CPU (the kernel that
    also returns each query's log-sum-exp, `_scaled_dot_product_flash_attention_for_cpu`)."""
    return attention_dtype == torch.bfloat16 and device.type == "cpu"


def chunk_attention(
    query: torch.Tensor,
    keys: tuple[torch.Tensor, ...],
    values: tuple[torch.Tensor, ...],
    *,
    scaling: float,
    masks: tuple[torch.Tensor | None, ...] | None = None,
    scratch: Scratch | None = None,
    scoring: str = "sum",
    attention_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over cached keys followed by the chunk's own keys.

    query: `[kv_heads, group, chunk, head_dim]` (RoPE applied); query head `kv * group + g` reads
        KV head `kv`, as in transformers' `repeat_kv` (GQA/MQA).
    keys, values: parts `[kv_heads, n_i, head_dim]` (RoPE applied to keys) that concatenate to
        `n_cached + chunk` tokens in slot order; the last `chunk` tokens are the chunk itself. A
        part may also be the decode workspace as a `Bf16Int8Workspace` (the same object in both).
    masks: optional, one per part: `[kv_heads, n_i]` bool (False = not attended, e.g. a recalled
        slot whose token the cache already holds), or None for a part attended in full.
    Returns `(output [kv_heads, group, chunk, head_dim], scores [kv_heads, n_cached + chunk] float32)`
    where `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]`: the attention mass key j received from this
    chunk, summed over the query heads of its group (H2O's accumulated attention).
    scratch: where the float32 probabilities are computed (see `Scratch`); a fresh tensor if None
        or if the compute dtype is not float32.
    scoring: "sum" (default): the scores above. "per_query": `[kv_heads, chunk, n_cached + chunk]`,
        not summed over the queries (speculative decoding commits only accepted tokens). "window":
        a prefill chunk is scored by its last queries only (`window_attention`, SnapKV), with no
        `[chunk, total]` probabilities; a decode step (group·chunk < head_dim) as with "sum".
    attention_dtype: bfloat16 on a CPU sends a prefill chunk down the fused path (`fused_prefill`);
        otherwise the probabilities are materialised in float32.

    Cost: for a prefill chunk the probabilities `[kv_heads, group·chunk, total]` float32 are the
    only large tensor (85 MB per layer for a 512-token chunk over 4.6k tokens with 9 query heads),
    so everything that touches them is done once and in place: the parts' keys and values are
    joined first (a copy 72× smaller than the logits), the scaling is folded into the queries, masks
    are filled in place. Joining logits per part and scaling them afterwards took 30 % of a
    prefill. For a decode step (group·chunk < head_dim) it is the other way round (`_step_attention`).
    The probabilities were still 75 % of a chunk with int4 weights: `_fused_attention` halves that.
    """
    kv_heads, group, chunk, head_dim = query.shape
    if scoring not in ("sum", "per_query", "window"):  # a typo would silently mean "sum"
        raise ValueError(f"scoring must be 'sum', 'per_query' or 'window', got {scoring!r}")
    per_query = scoring == "per_query"
    joined = group * chunk >= head_dim  # a prefill chunk: logits dwarf keys, so join the keys
    if not joined:
        return _step_attention(query, keys, values, scaling=scaling, masks=masks, per_query=per_query)
    if any(isinstance(part, Bf16Int8Workspace) for part in keys):  # a long draft chunk over the decode workspace
        dense = [part.dense() if isinstance(part, Bf16Int8Workspace) else (part, v)
                 for part, v in zip(keys, values, strict=True)]
        keys, values = tuple(k for k, _ in dense), tuple(v for _, v in dense)
    if scoring == "window":
        compute = torch.bfloat16 if fused_prefill(attention_dtype, query.device) else query.dtype
        return window_attention(query, keys, values, scaling=scaling, masks=masks, window=SNAP_WINDOW_QUERIES,
                                compute=compute)
    if not per_query and fused_prefill(attention_dtype, query.device):
        return _fused_attention(query, keys, values, scaling=scaling, masks=masks)
    q = query.reshape(kv_heads, group * chunk, head_dim) * scaling
    total = sum(k.shape[1] for k in keys)
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    if scratch is not None and q.dtype == torch.float32:
        logits = torch.matmul(q, k.transpose(1, 2), out=scratch.take((kv_heads, group * chunk, total), q.device))
    else:  # 16-bit compute on GPUs: softmax and scores in float32
        logits = torch.matmul(q, k.transpose(1, 2)).float()
    keep = _keep_mask(keys, masks)
    if keep is not None:
        logits.masked_fill_(~keep[:, None, :], float("-inf"))
    _hide_future(logits.view(kv_heads, group, chunk, total), chunk)
    # Softmax in place (the exponentials overwrite the logits), left unnormalised: the output and
    # the column sums take the row normaliser 1/Σ instead (a pass over the probabilities saved).
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    inverse = weights.sum(dim=-1, keepdim=True).reciprocal_()  # [kv_heads, group·chunk, 1]
    if per_query:
        scores = (weights * inverse).view(kv_heads, group, chunk, total).sum(dim=1)
    else:  # Σ_i P[i, j] = Σ_i w[i, j] / Σ_j' w[i, j'], as one matrix-vector product per KV head
        scores = torch.matmul(inverse.transpose(1, 2), weights).squeeze(1)
    output = torch.matmul(weights if v.dtype == torch.float32 else weights.to(v.dtype), v)
    output = (output * inverse.to(output.dtype)).to(query.dtype)
    return output.view(kv_heads, group, chunk, head_dim), scores


SNAP_WINDOW_QUERIES = 32
"""Queries at the end of a prefill chunk whose attention scores the keys (`window_attention`):
SnapKV's observation window (kvpress's `SnapKVPress` uses 64 of a whole context; a chunk is 512)."""

SNAP_POOL_KERNEL = 5
"""Keys per average-pooling window over the observation window's scores (SnapKV's and kvpress's
default kernel): a key near attended keys keeps its neighbours' context with it."""


def window_attention(query, keys, values, *, scaling, masks, window, compute) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_attention` of a prefill chunk scored by its observation window (SnapKV, Li et al. 2024,
    arXiv 2404.14469; kvpress `SnapKVPress`).

    The output comes from a fused kernel that never writes the probabilities (`_flash_output` on a
    CPU, in `compute`: bfloat16 on the fused path, else the query's dtype; torch's
    `scaled_dot_product_attention` elsewhere); the scores from `window_scores`, a
    `[group·window, total]` product per KV head: `window / chunk` of a second attention pass.
    Shapes as `chunk_attention`; returns `(output [kv_heads, group, chunk, head_dim] in the query's
    dtype, scores [kv_heads, total] float32)`.
    """
    kv_heads, group, chunk, head_dim = query.shape
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    keep = _keep_mask(keys, masks)
    if query.device.type == "cpu":
        output, _, _ = _flash_output((query * scaling).to(compute), k.to(compute), v.to(compute), keep)
    else:  # a GPU: [kv_heads, 1, chunk, total] True = attended, broadcast over the group
        attended = keep if keep is not None else torch.ones(k.shape[:2], dtype=torch.bool, device=k.device)
        group_view = lambda t: t.to(compute)[:, None].expand(-1, group, -1, -1)
        output = torch.nn.functional.scaled_dot_product_attention(
            query.to(compute), group_view(k), group_view(v), attn_mask=~_hidden_mask(attended, chunk)[:, None], scale=scaling)
    scores = window_scores(query, k, keep, window=window, scaling=scaling)
    return output.to(query.dtype).reshape(kv_heads, group, chunk, head_dim), scores


def window_scores(query: torch.Tensor, keys: torch.Tensor, keep: torch.Tensor | None, *, window: int, scaling: float,
                  kernel: int = SNAP_POOL_KERNEL) -> torch.Tensor:
    """SnapKV's key scores of one chunk: `[kv_heads, total]` float32.

    query `[kv_heads, group, chunk, head_dim]` (RoPE applied), keys `[kv_heads, total, head_dim]`
    (the last `chunk` the chunk's own), keep `[kv_heads, total]` bool or None. With w = min(window,
    chunk): `s[kv, j] = Σ_g Σ_{i ≥ chunk - w} P[kv, g, i, j]` (softmax in float32 over the keys
    query i attends: kept ones, the chunk's own up to i), averaged over `kernel` neighbouring keys
    (zero-padded at the ends, as torch's `avg_pool1d` and kvpress do), zero where `keep` is False,
    and multiplied by chunk / w so that a chunk adds as much mass as H2O's sum over all its queries
    would (the `"mean"` ranking, decode steps and `attention_since` add to the same scores).
    """
    kv_heads, group, chunk, head_dim = query.shape
    total, w = keys.shape[1], min(window, chunk)
    q = query[:, :, chunk - w :].reshape(kv_heads, group * w, head_dim).float() * scaling
    logits = torch.matmul(q, keys.float().transpose(1, 2))  # [kv_heads, group·w, total]
    if keep is not None:
        logits.masked_fill_(~keep[:, None, :], float("-inf"))
    # Window query i sits at chunk position chunk - w + i: the chunk's keys after it are hidden.
    later = torch.ones(w, chunk, dtype=torch.bool, device=logits.device).triu_(chunk - w + 1)
    logits.view(kv_heads, group, w, total)[..., total - chunk :].masked_fill_(later, float("-inf"))
    mass = torch.softmax(logits, dim=-1).sum(dim=1)  # [kv_heads, total]
    pooled = torch.nn.functional.avg_pool1d(mass[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]
    if keep is not None:
        pooled.masked_fill_(~keep, 0.0)
    return pooled.mul_(chunk / w)


def _hide_future(logits: torch.Tensor, chunk: int) -> None:
    """Mask, in place, the chunk's keys after each query: `logits` `[kv_heads, group, chunk, total]`
    whose last `chunk` columns are the chunk itself (query i may see the chunk's keys 0..i only)."""
    if chunk > 1:
        future = torch.ones(chunk, chunk, dtype=torch.bool, device=logits.device).triu_(1)
        logits[..., logits.shape[-1] - chunk :].masked_fill_(future, float("-inf"))


def _step_attention(query, keys, values, *, scaling, masks, per_query) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_attention` of a decode step (or a few draft tokens: group·chunk < head_dim): the few
    logits per part are smaller than the keys, so the parts are attended separately and only their
    logits joined (the cache is never copied), with one fused softmax: every extra op is paid 30
    times per generated token. An `Bf16Int8Workspace` part (the CPU decode workspace) is read with its
    own kernels: the query and the probabilities rounded to bfloat16, its logits and output
    accumulated in float32 and rounded to bfloat16."""
    kv_heads, group, chunk, head_dim = query.shape
    q = query.reshape(kv_heads, group * chunk, head_dim) * scaling
    logits = torch.cat([part_logits(q, part) for part in keys], dim=-1).float()
    total = logits.shape[-1]
    keep = _keep_mask(keys, masks)
    if keep is not None:
        logits.masked_fill_(~keep[:, None, :], float("-inf"))
    _hide_future(logits.view(kv_heads, group, chunk, total), chunk)
    probs = torch.softmax(logits, dim=-1)  # [kv_heads, group·chunk, total]
    scores = probs.view(kv_heads, group, chunk, total).sum(dim=1) if per_query else probs.sum(dim=1)
    output, offset = None, 0
    for part in values:
        term = part_output(probs[..., offset : offset + part.shape[1]], part)
        output = term if output is None else output + term
        offset += part.shape[1]
    return output.to(query.dtype).view(kv_heads, group, chunk, head_dim), scores


def part_logits(q: torch.Tensor, part, q_packed: torch.Tensor | None = None) -> torch.Tensor:
    """q·kᵀ `[kv_heads, rows, n]` of one part (a tensor `[kv_heads, n, head_dim]`, or the decode
    workspace with its own kernel) for queries `q` `[kv_heads, rows, head_dim]`; `q_packed`: `q`
    already rounded to bfloat16, which the workspace's kernel then takes (`engine.kvcache.step`
    rounds once per layer). A plain `bmm`: `matmul`'s reshapes around it are operators too."""
    if isinstance(part, Bf16Int8Workspace):
        return part.logits(q if q_packed is None else q_packed)
    return torch.bmm(q.to(part.dtype), part.transpose(1, 2))


def part_output(probs: torch.Tensor, part) -> torch.Tensor:
    """p·v `[kv_heads, rows, head_dim]` of one part for its probabilities `[kv_heads, rows, n]`."""
    if isinstance(part, Bf16Int8Workspace):
        return part.weighted_values(probs)
    return torch.bmm(probs.to(part.dtype), part)


def _keep_mask(keys: tuple[torch.Tensor, ...], masks: tuple[torch.Tensor | None, ...] | None) -> torch.Tensor | None:
    """The parts' masks joined `[kv_heads, total]` (True = attended), or None if every key is attended."""
    if masks is None or all(m is None for m in masks):
        return None
    return torch.cat([torch.ones(part.shape[:2], dtype=torch.bool, device=part.device) if m is None else m
                      for part, m in zip(keys, masks, strict=True)], dim=1)


def _fused_attention(query, keys, values, *, scaling, masks) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_attention` of a prefill chunk in bfloat16 on a CPU, without float32 probabilities.

    1. The output and each query's log-sum-exp `L_i` come from the flash-attention kernel
       (`_scaled_dot_product_flash_attention_for_cpu`; FlashAttention-2, Dao 2023): the 85 MB of
       probabilities per layer are never written. Without masks (no recall) the cached keys and
       the chunk's own keys (causal) are two calls joined by their log-sum-exps, so no
       `[chunk, total]` mask is built or read.
    2. H2O's column sums are then exact but for bfloat16 rounding: `P[i, j] = exp(q_i·k_j·scale - L_i)`,
       with `-L_i` folded into the queries as two more columns (its bfloat16 high and low parts
       against keys' columns of ones), so one product gives `log P` (`engine/kvcache/column_sums.py`:
       without masks the way this CPU runs faster, measured once; with masks blocked bfloat16
       matmuls). 0.2-0.3 % L1 error in the scores against float64 (rounding the logits themselves
       to bfloat16 before subtracting: 1.4 %).
    A query whose every key is masked (not reachable: a chunk always sees itself) gets a zero
    output here and NaN on the materialised path.
    Summing the scores from a subsample of queries instead (every 2nd to 8th) was cheaper but made
    the continuation probe's KL worse at 75-90 % dropped (`bench/prefill_attention.py`).
    """
    kv_heads, group, chunk, head_dim = query.shape
    bf16 = torch.bfloat16
    k = (keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)).to(bf16)
    v = (values[0] if len(values) == 1 else torch.cat(values, dim=1)).to(bf16)
    total = k.shape[1]
    keep = _keep_mask(keys, masks)
    q = (query * scaling).to(bf16)
    output, lse, hidden = _flash_output(q, k, v, keep)
    output = output.to(query.dtype).reshape(kv_heads, group, chunk, head_dim)
    minus = -lse.reshape(kv_heads, group, chunk, 1)
    high = minus.to(bf16)
    # Queries with -L_i as two more columns (bfloat16 high and low parts), keys with two of ones.
    rows = torch.cat((q, high, (minus - high.float()).to(bf16)), dim=-1)  # [kv_heads, group, chunk, d + 2]
    cols = torch.cat((k, k.new_ones((kv_heads, total, 2))), dim=-1)  # [kv_heads, total, d + 2]
    if keep is None:
        return output, column_sums.unmasked_sums(rows, cols, chunk)
    return output, column_sums.blocked_sums(rows, cols, chunk, hidden)


def _flash_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A chunk's attention output from the CPU flash kernel (FlashAttention-2, Dao 2023;
    `_scaled_dot_product_flash_attention_for_cpu`, float32 or bfloat16), no probabilities written.

    q: `[kv_heads, group, chunk, head_dim]` scaled (the kernel runs at scale 1); k, v `[kv_heads,
    total, head_dim]` joined, the last `chunk` being the chunk itself; keep `[kv_heads, total]` or
    None. Returns `(output [kv_heads, group, chunk, head_dim] float32 or q's dtype, log-sum-exp
    [kv_heads, group, chunk] float32, hidden)`, hidden: the `[kv_heads, chunk, total]` bool mask
    built when `keep` is given (True = not attended), else None.
    The KV heads are the batch and the group the heads: keys, values and mask are broadcast over the
    group (stride 0), never copied per query head; the cached keys' call folds the group into the
    query sequence instead (`_folded_flash`). Without masks the cached keys (unmasked) and the
    chunk's own keys (causal: the kernel skips the blocks above the diagonal) are two calls joined
    by their log-sum-exps, so no `[chunk, total]` mask is built or read."""
    group, chunk, total = q.shape[1], q.shape[2], k.shape[1]
    flash = lambda first, last, **mask: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(  # noqa: E731
        q, k[:, None, first:last].expand(-1, group, -1, -1), v[:, None, first:last].expand(-1, group, -1, -1),
        0.0, scale=1.0, **mask)[:2]
    if keep is None:
        output, lse = flash(total - chunk, total, is_causal=True)
        if total > chunk:
            cached, cached_lse = _folded_flash(q, k[:, : total - chunk], v[:, : total - chunk])
            joint_lse = torch.logaddexp(lse, cached_lse)
            output = (output.float() * (lse - joint_lse).exp_()[..., None]).addcmul_(
                cached.float(), (cached_lse - joint_lse).exp_()[..., None])
            lse = joint_lse
        return output, lse, None
    hidden = _hidden_mask(keep, chunk)  # [kv_heads, chunk, total]: shared by the group's query heads
    bias = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, float("-inf"))
    output, lse = flash(0, total, attn_mask=bias[:, None])
    return output, lse, hidden


def _folded_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's (output, log-sum-exp) of `q` `[kv_heads, group, chunk, head_dim]` (scaled)
    over keys and values `[kv_heads, n, head_dim]` attended in full, with the group's query heads
    folded into one sequence of group·chunk queries per KV head: each row's arithmetic is the same
    (bit for bit, `tests/test_prefill_exact.py`), but the kernel gets one long query sequence per KV
    head instead of `group` short ones, and reads each key block once per KV head, not once per
    query head (5 % faster per layer on an AMD EPYC, 2 % over a whole 8k prefill). Returns
    `[kv_heads, group, chunk, head_dim]` and `[kv_heads, group, chunk]`."""
    kv_heads, group, chunk, head_dim = q.shape
    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.reshape(kv_heads, 1, group * chunk, head_dim), k[:, None], v[:, None], 0.0, scale=1.0)[:2]
    # The kernel's log-sum-exp of a per-head call lies [kv_heads, chunk, group] in memory; the merge
    # with the causal call's (`logaddexp`, then `addcmul_`) rounds differently over other strides.
    lse = lse.view(kv_heads, group, chunk).transpose(1, 2).contiguous().transpose(1, 2)
    return output.view(kv_heads, group, chunk, head_dim), lse


def _hidden_mask(keep: torch.Tensor, chunk: int) -> torch.Tensor:
    """`[kv_heads, chunk, total]` bool, True where query i of the chunk does not attend key j: the
    keys `keep` `[kv_heads, total]` hides, and the chunk's own keys after i."""
    total = keep.shape[1]
    hidden = (~keep[:, None, :]).repeat(1, chunk, 1)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=keep.device).triu_(1)
    hidden[..., total - chunk :] |= later
    return hidden
