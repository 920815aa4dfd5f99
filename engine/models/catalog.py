"""The curated list of instruct models (`catalog.toml`) and whether each fits this machine.

Sizes are computed from each model's config numbers, not typed in:

    parameters      embeddings V·h (+ an untied output matrix V·h) + per layer (q, k, v, o projections,
                    their biases for Qwen2, q/k norms for Qwen3, the gated MLP 3·h·I, two RMSNorms)
                    + the final norm
    download        ≈ 2 bytes per parameter (the repositories hold bfloat16 safetensors); the exact
                    size is read from the hub's metadata when a download starts
    4-bit weights   what `engine.models.loader` really holds: every linear layer in bitsandbytes NF4
                    (half a byte per weight + a float32 absmax per 64 weights + a 16-entry float32
                    code book), embeddings, norms and biases in the compute dtype (float32 on the CPU,
                    16-bit on a GPU), and the rotary embedding's float32 frequency buffers
    int4 weights    on a CPU (`engine.models.int4_cpu`): every decoder linear layer in 4-bit codes
                    (half a byte per weight + a bfloat16 scale and zero per 32 weights) and, on a
                    CPU with AVX-512 BF16, a bfloat16 copy for prefill chunks (a model of at most
                    1 GiB at bfloat16), on one without it an
                    int8 copy (a byte per weight + a bfloat16 scale per output feature) of the LM
                    head for decode steps (each counted where the loader makes it:
                    `weight_format.keeps_reading_copy`, `keeps_step_copy`), the LM head (its own copy when tied) in
                    8-bit codes held as two 4-bit planes, embeddings, norms and biases in float32,
                    and the rotary buffers
    weights         what the loader will hold with the `weights` setting: with "auto", the 4-bit NF4
                    size on a GPU and the int4 size on a CPU (the catalog's models are safetensors
                    repositories, which the loader streams into int4:
                    `engine.models.weight_format.choose_weights`)
    KV per token    2 (K and V) · L · H_kv · D · 2 bytes: a full 16-bit cache (`engine.estimate`)

"Fits" adds the compressed cache at its prefill peak, the tokens a question may recall and one
layer's attention probabilities for a prefill chunk to the weights, plus a fixed margin for the
process itself, and compares the sum with the device's total memory.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.estimate import full_cache_bytes, kv_peak_bytes
from engine.models.profile import ModelProfile
from engine.models.weight_format import LABELS, choose_weights, keeps_reading_copy, keeps_step_copy
from engine.settings import EngineSettings
from engine.units import format_bytes

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
NF4_BLOCK = 64            # weights per absmax in bitsandbytes' 4-bit layers (its default blocksize)
NF4_CODE_BYTES = 16 * 4   # the NF4 code book each 4-bit layer keeps: 16 float32 values
INT4_GROUP = 32           # weights per bfloat16 scale and zero of a CPU int4 layer (`engine.models.int4_cpu`)
READING_COPY_PART = "a bfloat16 copy of the layers for reading (prefill)"
"""The name of the reading copy among `CatalogModel.weight_int4_parts` (`fit` and `halaman models`
look it up there, so they say what the sizes count)."""
# Python, torch and Qt before any model is loaded: the window's gauge showed the process holding
# 1.3 GiB of "workspace" with no document open; rounded up, it also covers a CUDA context.
PROCESS_MARGIN_BYTES = 3 * 1024**3 // 2


@dataclass(frozen=True)
class CatalogModel:
    """One instruct model of the catalog: its hub repository and the config.json numbers that
    decide its size (field names as in config.json)."""

    id: str
    repo: str
    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    head_dim: int | None = None         # None: hidden_size // num_attention_heads (as transformers does)
    attention_bias: bool = False
    qk_norm: bool = False
    gated: bool = False
    published_parameters: int = 0
    embedded: bool = False              # shipped with Halaman as the default model (a Q4_1 GGUF)

    @property
    def head_dimension(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def profile(self) -> ModelProfile:
        """The KV-relevant shape, as `ModelProfile.from_config` would read it."""
        return ModelProfile(self.model_type, self.num_hidden_layers, self.num_key_value_heads, self.head_dimension,
                            self.num_attention_heads, self.max_position_embeddings, self.vocab_size,
                            self.hidden_size, self.intermediate_size)

    def _linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer in the decoder layers, all layers together."""
        h, d = self.hidden_size, self.head_dimension
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        per_layer = [(h, q), (h, kv), (h, kv), (q, h),
                     (h, self.intermediate_size), (h, self.intermediate_size), (self.intermediate_size, h)]
        return per_layer * self.num_hidden_layers

    def _other_parameters(self) -> int:
        """Parameters outside the decoder layers' linear weights: embeddings, an untied output
        matrix, norms, q/k/v biases."""
        h, d = self.hidden_size, self.head_dimension
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        per_layer = 2 * h  # input and post-attention RMSNorm
        if self.attention_bias:
            per_layer += (self.num_attention_heads + 2 * self.num_key_value_heads) * d
        if self.qk_norm:
            per_layer += 2 * d
        return embeddings + per_layer * self.num_hidden_layers + h  # + final norm

    @property
    def linear_parameters(self) -> int:
        """Weights of the decoder layers' linear layers: what a token's compute passes through."""
        return sum(i * o for i, o in self._linear_shapes())

    @property
    def parameters(self) -> int:
        """Total parameters, a tied embedding counted once."""
        return self.linear_parameters + self._other_parameters()

    @property
    def download_bytes(self) -> int:
        """Approximate download: the bfloat16 weights (2 bytes per parameter). The tokenizer and
        config files add a few MiB; the exact size comes from the hub when the download starts."""
        return 2 * self.parameters

    def weight_4bit_bytes(self, element_bytes: int) -> int:
        """Bytes the weights hold once loaded with 4-bit linear layers; `element_bytes` is the compute
        dtype's size (4 on the CPU, 2 on a GPU), which embeddings, norms and biases keep."""
        nf4 = sum(-(-i * o // 2) + 4 * -(-i * o // NF4_BLOCK) + NF4_CODE_BYTES for i, o in self._linear_shapes())
        rotary = 2 * (self.head_dimension // 2) * 4  # inv_freq and original_inv_freq buffers, float32
        return nf4 + element_bytes * self._other_parameters() + rotary

    def weight_int4_bytes(self, *, bf16_matmuls: bool) -> int:
        """Bytes the weights hold once loaded in int4 on a CPU (module docstring) that runs bfloat16
        matmuls natively or not (`bf16_matmuls`), which decides the copies it keeps
        (`weight_format.keeps_reading_copy`, `keeps_step_copy`)."""
        return sum(size for _, size in self.weight_int4_parts(bf16_matmuls=bf16_matmuls))

    def weight_int4_parts(self, *, bf16_matmuls: bool) -> list[tuple[str, int]]:
        """`weight_int4_bytes` by what holds them, for people: the layers' 4-bit codes, the
        bfloat16 copy reading uses or the LM head's 8-bit copy answering uses, the 8-bit LM head, the float32
        embeddings, norms and biases."""
        def int4(shape: tuple[int, int]) -> int:  # codes, then a bfloat16 scale and zero per group
            return shape[0] * shape[1] // 2 + 4 * (shape[0] * shape[1] // INT4_GROUP)

        def int8_rows(shape: tuple[int, int]) -> int:  # codes, then a bfloat16 scale per output feature
            return shape[0] * shape[1] + 2 * shape[1]

        h, vocab = self.hidden_size, self.vocab_size
        untied_head = 0 if self.tie_word_embeddings else vocab * h  # replaced, not kept in float32
        rotary = 2 * (self.head_dimension // 2) * 4
        parts = [("4-bit layers", sum(int4(shape) for shape in self._linear_shapes()))]
        if keeps_reading_copy("int4", bf16_matmuls, 2 * self.parameters):
            parts.append((READING_COPY_PART,
                          sum(2 * i * o for i, o in self._linear_shapes())))
        if keeps_step_copy("int4", bf16_matmuls):
            parts.append(("an 8-bit copy of the LM head for answering (decode)", int8_rows((h, vocab))))
        parts += [("the 8-bit LM head", 2 * int4((h, vocab))),
                  ("embeddings, norms and biases in float32", 4 * (self._other_parameters() - untied_head) + rotary)]
        return parts

    @property
    def kv_bytes_per_token(self) -> int:
        """2 · L · H_kv · D · 2 bytes: one token in a full 16-bit KV cache."""
        return full_cache_bytes(self.profile, 1)


def load_catalog(path: Path | None = None) -> list[CatalogModel]:
    """The models listed in `path` (default: the bundled catalog.toml), in file order.
    Raises ModelError naming the file and entry when it cannot be read."""
    path = path or CATALOG_PATH
    try:
        entries = tomllib.loads(path.read_text(encoding="utf-8")).get("model", [])
        return [CatalogModel(**entry) for entry in entries]
    except (OSError, tomllib.TOMLDecodeError, TypeError) as exc:
        raise ModelError(f"the model list {path} cannot be read ({exc}); reinstall Halaman") from None


def find(models: list[CatalogModel], key: str) -> CatalogModel:
    """The model whose id or hub repository is `key` (case-insensitive). Raises ModelError listing the ids."""
    for model in models:
        if key.lower() in (model.id.lower(), model.repo.lower()):
            return model
    raise ModelError(f"{key!r} is not in the model list; pick one of: {', '.join(m.id for m in models)}")


@dataclass(frozen=True)
class DeviceMemory:
    """The memory a model would run in. `element_bytes`: the compute dtype's size there."""

    device: str          # "cuda" or "cpu"
    name: str            # "NVIDIA GeForce RTX 4060 Laptop GPU", "RAM"
    total_bytes: int
    element_bytes: int
    bf16_matmuls: bool = False  # a CPU that runs bfloat16 matmuls natively (AVX-512 BF16): int4 keeps a copy of a small model then

    def int4_note(self, copy: bool | None = None) -> str:
        """What an int4 size in the list holds on this CPU: the bfloat16 reading copy or why not,
        for one model (`copy`: whether the loader keeps it for that model) or any (None)."""
        if not self.bf16_matmuls:
            return ("int4 counts its 4-bit layers, the 8-bit LM head and a second 8-bit copy of it that answering "
                    "uses, and float32 embeddings; no bfloat16 copy for reading (this CPU has no AVX-512 BF16: "
                    "reading unpacks the 4-bit layers as it goes)")
        if copy is None:
            return ("int4 counts its 4-bit layers, for a model of at most 1 GiB at bfloat16 a bfloat16 copy of them "
                    "that reading uses (this CPU has AVX-512 BF16; a larger model's reading unpacks its 4-bit layers "
                    "as it goes), the 8-bit LM head and float32 embeddings")
        if copy:
            return ("int4 counts its 4-bit layers and a bfloat16 copy of them that reading uses "
                    "(this CPU has AVX-512 BF16), the 8-bit LM head and float32 embeddings")
        return ("int4 counts its 4-bit layers, the 8-bit LM head and float32 embeddings; no bfloat16 copy for "
                "reading (this CPU has AVX-512 BF16, but the model is over 1 GiB at bfloat16: reading unpacks its "
                "4-bit layers as it goes)")


def detect_memory(device: str = "auto") -> DeviceMemory:
    """The GPU when `device` ("auto", "cuda", "cpu", as in EngineSettings) picks one, else system RAM
    and whether the CPU runs bfloat16 matmuls natively."""
    import torch  # only here: the catalog itself stays cheap to import

    if device != "cpu" and torch.cuda.is_available():
        _free, total = torch.cuda.mem_get_info()
        return DeviceMemory("cuda", torch.cuda.get_device_name(), int(total), 2)
    import psutil

    from engine.models.int4_cpu import dense_chunks  # the loader's own test of the CPU

    return DeviceMemory("cpu", "RAM", int(psutil.virtual_memory().total), 4, bf16_matmuls=dense_chunks())


@dataclass(frozen=True)
class Fit:
    """Whether a model fits a device with given settings. All sizes in bytes."""

    fits: bool
    needed_bytes: int
    weights_bytes: int     # as the loader will hold them (`weights_label`)
    weights_label: str     # "4-bit NF4", "4-bit int4" or "float32" / "16-bit"
    kv_bytes: int          # compressed cache at its prefill peak + recalled tokens
    workspace_bytes: int   # one layer's attention probabilities for a prefill chunk + the process margin
    available_bytes: int
    reason: str            # one line: "needs 3.1 GiB of 15.5 GiB RAM"
    weights_parts: tuple[tuple[str, int], ...] = ()  # what the weights' bytes are, when more than one thing holds them
    weights_note: str = ""  # int4: whether its size has the bfloat16 reading copy, and why (`DeviceMemory.int4_note`)


def fit(model: CatalogModel, settings: EngineSettings, memory: DeviceMemory) -> Fit:
    """Does `model` fit `memory` with the cache policy and recall of `settings`? (module docstring)"""
    policy, profile = settings.cache, model.profile
    full = model.parameters * memory.element_bytes
    try:
        # streams: every catalog model is a hub repository of safetensors under transformers' own
        # names, which the loader reads into int4 layer by layer (`engine.models.stream_load`)
        held = choose_weights(settings.weights, memory.device, full, memory.total_bytes, streams=True)
    except ValueError as exc:  # "int4" on a GPU: the loader refuses it the same way
        return Fit(False, 0, 0, LABELS["int4"], 0, 0, memory.total_bytes, str(exc))
    if held == "nf4":
        weights, label = model.weight_4bit_bytes(memory.element_bytes), LABELS[held]
    elif held == "int4":
        parts = tuple(model.weight_int4_parts(bf16_matmuls=memory.bf16_matmuls))
        weights, label = sum(size for _, size in parts), LABELS[held]
    else:
        weights, label = full, "float32" if memory.element_bytes == 4 else "16-bit"
    kv = kv_peak_bytes(profile, policy, settings.recall)
    # [heads, chunk, cached + chunk] float32 scores and probabilities (engine.kvcache.attention)
    attention = 2 * 4 * model.num_attention_heads * policy.chunk_tokens * (policy.budget_tokens + policy.chunk_tokens)
    workspace = attention + PROCESS_MARGIN_BYTES
    needed = weights + kv + workspace
    fits = needed <= memory.total_bytes
    where = f"{format_bytes(memory.total_bytes)} {memory.name}"
    reason = f"needs {format_bytes(needed)} of {where}" if fits else f"needs {format_bytes(needed)}, more than the {where}"
    return Fit(fits, needed, weights, label, kv, workspace, memory.total_bytes, reason,
               parts if held == "int4" else (),
               memory.int4_note(READING_COPY_PART in dict(parts)) if held == "int4" else "")
