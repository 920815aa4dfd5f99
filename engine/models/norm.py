"""The RMSNorm of Llama / Qwen layers in few operators (`rms_norm`), for `engine.models.decoder`."""

from __future__ import annotations

import functools

import torch


def rms_norm(module: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`module(x)` for a Llama / Qwen RMSNorm, bit for bit, without its dtype round trips where the
    activations and weight are float32: a decode step runs 61 of them. (`F.rms_norm`, one op, was
    0.5 ms per decode step slower here than these five.) `mean` is `sum` then a division (what torch
    runs inside it), and the constants are float32 tensors: a Python scalar and `mean` each cost
    four more operators (a conversion), 19 per call where these are 8 (tests/test_decode_step.py).
    `out`: a tensor of x's shape to write the result into, in its dtype (a bfloat16 one gets the
    float32 result rounded, as `copy_` would round it, by the last product itself: no copy)."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None or x.dtype != torch.float32 or module.weight.dtype != torch.float32:
        return module(x) if out is None else out.copy_(module(x))
    count, epsilon = _norm_constants(x.shape[-1], eps, x.device)
    return torch.mul(module.weight, x * (x * x).sum(-1, keepdim=True).div_(count).add_(epsilon).rsqrt_(), out=out)


@functools.cache
def _norm_constants(features: int, eps: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm`'s divisor and epsilon as 0-dimensional float32 tensors (the values torch rounds the
    Python numbers to), made outside inference mode so that any caller may use them."""
    with torch.inference_mode(False):
        return (torch.tensor(float(features), dtype=torch.float32, device=device),
                torch.tensor(eps, dtype=torch.float32, device=device))
