"""How a model's weights are held once loaded: 4-bit NF4 (bitsandbytes), 4-bit int4 (torch's CPU
kernel, `engine.models.int4_cpu`) or full precision. Torch-free, so that `halaman models` and
Settings › Model say what the loader will really do."""

from __future__ import annotations

FULL_WEIGHTS_RAM_SHARE = 0.25
"""On a CPU, "auto" converts a model the loader cannot stream (`engine.models.stream_load.plan_stream`)
to int4 only when its full weights take at most this share of RAM: that model is loaded whole at
float32 and then quantized. Above it bitsandbytes loads NF4, as transformers reads it shard by
shard. A model that streams goes straight into int4 (peak about the int4 weights + 0.6-0.75 GiB,
docs/BENCHMARKS.md §5i), whatever its size."""

LABELS = {"nf4": "4-bit NF4", "int4": "4-bit int4"}
"""How each format is named for people; "full" is named by its dtype ("float32", "bfloat16")."""


READING_COPY_MAX_BYTES = 1 << 30
"""int4 keeps a bfloat16 reading copy only for a model whose weights at bfloat16 take at most this
(`keeps_reading_copy`): the embedded 135M model (0.27 GB) and models up to ~0.5B parameters. The copy
is ~3.2x the int4 layers (their codes, scales and zeros), 2.6 GB for a 1.5B model and ~6 GB for a 3B
one, where chunks unpacked to bfloat16 read the 1.5B shape at 0.6x the copy's rate (docs/BENCHMARKS.md
§5s): reading is once per document, and memory is what ends a load on a laptop."""


def keeps_reading_copy(held: str, bf16_matmuls: bool, bf16_bytes: int) -> bool:
    """Whether weights loaded as `held` ("int4", "nf4" or "full") also keep a bfloat16 copy of their
    decoder layers for reading (prefill chunks): int4 does on a CPU that runs bfloat16 matmuls
    natively (AVX-512 BF16, `bf16_matmuls`), where the copy read 2.5x faster than float32, for a
    model whose weights at bfloat16 (`bf16_bytes`: all its parameters, 2 bytes each) take at most
    `READING_COPY_MAX_BYTES`. Without it chunks unpack the int4 codes just in time
    (`engine.models.int4_unpack`: to bfloat16 with AVX-512 BF16, else to float32, where bfloat16
    matmuls were slower and a copy would only cost memory). The loader and the model list both ask
    this, so the list shows what loads."""
    return held == "int4" and bf16_matmuls and bf16_bytes <= READING_COPY_MAX_BYTES


def keeps_step_copy(held: str, bf16_matmuls: bool) -> bool:
    """Whether weights loaded as `held` also keep an int8 copy (per output feature) of the LM head
    for decode steps, and decode over int8 keys and values (`Int8Workspace`): int4 does on a CPU
    without AVX-512 BF16, where torch's int4 kernel is compute-bound on one row and bfloat16
    products are slow (`engine.models.int4_cpu`, `engine.kvcache.decode_workspace`). With AVX-512
    BF16 the LM head keeps the int4 kernel and the workspace bfloat16 keys."""
    return held == "int4" and not bf16_matmuls


def choose_weights(weights: str, device_type: str, full_bytes: int, ram_bytes: int, *, streams: bool) -> str:
    """The format to load: "nf4", "int4" or "full". `weights` is the setting ("auto", "4bit", "int4"
    or "full"); `device_type` is "cpu" or "cuda"; `full_bytes`: the weights at the compute dtype;
    `streams`: whether the model's files can be read into int4 layer by layer
    (`engine.models.stream_load.plan_stream`).

    "auto": NF4 on a GPU (VRAM is the limit there; bitsandbytes' CUDA kernels are fast); on a CPU,
    int4 (linear layers in 4-bit groups of 32, Q4_1's layout, the LM head in 8-bit groups, Q8_0's,
    on torch's int4 CPU kernel) when the model streams, or when its full weights take at most
    `FULL_WEIGHTS_RAM_SHARE` of `ram_bytes` (it is loaded whole first), else NF4. Where int4 does
    not fit, NF4 (also half a byte per weight) would not either. On the default model, which ships
    as a Q4_1 GGUF, int4 is its own weights again (perplexity within 0.1 % of float32) and decodes
    faster than float32 (docs/BENCHMARKS.md §3); bitsandbytes' CPU path dequantizes each weight
    matrix on every call, so NF4 decoded 1.5x slower than float32 there.
    Raises ValueError for another value of `weights`, and for "int4" on a GPU (the kernel is torch's
    CPU one).
    """
    if weights == "4bit":
        return "nf4"
    if weights == "full":
        return "full"
    if weights == "int4":
        if device_type != "cpu":
            raise ValueError("int4 weights run on a CPU only; choose auto, 4bit or full for a GPU")
        return "int4"
    if weights != "auto":
        raise ValueError(f"weights must be auto, 4bit, int4 or full, got {weights!r}")
    if device_type != "cpu":
        return "nf4"
    return "int4" if streams or full_bytes <= FULL_WEIGHTS_RAM_SHARE * ram_bytes else "nf4"
