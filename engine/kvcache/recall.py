"""Recall: when a question arrives, bring back the archived blocks its queries attend to.

The document snapshot (sinks + window + heavy hitters) was chosen before the question existed.
Layer by layer, while the question is prefilled, its queries score every block of the archive
(`engine.kvcache.archive`) by Quest's upper bound (Tang et al. 2024, arXiv 2406.10774):

    bound(q, block) = Σ_c max(q_c · min_c, q_c · max_c) = q⁺ · key_max + q⁻ · key_min  ≥  q · k

for every key k of the block (min / max are per channel over the block's keys after RoPE; the
second form is two matrix products). Bounds of one query are turned into a distribution over blocks
(log-softmax), so that queries with large logits everywhere do not drown the others, and a block's
score is its best over the question's query heads and tokens. Blocks whose every token is already
held are skipped; the top `recall_tokens // block_tokens` blocks per KV head are read from the
archive, minus the tokens the snapshot already holds. The recalled tokens are attended by the
question and the whole answer and are never evicted; the snapshot itself is not touched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.kvcache.archive import Archive
from engine.kvcache.attention import RotaryTable, apply_rope


@dataclass
class RecallStats:
    """What recall did for one question, summed over layers."""

    blocks_scored: int = 0       # archive blocks scored, per layer and KV head, over every selection
    blocks_recalled: int = 0     # blocks recalled now, summed over layers and KV heads
    tokens_recalled: int = 0     # tokens recalled now (held tokens excluded), summed over layers and KV heads
    bytes_read: int = 0          # archive bytes read (codes and metadata), over every selection
    score_s: float = 0.0         # seconds spent scoring blocks
    read_s: float = 0.0          # seconds spent reading and dequantizing recalled blocks
    refreshes: int = 0           # selections made again with the answer's own queries
    question_s: float = 0.0      # seconds of the selection at the question (what it adds to the TTFT)
    spans: tuple[str, ...] = ()  # span recall: the spans recalled whole ("page 55"), in document order
    signals: tuple[str, ...] = ()  # what chose each of `spans` (structure, section, conversation, words, map)
    reasons: tuple[str, ...] = ()  # each of `spans`'s reason in a reader's words ("chapter 8", "matching words")
    reread: bool = False         # span recall prefilled the spans again from their token ids (no archive)

    @property
    def seconds(self) -> float:
        return self.score_s + self.read_s


@dataclass
class RecalledTokens:
    """One layer's recalled tokens. `index` / `valid` / `mass` are `[kv_heads, R]`; `keys` / `values`
    `[kv_heads, R, head_dim]` (keys before RoPE) in the compute dtype; `fields` are the quantized
    bytes as read (what the memory accounting counts). Invalid slots (already held, or past the end
    of the document) are masked out of attention."""

    index: torch.Tensor
    valid: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    fields: dict[str, torch.Tensor]
    mass: torch.Tensor = field(default=None)  # attention received, float32 (sources)
    owner: object = None  # the Recaller that chose them
    # Focus (`SpanRecaller`): held tokens before this stream position (the document) are not
    # attended; the recalled tokens, the same for every head and in document order, take positions
    # 0..R-1 and every later token R + (its position − focus_from). None: held tokens are attended.
    focus_from: int | None = None

    def __post_init__(self) -> None:
        if self.mass is None:
            self.mass = torch.zeros(self.index.shape, dtype=torch.float32, device=self.index.device)

    def nbytes(self) -> int:
        """Bytes held as the cache holds them: quantized fields + int32 position + float32 mass."""
        return sum(t.nbytes for t in self.fields.values()) + 8 * self.index.numel()


def block_upper_bounds(query: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor, scaling: float) -> torch.Tensor:
    """Quest's bound on the attention logit of every query for every block: `[kv_heads, m, n_blocks]`.

    query: `[kv_heads, m, head_dim]` after RoPE at the queries' original positions (m = the query
    heads of the group times the question tokens); key_min / key_max `[n_blocks, kv_heads, head_dim]`.
    `scaling` is the attention's 1/sqrt(head_dim).
    """
    q = query.float()
    upper = q.clamp_min(0) @ key_max.permute(1, 2, 0) + q.clamp_max(0) @ key_min.permute(1, 2, 0)
    return upper * scaling


def block_scores(query: torch.Tensor, key_min: torch.Tensor, key_max: torch.Tensor, scaling: float) -> torch.Tensor:
    """Score of each archive block for each KV head, `[kv_heads, n_blocks]`: the best over the
    queries of the block's bound, each query's bounds normalised by a log-softmax over blocks."""
    return torch.log_softmax(block_upper_bounds(query, key_min, key_max, scaling), dim=-1).amax(dim=1)


def exact_block_scores(query: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, block_tokens: int, scaling: float) -> torch.Tensor:
    """Score of candidate blocks from their real keys: `[kv_heads, c]` for `keys` `[kv_heads, c *
    block_tokens, head_dim]` (after RoPE) and `valid` `[kv_heads, c * block_tokens]` (False: held or
    past the end). Each query's logits are normalised over all candidate tokens (log-softmax, its
    attention as if only they were there); a block scores its best token under its best query."""
    logits = (query.float() @ keys.float().transpose(1, 2)) * scaling  # [H, m, c * B]
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    normalised = torch.log_softmax(logits, dim=-1).nan_to_num(nan=float("-inf"))
    heads, m, _ = normalised.shape
    return normalised.view(heads, m, -1, block_tokens).amax(dim=(1, 3))


def held_tokens(index: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """`[kv_heads, n_tokens]` bool: which document tokens a layer holds, from its positions `index`."""
    held = torch.zeros((index.shape[0], n_tokens), dtype=torch.bool, device=index.device)
    inside = index.long().clamp(max=n_tokens)  # question / answer tokens land in a spare column
    spare = torch.zeros((index.shape[0], 1), dtype=torch.bool, device=index.device)
    return torch.cat((held, spare), dim=1).scatter_(1, inside, True)[:, :n_tokens]


def select_tokens(scores: torch.Tensor, held: torch.Tensor, block_tokens: int, max_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top blocks per KV head by `scores` `[kv_heads, n_blocks]`, skipping blocks fully in `held`.

    Returns (token index `[kv_heads, k * block_tokens]` long, valid `[kv_heads, k * block_tokens]`
    bool), k = min(max_blocks, n_blocks); held tokens, tokens past the end and blocks that were not
    eligible are invalid. Token indices of invalid slots are clamped into the document.
    """
    heads, n_tokens = held.shape
    n_blocks = scores.shape[1]
    padded = torch.nn.functional.pad(held, (0, n_blocks * block_tokens - n_tokens), value=True)
    full = padded.view(heads, n_blocks, block_tokens).all(dim=-1)
    k = min(max_blocks, n_blocks)
    top = scores.masked_fill(full, float("-inf")).topk(k, dim=-1)
    blocks = top.indices.sort(dim=-1)  # document order
    chosen = torch.isfinite(torch.gather(top.values, 1, blocks.indices))
    offsets = torch.arange(block_tokens, device=scores.device)
    tokens = (blocks.values[..., None] * block_tokens + offsets).flatten(1)
    valid = chosen.repeat_interleave(block_tokens, dim=1) & (tokens < n_tokens)
    tokens = tokens.clamp(max=n_tokens - 1)
    valid &= ~torch.gather(held, 1, tokens)
    return tokens, valid


