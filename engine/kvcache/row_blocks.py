"""A prefill chunk's attention and H2O scores in float32 on a CPU, one KV head and one block of query
rows at a time: `mm`, `softmax`, column sums, `mm`.

The materialised path of `attention.chunk_attention` runs the same arithmetic as batched `matmul`s
over every KV head at once, with the `[kv_heads, group·chunk, total]` probabilities (85 MB a layer
for SmolLM2 at a full budget) in memory. On the CPUs measured here torch's batched float32 product
ran at a third of its per-matrix `mm` rate (a layer's logits: 64 ms as one `bmm`, 3 × 9.5 ms as
`mm`s, 1 thread, an AMD EPYC), so it is done per KV head, in blocks of `ROWS` query rows whose
probabilities stay in cache. One layer's chunk of 512 queries over 4,608 keys took 80-89 ms,
against 135-138 ms materialised and 102-147 ms on the bfloat16 flash paths, float32 throughout
(docs/BENCHMARKS.md §5p). Which of these a CPU runs is measured at start (`prefill_choice`).
"""

from __future__ import annotations

import torch

ROWS = 128
"""Query rows (of one KV head) per block: 128 was faster than 256 and 512 on the EPYC at one thread
(a block's probabilities over 4.6k keys: 2.4 MB, near its L2 cache)."""


def row_block_attention(query: torch.Tensor, keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...], *,
                        scaling: float, keep: torch.Tensor | None, scratch=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of a chunk over cached keys followed by its own keys, with H2O's scores.

    query: `[kv_heads, group, chunk, head_dim]` float32 (RoPE applied); keys, values: parts
    `[kv_heads, n_i, head_dim]` float32 that join to `total` tokens, the last `chunk` being the
    chunk's own; keep: `[kv_heads, total]` bool (False = not attended) or None for all. Returns
    `(output [kv_heads, group, chunk, head_dim] float32, scores [kv_heads, total] float32)` with
    `scores[kv, j] = Σ_g Σ_i P[kv, g, i, j]` (H2O's accumulated attention, Zhang et al. 2023), the
    softmax in float32 as the materialised path computes it. A query whose every key is hidden
    (not reachable: a chunk always sees itself) gets NaN, as on the materialised path.
    scratch: an `attention.Scratch` the blocks' logits and probabilities are written into (two
    `[ROWS, total]` float32 buffers, kept across chunks), or None for fresh ones per block."""
    kv_heads, group, chunk, head_dim = query.shape
    k = keys[0] if len(keys) == 1 else torch.cat(keys, dim=1)
    v = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    total = k.shape[1]
    q = (query * scaling).reshape(kv_heads, group * chunk, head_dim)
    output = torch.empty((kv_heads, group * chunk, head_dim), dtype=torch.float32, device=query.device)
    scores = torch.zeros((kv_heads, total), dtype=torch.float32, device=query.device)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).triu_(1)
    hidden = None if keep is None else ~keep
    block = min(ROWS, group * chunk)
    buffers = (scratch.take((2, block, total), query.device) if scratch is not None
               else torch.empty((2, block, total), dtype=torch.float32, device=query.device))
    for head in range(kv_heads):
        keys_t = k[head].t()
        for first in range(0, group * chunk, block):
            rows = slice(first, min(first + block, group * chunk))
            n = rows.stop - rows.start
            logits = torch.mm(q[head, rows], keys_t, out=buffers[0, :n])  # [rows, total]
            if hidden is not None:
                logits.masked_fill_(hidden[head], float("-inf"))
            queries = torch.arange(rows.start, rows.stop, device=query.device) % chunk
            logits[:, total - chunk :].masked_fill_(later[queries], float("-inf"))
            probs = torch.softmax(logits, dim=1, out=buffers[1, :n])
            scores[head] += probs.sum(dim=0)
            torch.mm(probs, v[head], out=output[head, rows])
    return output.view(kv_heads, group, chunk, head_dim), scores
