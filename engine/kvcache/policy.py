"""Which cached tokens survive an eviction: attention sinks ∪ recent window ∪ heavy hitters.

Each rule is a small scorer (the shape of NVIDIA kvpress's presses): *protectors* mark tokens that
must stay, the *ranker* orders the rest; `select_kept` composes them. A new policy is a new scorer,
not a change to the cache.

Inputs are per KV head: `token_index` `[kv_heads, n]` (each slot's position in the whole token
stream, 0-based) and `scores` `[kv_heads, n]` (accumulated attention). `seen_tokens` is how many
tokens have entered the cache so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionSinks:
    """Attention sinks (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453).

    tokens: the first `tokens` positions of the stream are always kept (default 4); models park
    excess attention there, and dropping them breaks fluency far more than their share suggests.
    """

    tokens: int = 4

    def protect(self, token_index: torch.Tensor, seen_tokens: int) -> torch.Tensor:
        return token_index < self.tokens


@dataclass(frozen=True)
class RecentWindow:
    """Recent window: the newest `tokens` positions are always kept (default 1024).

    Local context carries most of the next token's evidence; H2O keeps it too.
    """

    tokens: int = 1024

    def protect(self, token_index: torch.Tensor, seen_tokens: int) -> torch.Tensor:
        return token_index >= seen_tokens - self.tokens


HEAVY_HITTER_SCORES = ("sum", "mean", "window")


@dataclass(frozen=True)
class HeavyHitters:
    """Heavy hitters (H2O, Zhang et al. 2023, arXiv 2306.14048).

    Ranks tokens by accumulated attention S_j = Σ_τ Σ_h A[h, τ, j]: the probability mass every query
    step τ since token j entered gave it, summed over the query heads h of its KV group. The
    summation itself happens in the attention step (`engine.kvcache.attention`); this scorer only
    reads it.

    score: "sum" ranks by S_j (H2O); "mean" by S_j / (seen_tokens - j), the mass per query that
    could see token j (kvpress ObservedAttentionPress): the plain sum favours old tokens, which
    simply had more queries to collect from. The cache's default is "mean" (`CachePolicy`); this
    scorer's own default stays the paper's sum. "window" ranks as "mean" does, but a prefill chunk
    adds only the attention of its last queries (SnapKV's observation window, Li et al. 2024, arXiv
    2404.14469: `engine.kvcache.attention.window_scores`), scaled to the chunk's size: the chunk's
    output then needs no probabilities, and no second attention pass is paid for the scores; with
    eviction after every chunk it was 1.35-2.2x further from the full cache than "mean"
    (docs/BENCHMARKS.md, section 2f), so it is an option, not the default.
    """

    score: str = "sum"

    def rank(self, scores: torch.Tensor, token_index: torch.Tensor, seen_tokens: int) -> torch.Tensor:
        if self.score in ("mean", "window"):
            return scores / (seen_tokens - token_index).clamp_min(1).to(scores.dtype)
        return scores


def select_kept(
    token_index: torch.Tensor,
    scores: torch.Tensor,
    *,
    seen_tokens: int,
    budget_tokens: int,
    protectors: tuple[AttentionSinks | RecentWindow, ...],
    ranker: HeavyHitters,
) -> torch.Tensor:
    """Slots to keep per KV head: `[kv_heads, min(n, budget_tokens)]`, ascending.

    Every protected slot is kept; the rest of the budget goes to the highest-ranked slots. Raises
    ValueError if the protected slots alone exceed the budget (settings validation prevents it).
    """
    n = token_index.shape[-1]
    k = min(n, budget_tokens)
    protected = torch.zeros_like(token_index, dtype=torch.bool)
    for rule in protectors:
        protected |= rule.protect(token_index, seen_tokens)
    if int(protected.sum(dim=-1).max()) > k:
        raise ValueError("sink + window tokens exceed the budget")
    priority = torch.where(protected, torch.full_like(scores, float("inf")), ranker.rank(scores, token_index, seen_tokens).float())
    kept = priority.topk(k, dim=-1, sorted=False).indices
    # Ascending without a sort (400 µs per layer for 4k slots here): mark the kept slots, read them
    # back in order; every head keeps exactly k.
    marked = torch.zeros_like(protected).scatter_(1, kept, True)
    return marked.nonzero()[:, 1].view(kept.shape)