# Stage one keeps this many times the blocks that fit the recall budget (at least MIN_CANDIDATES)
# for exact scoring: Quest's bounds over 32 tokens in 64 channels are loose, and on the embedded
# model choosing by bounds alone missed needles that exact scores of the same queries find.
CANDIDATE_FACTOR = 4
MIN_CANDIDATES = 64


class RecallHook:
    """What the decoder calls while a question (and its answer) is fed: `recall(layer, held_index,
    query, start, dtype, compact)` returns the tokens `layer` attends beside its cache (or None);
    `absorb` keeps the attention a replaced selection received. `reselects`: whether calling
    `recall` again with the answer's own queries may change the selection (the session then
    refreshes it every few answer tokens). The attention recalled tokens receive, summed over
    layers and heads, gives the answer's sources (`token_attention`)."""

    reselects = True

    def __init__(self, n_tokens: int) -> None:
        self.stats = RecallStats()
        # Attention each document token received while recalled, summed over layers and heads,
        # from selections that a refresh has replaced (`absorb`).
        self.attention_mass = torch.zeros(n_tokens, dtype=torch.float32)

    def recall(self, layer: int, held_index: torch.Tensor, query: torch.Tensor, start: int, dtype: torch.dtype,
               compact: bool = False) -> RecalledTokens | None:
        raise NotImplementedError

    def absorb(self, recalled: RecalledTokens | None) -> None:
        """Keep the attention that `recalled` (being replaced) received, if this recaller chose it."""
        if recalled is not None and recalled.owner is self:
            weights = torch.where(recalled.valid, recalled.mass, torch.zeros_like(recalled.mass))
            self.attention_mass.index_add_(0, recalled.index.flatten().long().cpu(), weights.flatten().cpu())

    def token_attention(self, current: list[RecalledTokens | None]) -> torch.Tensor:
        """`[n_tokens]` attention received by recalled tokens so far: replaced selections plus the
        `current` ones (one per layer)."""
        total = self.attention_mass.clone()
        saved, self.attention_mass = self.attention_mass, total
        try:
            for recalled in current:
                self.absorb(recalled)
        finally:
            self.attention_mass = saved
        return total


