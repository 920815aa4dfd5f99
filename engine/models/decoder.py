"""Run a transformers Llama / Qwen2 / Qwen3 model over the compressed KV cache.

This (with `engine.models.decode_step`, its decode step) is the only place that knows transformers'
module layout. It uses the model's own modules
(embedding, RMSNorms, q/k/v/o projections — 4-bit bitsandbytes layers, `engine.models.int4_cpu` layers or plain Linear — Qwen3's
q/k norms, MLPs, rotary embedding, LM head) but not its forward methods: those apply RoPE before
the cache sees the keys and change signature between releases, while Halaman caches keys before
RoPE and needs the attention probabilities for H2O. The decoder layer of all three families is

    h = h + o_proj(attention(input_layernorm(h)));  h = h + mlp(post_attention_layernorm(h))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.errors import Cancelled, ModelError
from engine.kvcache.archive import ArchiveWriter
from engine.kvcache.attention import RotaryTable, Scratch
from engine.kvcache.cache import CacheShape, CompressedCache, StepOptions
from engine.kvcache.recall import Recaller
from engine.models.decode_step import decode_step
from engine.models.int4_cpu import Int4Linear, can_fuse, fuse
from engine.models.norm import rms_norm
from engine.settings import CachePolicy
from engine.threads import ThreadGovernor

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

# (tokens done, tokens total, seconds elapsed)
ProgressFn = Callable[[int, int, float], None]


@dataclass(frozen=True)
class ChunkTaps:
    """What reads every layer's keys, values and queries of a chunk before the chunk attends
    (`CompressedDecoder.forward`).

    archive: every layer's keys (before RoPE) and values of the chunk are also written there.
    recaller: in every layer, the chunk's queries choose archived blocks to recall, which this
        chunk and every later one attend (`engine.kvcache.recall`; the question of an answer, and
        every few tokens of the answer).
    """

    archive: ArchiveWriter | None = None
    recaller: Recaller | None = None


def _fused_projections(layer: torch.nn.Module) -> tuple[Int4Linear, Int4Linear] | None:
    """(q|k|v, gate|up) of a decoder layer as fused int4 layers (`engine.models.int4_cpu.fuse`), or
    None unless both fuse exactly (`can_fuse`: float, NF4 and GPU weights run the model's own layers)."""
    attn, mlp = layer.self_attn, layer.mlp
    parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
    if not (can_fuse(parts[:3]) and can_fuse(parts[3:]) and hasattr(mlp, "act_fn")):
        return None
    return fuse(parts[:3]), fuse(parts[3:])


class CompressedDecoder:
    """A causal LM whose attention reads and writes a `CompressedCache`.

    `attention_dtype`: the dtype a prefill chunk's attention output is computed in (default: the
    compute dtype); bfloat16 with int4 CPU weights, whose layers already round their inputs to it.
    `int8_steps`: decode steps read the held tokens as int8 keys and values (`Int8Workspace`; int4
    weights on a CPU without AVX-512 BF16, whose layers keep int8 step copies).
    Raises ModelError for a model family other than Llama, Qwen2 or Qwen3.
    """

    def __init__(self, model: torch.nn.Module, *, attention_dtype: torch.dtype | None = None,
                 int8_steps: bool = False) -> None:
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"model family {config.model_type!r} is not supported; use a Llama, Qwen2 or Qwen3 model"
            )
        self.model = model
        self.config = config
        inner = model.model
        self.embed = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.lm_head = model.lm_head
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.shape = CacheShape(
            num_layers=config.num_hidden_layers,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            query_heads=config.num_attention_heads,
        )
        self.device = self.embed.weight.device
        self.compute_dtype = self.embed.weight.dtype
        self.attention_dtype = attention_dtype or self.compute_dtype
        self.int8_steps = int8_steps
        self.rope = RotaryTable(inner.rotary_emb, head_dim, self.device)
        self.scaling = head_dim**-0.5
        self.max_positions = int(config.max_position_embeddings)
        self.scratch = Scratch()  # attention probabilities of a chunk, reused by every layer
        # Per layer: q/k/v and gate/up as one int4 layer each where the weights are int4 (`fuse`), else None.
        self.fused = [_fused_projections(layer) for layer in self.layers]
        # Decode steps take `decode_step` (the same arithmetic in fewer operators) where every layer's
        # projections are int4 and no layer normalises its heads (Qwen3); False: always `forward`'s loop.
        self.fast_steps = self.compute_dtype == torch.float32 and all(
            fused is not None and type(layer.self_attn.o_proj) is Int4Linear
                              and type(layer.mlp.down_proj) is Int4Linear and not hasattr(layer.self_attn, "q_norm")
                              for fused, layer in zip(self.fused, self.layers, strict=True))

    @property
    def store_dtype(self) -> torch.dtype:
        """16-bit dtype of the residual and of 16-bit storage: the compute dtype if it is 16-bit, else float16."""
        return self.compute_dtype if self.compute_dtype in (torch.float16, torch.bfloat16) else torch.float16

    def new_cache(self, policy: CachePolicy, position_mode: str) -> CompressedCache:
        """An empty cache for this model (position_mode already resolved: original / compact)."""
        return CompressedCache(self.shape, policy, position_mode=position_mode, store_dtype=self.store_dtype, device=self.device)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        cache: CompressedCache,
        *,
        all_logits: bool = False,
        slack_tokens: int = 0,
        cancel: threading.Event | None = None,
        reuse_workspace: bool = False,
        pending: bool = False,
        taps: ChunkTaps | None = None,
    ) -> torch.Tensor:
        """Feed `token_ids` `[chunk]` through the model, appending them to `cache`.

        Returns float32 logits `[chunk, vocab]` if `all_logits`, else `[1, vocab]` for the last
        token (the LM head is the costliest matmul of a prefill chunk; it runs once). After each
        layer the cache evicts down to its budget when it holds more than budget + `slack_tokens`.
        Raises Cancelled (between layers) when `cancel` is set; the cache is then inconsistent
        and must be dropped. `reuse_workspace`: see `StepOptions` (for token-by-token decoding); one
        such token without taps, not pending, takes `engine.models.decode_step` where `fast_steps`.
        `taps`: what reads every layer's keys, values and queries of the chunk before it attends
        (`ChunkTaps`: the archive writer, the recaller).
        `pending`: attend the chunk but append nothing yet; `cache.commit(count, slack_tokens)` then
        keeps its first `count` tokens (speculative decoding: draft tokens the model rejects are
        never in the cache). The chunk must not be longer than `cache.tokens_until_compress`.
        """
        ids = token_ids.to(self.device).reshape(-1)
        chunk = ids.shape[0]
        start = cache.seen_tokens
        if (self.fast_steps and chunk == 1 and reuse_workspace and not pending
                and (taps is None or (taps.archive is None and taps.recaller is None))):
            return decode_step(self, ids, cache, slack_tokens, cancel)
        compact = cache.position_mode == "compact"
        hidden = self.embed(ids)  # [chunk, hidden]: the model's modules take 2-D inputs (fewer reshapes per layer)
        heads, kv_heads, head_dim = self.shape.query_heads, self.shape.kv_heads, self.shape.head_dim
        archive, recaller = (taps.archive, taps.recaller) if taps is not None else (None, None)
        options = StepOptions(compact_positions=compact, reuse_workspace=reuse_workspace, pending=pending,
                              attention_dtype=self.attention_dtype, int8_steps=self.int8_steps)
        for i, (layer, layer_cache, fused) in enumerate(zip(self.layers, cache.layers, self.fused, strict=True)):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            attn = layer.self_attn
            x = rms_norm(layer.input_layernorm, hidden)
            if fused is not None:
                q, k, v = fused[0](x).split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q, k, v = q.view(chunk, heads, -1), k.view(chunk, kv_heads, -1), v.view(chunk, kv_heads, -1)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            if archive is not None:
                archive.append(i, start, k.transpose(0, 1), v.transpose(0, 1))
            if recaller is not None:
                recalled = recaller.recall(i, layer_cache.index, q.transpose(0, 1), start, q.dtype, compact=compact)
                if recalled is not layer_cache.recalled:  # unchanged: keep it, its mass and its rotated copy
                    recaller.absorb(layer_cache.recalled)  # keep the attention the replaced set received
                    layer_cache.set_recalled(recalled, compact_positions=compact)
            out = layer_cache.attend(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), start=start,
                                     rope=self.rope, scaling=self.scaling, options=options, scratch=self.scratch)
            if not pending:
                layer_cache.compress(start + chunk, slack_tokens)
            hidden = hidden + attn.o_proj(out.transpose(0, 1).reshape(chunk, -1))
            x = rms_norm(layer.post_attention_layernorm, hidden)
            if fused is not None:
                gate, up = fused[1](x).chunk(2, dim=-1)
                hidden = hidden + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
            else:
                hidden = hidden + layer.mlp(x)
        if not pending:
            cache.seen_tokens = start + chunk
        hidden = rms_norm(self.norm, hidden if all_logits else hidden[-1:])
        return self.lm_head(hidden).float()

    def prefill(
        self,
        token_ids: torch.Tensor,
        cache: CompressedCache,
        *,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        archive: ArchiveWriter | None = None,
        recaller: Recaller | None = None,
        governor: ThreadGovernor | None = None,
        pause: threading.Event | None = None,
    ) -> torch.Tensor | None:
        """Feed `token_ids` `[n]` in chunks of `policy.chunk_tokens`; returns the last logits `[1, vocab]`.

        Memory peaks at budget + one chunk: each chunk attends to the compressed cache plus itself
        and the cache is evicted back to the budget before the next chunk.
        `archive` receives every chunk (see `forward`); `recaller` recalls with the first chunk's
        queries (a question is one chunk); `governor` re-decides the CPU threads after each chunk
        (`engine.threads.ThreadGovernor`). `pause`: checked after each chunk; when set, returns None
        with the cache consistent after the chunks fed (`cache.seen_tokens` says how far: a later
        prefill of the remaining ids goes on from there). Raises ValueError for an empty input,
        Cancelled when `cancel` is set.
        """
        n = int(token_ids.numel())
        if n == 0:
            raise ValueError("nothing to prefill")
        step = cache.policy.chunk_tokens
        began = time.perf_counter()
        logits = None
        for first in range(0, n, step):
            taps = ChunkTaps(archive=archive, recaller=recaller if first == 0 else None)
            logits = self.forward(token_ids[first : first + step], cache, cancel=cancel, taps=taps)
            if governor is not None:
                governor.step()
            if progress is not None:
                progress(min(first + step, n), n, time.perf_counter() - began)
            if pause is not None and pause.is_set() and first + step < n:
                logits = None
                break
        if n > step:  # a document, not a question: give the chunk-sized buffer back
            self.scratch.release()
        return logits
