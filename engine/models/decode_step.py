"""One decode step of `CompressedDecoder` in few operators: `decode_step`, bit for bit its `forward`.

A decode step of the embedded 135M model ran ~10,500 operators, most of them small: per layer the
conversions between float32 activations and the int4 kernel's bfloat16 (four operators each as
`Tensor.to`), the RoPE rows and positions each layer looked up again, and the general attention
path's reshapes (docs/BENCHMARKS.md §5l, §5m). Here a conversion is one `copy_` into a buffer held
across steps (`StepBuffers`) or the last operator writing into it (`out=`), the projections'
bfloat16 outputs are widened by the residual adds themselves, q, k and v are views of one buffer,
and each layer's attention takes `engine.kvcache.step.attend_step`.
"""

from __future__ import annotations

import threading

import torch

from engine.errors import Cancelled
from engine.kvcache.cache import CompressedCache, StepOptions
from engine.kvcache.step import DecodeStep, attend_step
from engine.models.norm import rms_norm


class StepBuffers:
    """The activations of one layer of a decode step, reused by every layer and step (each is read
    before the next layer writes it, and nothing keeps a reference: the cache copies what it holds;
    like the decoder's `Scratch`, one forward at a time).

    normed `[1, hidden]` bfloat16: a norm's output as the kernel takes it; qkv `[heads + 2 · kv_heads,
    1, head_dim]` float32 and `stored` (k, v in the cache's store dtype); attended `[1, heads ·
    head_dim]` bfloat16: the attention output as o_proj takes it; scaling: the attention's, float32
    (0-dimensional: a Python number costs a conversion per use); gate_up `[1, 2 · inner]` float32; inner `[1, inner]` bfloat16."""

    def __init__(self, shape, hidden: int, inner: int, store_dtype: torch.dtype, device: torch.device,
                 scaling: float) -> None:
        heads, kv_heads, d = shape.query_heads, shape.kv_heads, shape.head_dim
        bf16, f32 = torch.bfloat16, torch.float32
        self.normed = torch.empty((1, hidden), dtype=bf16, device=device)
        self.qkv = torch.empty((heads + 2 * kv_heads, 1, d), dtype=f32, device=device)
        self.q, self.k, self.v = self.qkv.split((heads, kv_heads, kv_heads))
        self.kv_stored = torch.empty((2 * kv_heads, 1, d), dtype=store_dtype, device=device)
        self.stored = self.kv_stored.split(kv_heads)
        self.attended = torch.empty((1, heads * d), dtype=bf16, device=device)
        self.attended_heads = self.attended.view(heads, 1, d)
        self.attended_groups = self.attended.view(kv_heads, heads // kv_heads, d)  # attend_step's layout
        self.gate_up = torch.empty((1, 2 * inner), dtype=f32, device=device)
        self.gate, self.up = self.gate_up[:, :inner], self.gate_up[:, inner:]
        self.inner = torch.empty((1, inner), dtype=bf16, device=device)
        self.scaling = torch.tensor(scaling, dtype=f32, device=device)


def decode_step(decoder, ids: torch.Tensor, cache: CompressedCache, slack_tokens: int,
                cancel: threading.Event | None) -> torch.Tensor:
    """`decoder.forward(ids, cache, slack_tokens=…, reuse_workspace=True)` of one token `ids` `[1]`
    (no taps, not pending) for a `CompressedDecoder` whose layers are all int4 and fused
    (`decoder.fast_steps`): the same logits `[1, vocab]` float32, bit for bit. A layer the fast
    attention does not cover (a workspace to rebuild, a recalled set not yet rotated into it:
    `engine.kvcache.step`) runs `LayerKV.attend` with the same inputs. Raises Cancelled between layers when `cancel` is set."""
    start, compact = cache.seen_tokens, cache.position_mode == "compact"
    shape = decoder.shape
    buffers = _buffers(decoder)
    step = DecodeStep.of(decoder.rope, compact=compact, start=start, held=cache.n_tokens, kv_heads=shape.kv_heads,
                         group=shape.group, scaling=buffers.scaling)
    options = StepOptions(compact_positions=compact, reuse_workspace=True, attention_dtype=decoder.attention_dtype,
                          int8_steps=decoder.int8_steps)
    heads = shape.query_heads
    hidden = decoder.embed(ids)  # a fresh tensor (a lookup copies its rows): the layers add into it in place
    for layer, layer_cache, (qkv_proj, gate_up_proj) in zip(decoder.layers, cache.layers, decoder.fused, strict=True):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        rms_norm(layer.input_layernorm, hidden, out=buffers.normed)
        qkv = qkv_proj.step_output(buffers.normed).view(buffers.qkv.shape)
        buffers.qkv.copy_(qkv)
        buffers.kv_stored.copy_(qkv[heads:])
        q, k, v = buffers.q, buffers.k, buffers.v
        out = attend_step(layer_cache, q, k, v, buffers.stored, step)
        if out is not None:
            buffers.attended_groups.copy_(out)
        else:
            buffers.attended_heads.copy_(layer_cache.attend(q, k, v, start=start, rope=decoder.rope, scaling=decoder.scaling,
                                                            options=options, scratch=decoder.scratch))
        layer_cache.compress(start + 1, slack_tokens)
        hidden.add_(layer.self_attn.o_proj.step_output(buffers.attended))  # widened exactly by the sum
        rms_norm(layer.post_attention_layernorm, hidden, out=buffers.normed)
        buffers.gate_up.copy_(gate_up_proj.step_output(buffers.normed))
        torch.mul(layer.mlp.act_fn(buffers.gate), buffers.up, out=buffers.inner)
        hidden.add_(layer.mlp.down_proj.step_output(buffers.inner))
    cache.seen_tokens = start + 1
    return decoder.lm_head(rms_norm(decoder.norm, hidden)).float()


def _buffers(decoder) -> StepBuffers:
    """The decoder's `StepBuffers`, made on its first decode step."""
    buffers = getattr(decoder, "_step_buffers", None)
    if buffers is None:
        hidden, inner = decoder.embed.weight.shape[1], decoder.fused[0][1].out_features // 2
        buffers = decoder._step_buffers = StepBuffers(decoder.shape, hidden, inner, decoder.store_dtype, decoder.device,
                                                      decoder.scaling)
    return buffers