class Recaller(RecallHook):
    """Recall for one question (and its answer) over one document's `archive`.

    recall_tokens: tokens per layer and KV head that may be recalled (whole blocks; the budget).
    Call `recall(layer, held_index, query, start, dtype)` once per layer while the question is
    prefilled, and again every few answer tokens (`DocumentSession` refreshes it). Per layer and KV
    head: Quest bounds rank every block; the best `CANDIDATE_FACTOR`× the budget are scored
    exactly with their dequantized keys; each block keeps the best exact score any call gave it, and
    the blocks with the best scores so far are read whole. Refreshing with the answer's own queries
    matters: on the embedded model the query of "is" in "... the archive room is" found the code's
    block in layers where the question's queries had not.
    """

    def __init__(self, archive: Archive, recall_tokens: int, rope: RotaryTable, scaling: float) -> None:
        super().__init__(archive.layout.n_tokens)
        self.archive = archive
        self.recall_tokens = recall_tokens
        self.rope = rope
        self.scaling = scaling
        self._best: dict[int, torch.Tensor] = {}    # layer -> [kv_heads, n_blocks] best exact score so far
        self._chosen: dict[int, tuple[int, int]] = {}  # layer -> (blocks, tokens) recalled now
        self._current: dict[int, RecalledTokens] = {}  # layer -> the selection last returned

    def recall(self, layer: int, held_index: torch.Tensor, query: torch.Tensor, start: int, dtype: torch.dtype,
               compact: bool = False) -> RecalledTokens | None:
        """Recalled tokens of `layer` for `query` `[query_heads, m, head_dim]` (before RoPE; its
        first token is stream position `start`) given the layer's held positions `held_index`
        `[kv_heads, n]`. None when nothing fits the budget. When the selection equals the one this
        recaller last returned for `layer`, that same object is returned (callers keep it as is).

        compact: the cache uses compact positions; exact scores then rotate each candidate key at
        about the position it would get (the number of held tokens before it) and the queries after
        the held tokens, instead of at document distances the model never saw (past 8k)."""
        lay = self.archive.layout
        block = lay.block_tokens
        max_blocks = self.recall_tokens // block
        if max_blocks < 1:
            return None
        began = time.perf_counter()
        device = query.device
        heads, m = lay.kv_heads, query.shape[1]
        cos, sin = self.rope.lookup(torch.arange(start, start + m, device=device))
        rotated = apply_rope(query.float(), cos, sin).reshape(heads, -1, lay.head_dim)
        key_min, key_max = self.archive.bounds(layer)
        held = held_tokens(held_index.to(device), lay.n_tokens)
        bounds = block_scores(rotated, key_min.to(device), key_max.to(device), self.scaling)
        candidates, valid = select_tokens(bounds, held, block, max(CANDIDATE_FACTOR * max_blocks, MIN_CANDIDATES))
        key_fields = self.archive.read(layer, candidates, kinds="k")
        keys = self.archive.decode_one(key_fields, "k", torch.float32).to(device)
        if compact:
            held_sorted = held_index.to(device).long().sort(dim=-1).values
            kcos, ksin = self.rope.lookup(torch.searchsorted(held_sorted, candidates.to(device).contiguous()))
            qpos = held_sorted.shape[1] + torch.arange(m, device=device)
            qcos, qsin = self.rope.lookup(qpos)
            exact_query = apply_rope(query.float(), qcos, qsin).reshape(heads, -1, lay.head_dim)
        else:
            kcos, ksin = self.rope.lookup(candidates.to(device))
            exact_query = rotated
        exact = exact_block_scores(exact_query, apply_rope(keys, kcos, ksin), valid.to(device), block, self.scaling)
        best = self._best.get(layer)
        if best is None:
            best = torch.full((heads, lay.n_blocks), float("-inf"), device=device)
        best.scatter_reduce_(1, candidates[:, ::block].to(device) // block, exact, reduce="amax")
        self._best[layer] = best
        tokens, valid = select_tokens(best, held, block, max_blocks)
        scored = time.perf_counter()
        self.stats.blocks_scored += heads * lay.n_blocks
        self.stats.bytes_read += sum(t.nbytes for t in key_fields.values())
        self.stats.score_s += scored - began
        previous = self._current.get(layer)
        if previous is not None and torch.equal(previous.index, tokens) and torch.equal(previous.valid, valid.to(device)):
            # An answer token often picks what the last selection picked: return the same object,
            # so the cache keeps its rotated copy (no re-read, no workspace rebuild).
            return previous
        fields = self.archive.read(layer, tokens)
        keys, values = self.archive.decode(fields, dtype)
        recalled = RecalledTokens(
            index=tokens, valid=valid.to(device), keys=keys.to(device), values=values.to(device),
            fields={name: t.to(device) for name, t in fields.items()}, owner=self,
        )
        self._chosen[layer] = (int(valid.view(heads, -1, block).any(dim=-1).sum()), int(valid.sum()))
        self._current[layer] = recalled
        self.stats.blocks_recalled = sum(b for b, _ in self._chosen.values())
        self.stats.tokens_recalled = sum(t for _, t in self._chosen.values())
        self.stats.bytes_read += sum(t.nbytes for t in fields.values())
        self.stats.read_s += time.perf_counter() - scored
        return recalled


def compact_order_positions(held_index: torch.Tensor, recalled: RecalledTokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compact-mode positions when held and recalled tokens are renumbered in document order.

    held_index: `[kv_heads, n]` stream positions of the held tokens before the tail (ascending).
    Returns (held positions `[kv_heads, n]`, recalled positions `[kv_heads, R]` (invalid slots 0),
    offset `[kv_heads]`: the position of the first tail token, n + valid recalled tokens).
    Exact because keys are cached before RoPE: a key is rotated with whatever position it gets.
    """
    big = torch.iinfo(torch.long).max
    rec = torch.where(recalled.valid, recalled.index.long(), torch.full_like(recalled.index.long(), big))
    rec_sorted = rec.sort(dim=-1).values
    held = held_index.long().contiguous()
    held_pos = torch.arange(held.shape[1], device=held.device) + torch.searchsorted(rec_sorted, held)
    rec_pos = torch.searchsorted(held, rec.clamp(max=big - 1).contiguous()) + torch.searchsorted(rec_sorted, rec.contiguous())
    rec_pos = torch.where(recalled.valid, rec_pos, torch.zeros_like(rec_pos))
    offset = held.shape[1] + recalled.valid.sum(dim=1)
    return held_pos, rec_pos, offset
