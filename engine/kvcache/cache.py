"""The compressed KV cache: per layer, sinks + quantized blocks + a 16-bit residual, under a budget.

Per layer and KV head the cache holds, in arrival order:

    [ sinks (16-bit) | quantized tokens in pool blocks (INT4/INT8/16) | residual (16-bit, newest) ]

with one accumulated attention score and one stream position per slot. A chunk of new tokens goes
through `LayerKV.attend`: its queries attend to everything held plus the chunk (causally), the
probabilities are summed into the scores (H2O), and the chunk is appended. Then `compress` moves
the residual's overflow into the quantized pool and, when more than `budget + slack` tokens are
held, keeps sinks ∪ window ∪ top-scored tokens (`policy.select_kept`) and frees the rest.

Keys are stored before RoPE; `attend` rotates them at the positions `engine.kvcache.positions`
gives (stream positions, slot order or focus). While decoding on the CPU the dequantized, rotated
sinks + quantized tokens are kept as a decode workspace (`engine.kvcache.layer_workspace`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from engine.kvcache.attention import RotaryTable, Scratch, apply_rope, chunk_attention, fused_prefill, rotate
from engine.kvcache.blocks import PagedTokens
from engine.kvcache.breakdown import MemoryBreakdown  # torch-free: engine.answer carries one
from engine.kvcache.decode_workspace import Bf16Int8Workspace, DenseWorkspace, Int8Workspace
from engine.kvcache.layer_workspace import DecodeWorkspace, RotatedRecall, RotatedTail
from engine.kvcache.policy import AttentionSinks, HeavyHitters, RecentWindow, select_kept
from engine.kvcache.positions import AttentionPositions, PositionKind, attention_positions
from engine.kvcache.quant import KVFormat
from engine.kvcache.recall import RecalledTokens
from engine.settings import CachePolicy


def packed_workspace(attention_dtype: torch.dtype | None, device: torch.device,
                     int8_steps: bool) -> type[Bf16Int8Workspace] | None:
    """The workspace class decoding reads the held tokens from, None for a `DenseWorkspace`:
    `Int8Workspace` where `int8_steps` (int4 weights on a CPU without AVX-512 BF16); a
    `Bf16Int8Workspace` where prefill attention runs in bfloat16 on a CPU (int4 weights on AVX-512
    BF16), whose int8 and bfloat16 kernels it uses."""
    if int8_steps and device.type == "cpu":
        return Int8Workspace
    return Bf16Int8Workspace if fused_prefill(attention_dtype, device) else None


# The residual is flushed into the quantized pool in batches of at least this many tokens, so
# that decoding does not quantize and write one token per layer per step.
FLUSH_BATCH_TOKENS = 32
DECODE_EVICTION_BATCH_SHARE = 32
"""While decoding, the cache may exceed its budget by 1/32 of it (`decode_eviction_slack`) before it
evicts back down to the budget, in one batch."""


def decode_eviction_slack(budget_tokens: int) -> int:
    """Tokens a decoding cache of `budget_tokens` may hold past its budget before it evicts: 1/32 of
    the budget (128 at the default 4,096), at least `FLUSH_BATCH_TOKENS`. An eviction costs about
    the same at any batch size (it selects among and compacts the whole budget, re-rotating compact
    positions: ~0.3 s over the default model's 30 layers at 4k on 2 cores), so a batch in proportion
    to the budget keeps its cost per token the same at any budget and the cache within ~3 % of it.
    At 8k context the default model's mean decode step was 5 % shorter at 128 than at 64 (256: 8 %;
    docs/BENCHMARKS.md §5v). The extra tokens are the newest, inside the recent window (at
    defaults), never candidates for eviction themselves."""
    return max(FLUSH_BATCH_TOKENS, budget_tokens // DECODE_EVICTION_BATCH_SHARE)


@dataclass(frozen=True)
class StepOptions:
    """How one chunk attends (`LayerKV.attend`); the same in every layer of a forward pass.

    compact_positions: held tokens are rotated at their rank among the held ones, not at their
        stream positions (`engine.kvcache.positions`; the cache's position mode "compact").
    reuse_workspace: keep the held tokens dequantized and rotated between calls
        (`engine.kvcache.layer_workspace`; for token-by-token decoding on a CPU).
    pending: append nothing until `LayerKV.commit_pending` (speculative decoding).
    attention_dtype: the dtype the chunk's attention output is computed in (None: the query's;
        `chunk_attention`).
    int8_steps: the decode workspace holds int8 keys and values (`packed_workspace`).
    """

    compact_positions: bool = False
    reuse_workspace: bool = False
    pending: bool = False
    attention_dtype: torch.dtype | None = None
    int8_steps: bool = False


@dataclass(frozen=True)
class CacheShape:
    """Model dimensions the cache needs: layers, KV heads (GQA/MQA), head dim, query heads."""

    num_layers: int
    kv_heads: int
    head_dim: int
    query_heads: int

    @property
    def group(self) -> int:
        return self.query_heads // self.kv_heads


class LayerKV:
    """One layer's compressed K/V. Tensor shapes are `[kv_heads, tokens, head_dim]`.

    `sink_k` / `sink_v`, `resid_k` / `resid_v`, `score` and `index` are only ever replaced by new
    tensors, never written in place: a `fork` shares them with its original.
    """

    def __init__(self, shape: CacheShape, policy: CachePolicy, *, store_dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        self.policy = policy
        self.store_dtype = store_dtype
        self.fmt = KVFormat(bits=policy.kv_bits, group_size=policy.group_size)
        self.fmt.validate(shape.head_dim)
        h, d = shape.kv_heads, shape.head_dim
        empty = torch.empty((h, 0, d), dtype=store_dtype, device=device)
        self.sink_k, self.sink_v = empty, empty.clone()
        self.resid_k, self.resid_v = empty.clone(), empty.clone()
        self.score = torch.empty((h, 0), dtype=torch.float32, device=device)
        self.index = torch.empty((h, 0), dtype=torch.int32, device=device)
        specs = {f"{kv}.{name}": spec for kv in "kv" for name, spec in self.fmt.field_specs(d).items()}
        # Peak: budget + one chunk or a decode eviction batch (+ a residual batch in flight), never the model's max context.
        max_tokens = (policy.budget_tokens + max(policy.chunk_tokens, decode_eviction_slack(policy.budget_tokens))
                      + FLUSH_BATCH_TOKENS)
        self.paged = PagedTokens(specs, kv_heads=h, block_tokens=policy.block_tokens, max_tokens=max_tokens, device=device)
        # Kept between decode steps when `attend` is asked to reuse it (engine.kvcache.layer_workspace).
        self._workspace: DecodeWorkspace | None = None
        # A chunk attended with pending=True, waiting for commit_pending (speculative decoding).
        self._pending: tuple | None = None
        # Tokens recalled from the archive for the current question (engine.kvcache.recall):
        # attended with the held ones, never evicted, never part of a snapshot.
        self.recalled: RecalledTokens | None = None

    def set_recalled(self, recalled: RecalledTokens | None, *, compact_positions: bool) -> None:
        """Attend `recalled` (or nothing) from the next `attend` on; replaces an earlier recall."""
        focused = recalled is not None and recalled.focus_from is not None
        if compact_positions or focused or self._focus_from() is not None:
            self._workspace = None  # the held tokens' positions change with the recalled set
        self.recalled = recalled

    def _focus_from(self) -> int | None:
        return self.recalled.focus_from if self.recalled is not None else None

    @property
    def n_tokens(self) -> int:
        """Tokens held per KV head."""
        return self.index.shape[1]

    def _dequantized_stable(self, dtype: torch.dtype, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Sinks + quantized tokens (everything but the residual) from slot `start` on, dequantized,
        keys before RoPE: keys and values `[kv_heads, stable_tokens - start, head_dim]`."""
        n_sink = self.sink_k.shape[1]
        first = max(0, start - n_sink)
        out = []
        for kv in "kv":
            sink = self.sink_k if kv == "k" else self.sink_v
            parts = [sink[:, start:].to(dtype)]
            if self.paged.n_tokens > first:
                fields = {name: self.paged.gather(f"{kv}.{name}", first) for name in self.fmt.field_specs(self.shape.head_dim)}
                parts.append(self.fmt.decode(fields, dtype))
            out.append(torch.cat(parts, dim=1))
        return tuple(out)

    def keys_values_at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (before RoPE) and values `[kv_heads, P, head_dim]` in `dtype` of the stream
        `positions` `[P]`, read from the held tokens (quantized ones dequantized): a document the
        cache keeps whole answers a library question from its snapshot. Raises ValueError when a
        position is not held in every KV head."""
        keys, values = self._dequantized_stable(dtype)
        keys = torch.cat((keys, self.resid_k.to(dtype)), dim=1)
        values = torch.cat((values, self.resid_v.to(dtype)), dim=1)
        index = self.index.long()
        wanted = positions.to(index.device).long().expand(index.shape[0], -1).contiguous()
        order = index.argsort(dim=1)
        found = torch.searchsorted(index.gather(1, order), wanted).clamp(max=max(0, index.shape[1] - 1))
        slots = order.gather(1, found) if index.shape[1] else found
        if not index.shape[1] or not torch.equal(index.gather(1, slots), wanted):
            raise ValueError("a position is not held in every KV head")
        at = slots[..., None].expand(-1, -1, keys.shape[-1])
        return keys.gather(1, at), values.gather(1, at)

    @staticmethod
    def _rotate(keys: torch.Tensor, rope: RotaryTable, kind: PositionKind | None, positions: torch.Tensor | None,
                first_slot: int) -> torch.Tensor:
        """RoPE of stable keys `[kv_heads, m, head_dim]` at slots `first_slot..`: compact slot order
        (`PositionKind.SLOTS`) reads the table's rows directly; otherwise `positions` `[kv_heads, m]`."""
        if kind is PositionKind.SLOTS:
            return rotate(keys, rope.joint(rows=slice(first_slot, first_slot + keys.shape[1])))
        return rotate(keys, rope.joint(positions))

    def _workspace_append(self, fields: dict[str, torch.Tensor], first_slot: int) -> None:
        """A flush moved `m` residual tokens (their encoded `fields` `[kv_heads, m, ...]`) into stable
        slots `first_slot..`: append them, dequantized and rotated as a rebuild would, to the workspace,
        and drop them from the front of its rotated residual."""
        ws = self._workspace
        if ws is None or not ws.follows_slots or ws.held.n != first_slot:
            self._workspace = None
            return
        specs = self.fmt.field_specs(self.shape.head_dim)
        # Decode what the pool holds (its dtypes), exactly as `_dequantized_stable` reads it back.
        keys, values = (self.fmt.decode({name: fields[f"{kv}.{name}"].to(spec[1]) for name, spec in specs.items()},
                                        ws.compute) for kv in "kv")
        m = keys.shape[1]
        positions = self.index[:, first_slot : first_slot + m]
        ws.held.append(self._rotate(keys, ws.rope, ws.kind, positions, first_slot), values)
        ws.residual_flushed(m)

    def _workspace_keep(self, stable_kept: torch.Tensor, old_stable: int, kept_fields: dict[str, torch.Tensor]) -> None:
        """An eviction kept stable slots `stable_kept` `[kv_heads, k]` (ascending) of `old_stable`:
        compact the workspace. Values and stream-position keys (`PositionKind.INDEX`) move with their
        token; slot-order keys (`SLOTS`) get new positions, so they are rotated again from the pool's
        codes (`kept_fields`: the kept quantized tokens' fields, as `PagedTokens.keep` returns them)."""
        ws = self._workspace
        if ws is None or not ws.follows_slots or ws.held.n != old_stable:
            self._workspace = None
            return
        keys = None
        if ws.kind is PositionKind.SLOTS:
            pooled = self.fmt.decode({name: kept_fields[f"k.{name}"] for name in self.fmt.field_specs(self.shape.head_dim)},
                                     ws.compute)
            keys = self._rotate(torch.cat((self.sink_k.to(ws.compute), pooled), dim=1), ws.rope, PositionKind.SLOTS, None, 0)
            ws.tail = None  # the residual's slot positions moved down with the stable part
        ws.held.keep(stable_kept, keys)

    def _valid_workspace(self, dtype: torch.dtype, reuse: bool) -> DecodeWorkspace | None:
        ws = self._workspace
        return ws if reuse and ws is not None and ws.compute == dtype else None

    def _stable_kv(self, compute: torch.dtype, rope: RotaryTable, pos: AttentionPositions, reuse: bool,
                   packed: type[Bf16Int8Workspace] | None) -> tuple:
        """Rotated keys and values of sinks + quantized tokens from slot `pos.hidden` on, each
        `[kv_heads, stable_tokens - hidden, head_dim]` in `compute`, or the workspace's parts
        (`attention_parts`). With `reuse` they are read from, or kept as, the decode workspace (a
        `packed` workspace (`packed_workspace`) if given, else a `DenseWorkspace` with room for the flushes until the
        next eviction)."""
        ws = self._valid_workspace(compute, reuse)
        if ws is not None and ws.start == pos.hidden:
            return ws.held.attention_parts()
        keys, values = self._dequantized_stable(compute, pos.hidden)
        keys = self._rotate(keys, rope, pos.kind, pos.stable, pos.hidden)
        self._workspace = None
        if not reuse:
            return keys, values
        if packed is not None:
            held = packed(keys, values, self.shape.group)
        else:
            held = DenseWorkspace(keys, values, room=decode_eviction_slack(self.policy.budget_tokens) + FLUSH_BATCH_TOKENS
                                  + max(0, self.policy.budget_tokens - keys.shape[1]))
        self._workspace = DecodeWorkspace(held, pos.hidden, rope, pos.kind, compute)
        return held.attention_parts()

    def _recalled_kv(self, recalled: RecalledTokens, pos: AttentionPositions, compute: torch.dtype,
                     rope: RotaryTable, reuse: bool, packed: type[Bf16Int8Workspace] | None) -> tuple:
        """Rotated keys and values of the recalled tokens `[kv_heads, R, head_dim]` at `pos.recalled`,
        kept in the workspace (`RotatedRecall`) until the set changes."""
        ws = self._valid_workspace(compute, reuse)
        if ws is not None and ws.recall is not None and ws.recall.recalled is recalled:
            return ws.recall.keys, ws.recall.values
        cos, sin = rope.lookup(pos.recalled.long())
        keys, values = apply_rope(recalled.keys.to(compute), cos, sin), recalled.values.to(compute)
        if ws is not None:
            if packed is not None:
                keys = values = packed(keys, values, self.shape.group)
            ws.recall = RotatedRecall(recalled, keys, values, pos.order)
        return keys, values

    @property
    def tail_capacity(self) -> int:
        """Tokens a `RotatedTail` holds before it must move its residual to the front: twice the most
        the residual, two flush batches and a chunk can hold at once."""
        return 2 * (self.policy.residual_tokens + 2 * FLUSH_BATCH_TOKENS + self.policy.chunk_tokens)

    def _tail_kv(self, key: torch.Tensor, value: torch.Tensor, pos: AttentionPositions, rope: RotaryTable,
                 compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values of the residual followed by the chunk (`key` / `value`
        `[kv_heads, chunk, head_dim]`) at `pos.tail`, each `[kv_heads, resid + chunk, head_dim]` in
        `compute`; where the workspace's positions follow the slots, from its `RotatedTail`."""
        ws = self._workspace
        if ws is not None and ws.follows_slots and ws.compute == compute:
            if ws.tail is None or ws.tail.held > self.resid_k.shape[1]:
                ws.tail = RotatedTail.empty(key, self.tail_capacity, compute)
            rotated = ws.tail.rotated(self.resid_k, self.resid_v, key, value, pos.tail, rope, pos.bound)
            if rotated is not None:
                return rotated
        tail_k = rotate(torch.cat((self.resid_k.to(compute), key.to(compute)), dim=1), rope.joint(pos.tail, bound=pos.bound))
        return tail_k, torch.cat((self.resid_v.to(compute), value.to(compute)), dim=1)

    def _attended_kv(self, key: torch.Tensor, value: torch.Tensor, pos: AttentionPositions, rope: RotaryTable,
                     compute: torch.dtype, reuse: bool,
                     packed: type[Bf16Int8Workspace] | None) -> tuple[tuple, tuple, tuple]:
        """Keys, values and masks of what a chunk attends, as `chunk_attention` takes them, in order:
        the stable tokens from slot `pos.hidden` on, the recalled ones (if any), the residual + chunk."""
        stable_k, stable_v = self._stable_kv(compute, rope, pos, reuse, packed)
        tail_k, tail_v = self._tail_kv(key, value, pos, rope, compute)
        if self.recalled is None:
            return (stable_k, tail_k), (stable_v, tail_v), (pos.stable_mask, pos.tail_mask)
        recalled_k, recalled_v = self._recalled_kv(self.recalled, pos, compute, rope, reuse, packed)
        return ((stable_k, recalled_k, tail_k), (stable_v, recalled_v, tail_v),
                (pos.stable_mask, self.recalled.valid, pos.tail_mask))

    def _held_scores(self, scores: torch.Tensor, pos: AttentionPositions) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Split the attention `scores` `[kv_heads, (chunk,) attended]` (`chunk_attention`'s order)
        into what the held tokens and the chunk received, `[kv_heads, (chunk,) held + chunk]` (zero
        for hidden slots), and what the recalled tokens received, `[kv_heads, (chunk,) R]` or None."""
        attended = self.n_tokens - self.resid_k.shape[1] - pos.hidden
        recalled_mass = None
        if self.recalled is not None:
            end = attended + self.recalled.index.shape[1]
            recalled_mass = scores[..., attended:end]
            scores = torch.cat((scores[..., :attended], scores[..., end:]), dim=-1)
        if pos.hidden:
            scores = torch.cat((scores.new_zeros((*scores.shape[:-1], pos.hidden)), scores), dim=-1)
        return scores, recalled_mass

    def workspace_bytes(self) -> int:
        """Bytes of the decode workspace (dequantized, rotated sinks + quantized tokens and recalled
        tokens) plus the recalled tokens themselves, 0 if none."""
        held = self._workspace.nbytes if self._workspace is not None else 0
        recalled = self.recalled.keys.nbytes + self.recalled.values.nbytes if self.recalled is not None else 0
        return held + recalled

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, start: int, rope: RotaryTable,
               scaling: float, options: StepOptions, scratch: Scratch | None = None) -> torch.Tensor:
        """Attend a chunk and append it to the cache.

        query `[query_heads, chunk, head_dim]`, key / value `[kv_heads, chunk, head_dim]`, all before
        RoPE; `start`: the stream position of the chunk's first token. Returns the attention output
        `[query_heads, chunk, head_dim]` in the query's dtype. Held, recalled (`set_recalled`) and new
        tokens sit where `attention_positions` puts them; recalled tokens add what they receive to
        `recalled.mass`. options: how this step attends (`StepOptions`: positions, decode workspace,
        pending, dtypes). scratch: see `chunk_attention`.
        """
        chunk, compute, heads = query.shape[1], query.dtype, self.shape.kv_heads
        recalled, ws = self.recalled, self._valid_workspace(compute, options.reuse_workspace)
        known = ws.recall.order if ws is not None and ws.recall is not None and ws.recall.recalled is recalled else None
        pos = attention_positions(self.index, self.n_tokens - self.resid_k.shape[1], start=start, chunk=chunk,
                                  recalled=recalled, compact=options.compact_positions, order=known)
        keys, values, masks = self._attended_kv(key, value, pos, rope, compute, options.reuse_workspace,
                                                packed_workspace(options.attention_dtype, query.device, options.int8_steps))
        query_rope = rope.joint(pos.query, bound=pos.bound)  # [kv_heads, chunk, 2 · head_dim] or [chunk, …]
        q = rotate(query.view(heads, self.shape.group, chunk, -1), query_rope[:, None] if query_rope.dim() == 3 else query_rope)
        scoring = "per_query" if options.pending else "window" if self.policy.heavy_hitter_score == "window" else "sum"
        out, scores = chunk_attention(q, keys, values, scaling=scaling, masks=masks, scratch=scratch,
                                      scoring=scoring, attention_dtype=options.attention_dtype)
        scores, recalled_mass = self._held_scores(scores, pos)
        new_index = torch.arange(start, start + chunk, device=query.device, dtype=torch.int32)
        if options.pending:
            self._pending = (key, value, new_index, scores, recalled_mass, start)
        else:
            if recalled_mass is not None:
                recalled.mass += recalled_mass
            self._append(key, value, new_index, scores, start)
        return out.reshape(self.shape.query_heads, chunk, -1)

    def commit_pending(self, count: int) -> None:
        """Append the first `count` tokens of the chunk attended `pending` (`StepOptions`); drop the rest.

        Token by token, in feeding order, each with the attention its own query gave (a query
        never sees a later token of its chunk), so scores, positions and storage end exactly as
        if only those tokens had been fed one at a time. Raises RuntimeError without a pending chunk.
        """
        if self._pending is None:
            raise RuntimeError("no pending chunk to commit")
        key, value, new_index, scores, recalled_mass, start = self._pending
        self._pending = None
        for i in range(count):
            n = self.n_tokens
            if recalled_mass is not None:
                self.recalled.mass += recalled_mass[:, i]
            self._append(key[:, i : i + 1], value[:, i : i + 1], new_index[i : i + 1], scores[:, i, : n + 1], start + i)

    def tokens_until_compress(self, slack_tokens: int) -> int:
        """How many more tokens can be appended one at a time before `compress(…, slack_tokens)`
        would change the cache (flush the residual or evict): the last of them triggers it."""
        flush_at = self.policy.residual_tokens + FLUSH_BATCH_TOKENS - self.resid_k.shape[1]
        evict_at = self.policy.budget_tokens + slack_tokens + 1 - self.n_tokens
        return max(1, min(flush_at, evict_at))

    def _append(self, key: torch.Tensor, value: torch.Tensor, new_index: torch.Tensor, scores: torch.Tensor, start: int) -> None:
        """Append the chunk's keys / values `[kv_heads, m, head_dim]` at stream positions `new_index`
        `[m]` (`start..start + m - 1`) with the attention `scores` `[kv_heads, n + m]` this step gave
        the held tokens and the chunk; `scores` is taken over (added to in place, then held)."""
        n = self.n_tokens
        scores[:, :n] += self.score  # in place: the step's scores are a fresh tensor (or a row nobody reads again)
        self.score = scores
        self.index = torch.cat((self.index, new_index.expand(self.shape.kv_heads, -1)), dim=1)
        key, value = key.to(self.store_dtype), value.to(self.store_dtype)
        n_sink = max(0, min(self.policy.sink_tokens - start, key.shape[1]))
        if n_sink:
            self._workspace = None
            self.sink_k = torch.cat((self.sink_k, key[:, :n_sink]), dim=1)
            self.sink_v = torch.cat((self.sink_v, value[:, :n_sink]), dim=1)
        self.resid_k = torch.cat((self.resid_k, key[:, n_sink:]), dim=1)
        self.resid_v = torch.cat((self.resid_v, value[:, n_sink:]), dim=1)

    def compress(self, seen_tokens: int, slack_tokens: int) -> None:
        """Flush the residual's overflow into the pool; evict down to the budget if over budget + slack."""
        over_budget = self.n_tokens > self.policy.budget_tokens + slack_tokens
        overflow = self.resid_k.shape[1] - self.policy.residual_tokens
        # Flush before evicting, so the residual is inside the recent window and never evicted.
        if overflow > 0 and (overflow >= FLUSH_BATCH_TOKENS or slack_tokens == 0 or over_budget):
            fields = {}
            for kv, data in (("k", self.resid_k[:, :overflow]), ("v", self.resid_v[:, :overflow])):
                fields.update({f"{kv}.{name}": t for name, t in self.fmt.encode(data).items()})
            first_slot = self.n_tokens - self.resid_k.shape[1]
            self.paged.append(fields)
            self.resid_k, self.resid_v = self.resid_k[:, overflow:], self.resid_v[:, overflow:]
            self._workspace_append(fields, first_slot)
        if over_budget:
            self._evict(seen_tokens)

    def _evict(self, seen_tokens: int) -> None:
        kept = select_kept(
            self.index,
            self.score,
            seen_tokens=seen_tokens,
            budget_tokens=self.policy.budget_tokens,
            protectors=(AttentionSinks(self.policy.sink_tokens), RecentWindow(self.policy.window_tokens)),
            ranker=HeavyHitters(self.policy.heavy_hitter_score),
        )
        n_sink, n_paged = self.sink_k.shape[1], self.paged.n_tokens
        paged_slots = kept[:, n_sink : kept.shape[1] - self.resid_k.shape[1]] - n_sink
        if paged_slots.numel() and (int(paged_slots.min()) < 0 or int(paged_slots.max()) >= n_paged):
            raise RuntimeError("eviction chose a sink or residual slot to drop; the window is smaller than the residual")
        kept_fields = self.paged.keep(paged_slots)
        self._workspace_keep(kept[:, : kept.shape[1] - self.resid_k.shape[1]], self.n_tokens - self.resid_k.shape[1], kept_fields)
        self.score = torch.gather(self.score, 1, kept)
        self.index = torch.gather(self.index, 1, kept)

    def memory(self) -> MemoryBreakdown:
        """Bytes held, computed from the token counts and formats (checked against tensor nbytes in tests)."""
        h, d = self.shape.kv_heads, self.shape.head_dim
        store_elem = torch.empty((), dtype=self.store_dtype).element_size()
        used_slots = self.paged.used_blocks() * self.paged.block_tokens
        codes_per_slot = meta_per_slot = 0
        for name, (shape, dtype) in self.fmt.field_specs(d).items():
            size = shape[0] * torch.empty((), dtype=dtype).element_size()
            if name == "codes":
                codes_per_slot += 2 * size
            else:
                meta_per_slot += 2 * size
        free_blocks = self.paged.pool.capacity_blocks - self.paged.used_blocks()
        return MemoryBreakdown(
            codes_bytes=used_slots * codes_per_slot,
            quant_meta_bytes=used_slots * meta_per_slot,
            residual_bytes=2 * h * d * store_elem * (self.sink_k.shape[1] + self.resid_k.shape[1]),
            score_bytes=4 * h * self.n_tokens,
            position_bytes=4 * h * self.n_tokens,
            block_table_bytes=self.paged.table.nbytes,
            pool_free_bytes=free_blocks * self.paged.pool.bytes_per_block(),
            recalled_bytes=self.recalled.nbytes() if self.recalled is not None else 0,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor this layer holds, by name (pool storage included)."""
        held = {
            "sink_k": self.sink_k, "sink_v": self.sink_v, "resid_k": self.resid_k, "resid_v": self.resid_v,
            "score": self.score, "index": self.index, "block_table": self.paged.table,
        }
        held.update({f"pool.{name}": t for name, t in self.paged.pool.storage.items()})
        return held

    def export(self) -> dict[str, torch.Tensor]:
        """Tensors to persist: like `tensors()` but with only the used blocks of the pool."""
        storage, table = self.paged.export()
        out = {name: t.contiguous() for name, t in self.tensors().items() if not name.startswith("pool.")}
        out["block_table"] = table
        out.update({f"pool.{name}": t for name, t in storage.items()})
        return out

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore from `export()` output; raises ValueError on a shape or dtype mismatch."""
        h, d = self.shape.kv_heads, self.shape.head_dim
        for name in ("sink_k", "sink_v", "resid_k", "resid_v"):
            t = tensors[name]
            if t.dim() != 3 or t.shape[0] != h or t.shape[2] != d or t.dtype != self.store_dtype:
                raise ValueError(f"{name}: unexpected shape {tuple(t.shape)} / dtype {t.dtype}")
        device = self.index.device
        self.sink_k, self.sink_v = tensors["sink_k"].to(device), tensors["sink_v"].to(device)
        self.resid_k, self.resid_v = tensors["resid_k"].to(device), tensors["resid_v"].to(device)
        self.score, self.index = tensors["score"].to(device), tensors["index"].to(device)
        n_paged = self.index.shape[1] - self.sink_k.shape[1] - self.resid_k.shape[1]
        storage = {name[len("pool."):]: t for name, t in tensors.items() if name.startswith("pool.")}
        if set(storage) != set(self.paged.pool.specs) or self.score.shape != self.index.shape or n_paged < 0:
            raise ValueError("persisted layer does not match this cache's format")
        self.paged.load(storage, tensors["block_table"], n_paged)
        self._workspace = None

    def fork(self) -> LayerKV:
        """A copy for one question that shares this layer's tensors (see `CompressedCache.fork`)."""
        twin = object.__new__(LayerKV)
        twin.__dict__.update(self.__dict__)
        twin._workspace = twin._pending = None
        twin.recalled = None  # recalled tokens belong to one question, never to a copy
        twin.paged = self.paged.fork()
        return twin


class CompressedCache:
    """All layers of the compressed cache plus the stream position.

    `seen_tokens`: tokens that have passed through the cache (the next token's stream position).
    `position_mode`: "original" or "compact" (resolved; "auto" is decided by the session).
    """

    def __init__(self, shape: CacheShape, policy: CachePolicy, *, position_mode: str, store_dtype: torch.dtype, device: torch.device) -> None:
        if position_mode not in ("original", "compact"):
            raise ValueError(f"position mode must be resolved to original or compact, got {position_mode!r}")
        policy.validate()
        self.shape = shape
        self.policy = policy
        self.position_mode = position_mode
        self.store_dtype = store_dtype
        self.device = device
        self.layers = [LayerKV(shape, policy, store_dtype=store_dtype, device=device) for _ in range(shape.num_layers)]
        self.seen_tokens = 0

    @property
    def n_tokens(self) -> int:
        """Tokens held per layer and KV head."""
        return self.layers[0].n_tokens

    @property
    def decode_slack(self) -> int:
        """Tokens this cache may hold past its budget while decoding (`decode_eviction_slack`)."""
        return decode_eviction_slack(self.policy.budget_tokens)

    def memory(self) -> MemoryBreakdown:
        """Bytes held by all layers, by kind."""
        total = MemoryBreakdown()
        for layer in self.layers:
            total = total + layer.memory()
        return total

    def workspace_bytes(self) -> int:
        """Bytes of the layers' decode workspaces (not part of the KV cache's own accounting)."""
        return sum(layer.workspace_bytes() for layer in self.layers)

    @torch.inference_mode()  # the cache's tensors were made in inference mode by the decoder
    def commit(self, count: int, slack_tokens: int) -> None:
        """Keep the first `count` tokens of the chunk `CompressedDecoder.forward(pending=True)` fed,
        drop the rest, then compress as a token-by-token decode would have after the last of them.
        Exact only if the chunk was no longer than `tokens_until_compress(slack_tokens)`."""
        for layer in self.layers:
            layer.commit_pending(count)
            layer.compress(self.seen_tokens + count, slack_tokens)
        self.seen_tokens += count

    def tokens_until_compress(self, slack_tokens: int) -> int:
        """See `LayerKV.tokens_until_compress` (every layer holds the same counts)."""
        return min(layer.tokens_until_compress(slack_tokens) for layer in self.layers)

    def release_workspace(self) -> None:
        """Drop the decode workspaces (after an answer; they are rebuilt on demand)."""
        for layer in self.layers:
            layer._workspace = None

    def shrink(self) -> None:
        """Return the pools' free blocks to the allocator (after a prefill, before a snapshot)."""
        for layer in self.layers:
            layer.paged.shrink()

    def fork(self) -> CompressedCache:
        """A cache that continues from this one (every question forks the document snapshot) without
        copying it: the fork shares every tensor. Sinks, residual, scores and positions are never
        written in place (each change makes a new tensor), and a pool's storage is copied the first
        time either cache writes into it (`BlockPool.fork`), so neither sees what the other does."""
        twin = object.__new__(CompressedCache)
        twin.__dict__.update(self.__dict__)
        twin.layers = [layer.fork() for layer in self.layers]
        return twin

    def score_snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's stream positions and accumulated scores now (`index`, `score`, both
        `[kv_heads, n_tokens]`), for `attention_since`."""
        return [(layer.index.clone(), layer.score.clone()) for layer in self.layers]

    def attention_since(self, before: list[tuple[torch.Tensor, torch.Tensor]], n_positions: int) -> torch.Tensor:
        """`[n_positions]` float64: the attention each stream position below `n_positions` received
        since `before` (`score_snapshot`), summed over layers and KV heads. The scores are the H2O
        sums the attention adds to at every step, so what a question and its answer gave a token is
        its score now less its score then; a token evicted since gives nothing."""
        mass = torch.zeros(n_positions, dtype=torch.float64)
        for layer, (index0, score0) in zip(self.layers, before, strict=True):
            index = layer.index.long()
            if index.numel() == 0:
                continue
            width = int(max(int(index.max()), int(index0.max()) if index0.numel() else 0)) + 1
            then = torch.zeros((index.shape[0], width), dtype=torch.float32, device=index.device)
            then.scatter_(1, index0.long(), score0)
            gained = (layer.score - then.gather(1, index)).clamp(min=0).double().cpu()
            inside = index.cpu() < n_positions
            mass.index_add_(0, index.cpu()[inside], gained[inside])
        return mass

    def export(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """(tensors, metadata) for the prefix store; tensors are on the CPU."""
        tensors = {}
        for i, layer in enumerate(self.layers):
            tensors.update({f"layer{i}.{name}": t.cpu() for name, t in layer.export().items()})
        meta = {
            "seen_tokens": str(self.seen_tokens),
            "position_mode": self.position_mode,
            "policy": json.dumps(asdict(self.policy), sort_keys=True),
            "shape": json.dumps(asdict(self.shape), sort_keys=True),
            "store_dtype": str(self.store_dtype),
        }
        return tensors, meta

    @classmethod
    def restore(
        cls, tensors: dict[str, torch.Tensor], meta: dict[str, str], *, shape: CacheShape, policy: CachePolicy, device: torch.device, store_dtype: torch.dtype
    ) -> CompressedCache:
        """Rebuild from `export()` output; raises ValueError if it was made for another shape or policy."""
        if json.loads(meta["shape"]) != asdict(shape) or json.loads(meta["policy"]) != asdict(policy):
            raise ValueError("prefix cache was made for another model shape or cache policy")
        if meta["store_dtype"] != str(store_dtype):
            raise ValueError("prefix cache was made with another dtype")
        cache = cls(shape, policy, position_mode=meta["position_mode"], store_dtype=store_dtype, device=device)
        cache.seen_tokens = int(meta["seen_tokens"])
        for i, layer in enumerate(cache.layers):
            prefix = f"layer{i}."
            layer.load({name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)})
            if layer.index.numel() and int(layer.index.max()) >= cache.seen_tokens:
                raise ValueError("prefix cache holds positions beyond its token count")
        return cache
