"""How a model's weights are held once loaded: 4-bit (bitsandbytes NF4) or full precision. Torch-free,
so that `halaman models` and Settings › Model say what the loader will really do."""

from __future__ import annotations

FULL_WEIGHTS_RAM_SHARE = 0.25
"""On a CPU, "auto" keeps full-precision weights when they take at most this share of RAM."""


def choose_weights(weights: str, device_type: str, full_bytes: int, ram_bytes: int) -> bool:
    """Whether to load 4-bit (NF4) weights: `weights` is "4bit", "full" or "auto"; `device_type` is
    "cpu" or "cuda".

    "auto": 4-bit on a GPU (VRAM is the limit there; bitsandbytes' CUDA kernels are fast); on a CPU,
    full precision when the full weights (`full_bytes`, at the compute dtype) take at most
    `FULL_WEIGHTS_RAM_SHARE` of `ram_bytes`. bitsandbytes' CPU path dequantizes each weight matrix
    on every call, so NF4 decoded 1.5x slower than float32 weights for the default 135M model
    (docs/BENCHMARKS.md, speed section); NF4 stays the choice where full weights would crowd RAM.
    Raises ValueError for another value of `weights`.
    """
    if weights == "4bit":
        return True
    if weights == "full":
        return False
    if weights != "auto":
        raise ValueError(f"weights must be auto, 4bit or full, got {weights!r}")
    return device_type != "cpu" or full_bytes > FULL_WEIGHTS_RAM_SHARE * ram_bytes
