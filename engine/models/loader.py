"""Load a model and wrap it in a `CompressedDecoder`: 4-bit weights (bitsandbytes NF4) on a GPU,
4-bit weights on torch's int4 CPU kernel with an 8-bit LM head (`engine.models.int4_cpu`) on a CPU
(`engine.models.weight_format.choose_weights`).

Every source ends up as a Hugging Face folder (a GGUF is converted once, a hub id is downloaded
once) loaded with `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))`
or without quantization. "int4" streams the folder's safetensors tensor by tensor into int4 layers
(`engine.models.stream_load`: the float32 model is never held; the 1.5B shape peaked at 1.8 GiB of
RSS instead of 8.1, docs/BENCHMARKS.md §5i); a folder it cannot stream is loaded in float32 and every
linear layer replaced in place (`engine.models.int4_cpu.quantize_for_cpu`). bitsandbytes' NF4 `Linear4bit` runs on CPU and CUDA
but dequantizes every matrix on every call on a CPU. Tried and left: torchao 0.18's `quantize_`
with `Int8WeightOnlyConfig` / `Int8DynamicActivationInt8WeightConfig` ran the LM head slower than
float32 in eager mode and no faster compiled; torch's x86 dynamic int8 linear
(`torch.ao.quantization.quantize_dynamic`) ran it much faster but quantizes activations per tensor,
which costs the default model perplexity even one token at a time (SmolLM2's outlier activations).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelError
from engine.models.decoder import SUPPORTED_MODEL_TYPES, CompressedDecoder
from engine.models.download import ALLOW_PATTERNS
from engine.models.gguf_convert import converted_folder, is_converted, no_transformers_bars
from engine.models.int4_cpu import dense_chunks, quantize_for_cpu
from engine.models.profile import ModelProfile
from engine.models.source import ModelSource, file_sha256, folder_fingerprint, resolve
from engine.models.stream_load import StreamPlan, load_int4, plan_stream, stored_head_is_embedding
from engine.models.weight_format import LABELS, choose_weights, keeps_reading_copy, keeps_step_copy


@dataclass
class LoadedModel:
    """A ready model. `weight_bytes`: bytes the weights really hold (4-bit codes + absmax + the rest).
    `weights`: how they are held, "nf4", "int4" or the dtype name ("float32", "bfloat16", …).
    `parameters`: parameters outside the embeddings, 4-bit ones counted unpacked (0: unknown), what
    a token's compute scales with (`engine.read_time.guessed_rate`). `reading`: "unpacked to
    bfloat16" where int4 weights on a CPU with AVX-512 BF16 keep no bfloat16 reading copy (a model
    over 1 GiB at bfloat16: its chunks read at ~0.6x the copy's rate, docs/BENCHMARKS.md §5s), else "".
    """

    decoder: CompressedDecoder
    tokenizer: object
    profile: ModelProfile
    label: str
    model_fingerprint: str
    tokenizer_fingerprint: str
    weight_bytes: int
    device: torch.device
    load_seconds: float
    weights: str = "nf4"
    threads: int = 0            # CPU threads torch was given at load (0 on a GPU)
    parameters: int = 0
    reading: str = ""

    @property
    def weights_label(self) -> str:
        """How the weights are held, for people: "4-bit NF4", "4-bit int4" or "float32" (the CLI, status bar, gauge)."""
        return LABELS.get(self.weights, self.weights)

    @property
    def reading_label(self) -> str:
        """`weights_label`, with how chunks read the weights where a CPU with AVX-512 BF16 has no
        reading copy for them ("4-bit int4, unpacked to bfloat16"): read rates are kept per this
        label (`engine.read_time.RateKey`), and the copy reads ~1.6x faster, so a rate measured with
        it must never plan a read without it."""
        return f"{self.weights_label}, {self.reading}" if self.reading else self.weights_label


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA if available else CPU. Raises ModelError for "cuda" without a GPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError("device is set to CUDA but no CUDA GPU is available; choose auto or cpu")
    return torch.device(device)


def compute_dtype_for(device: torch.device) -> torch.dtype:
    """float32 on CPU (fastest there); bfloat16 on GPUs that support it, else float16."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def full_weight_bytes(folder: Path, dtype: torch.dtype, config, plan: StreamPlan | None = None) -> int:
    """Bytes of the folder's weights held at `dtype` (parameter count from the safetensors headers),
    a tied LM head counted once: some checkpoints store `lm_head.weight`, a copy of the embedding
    it is tied to, where the loaded model holds one tensor (and the model list counts one).
    `config`: the folder's transformers config; `plan`: its `plan_stream`, where one was made (it
    compared a stored tied head with the embedding already; without it they are compared here,
    ~0.3 s for Qwen3-0.6B). Raises ModelError naming the file when one is not a whole safetensors
    file (a folder an older Halaman marked complete without checking its content)."""
    from engine.models.verify import safetensors_shapes

    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            shapes.update(safetensors_shapes(path, path.name))
        except ModelError as exc:
            raise ModelError(f"{exc} (in {folder}): the file is damaged or incomplete; if Halaman downloaded it, "
                             "delete that folder and pull the model again") from None
    if "lm_head.weight" in shapes and getattr(config, "tie_word_embeddings", False) \
            and (plan is not None or stored_head_is_embedding(folder)):
        del shapes["lm_head.weight"]
    elements = 0
    for shape in shapes.values():
        count = 1
        for size in shape:
            count *= size
        elements += count
    return elements * torch.empty((), dtype=dtype).element_size()


def conversion_pending(spec: str) -> bool:
    """Whether loading `spec` first converts a GGUF file (once per file: minutes on a busy CPU).
    False for a folder or a hub id, and for a spec that does not resolve or a file that cannot be
    read (loading will say why). Never raises."""
    try:
        source = resolve(spec)
        return source.kind == "gguf" and not is_converted(Path(source.path))
    except (ModelError, OSError):  # unreadable now: loading it will say why
        return False


def load_model(spec: str = "default", *, device: str = "auto", weights: str = "auto", threads: int = 0) -> LoadedModel:
    """Locate, convert or download, and load a model with `weights` "4bit", "int4", "full" or "auto"
    (`choose_weights`); on a CPU torch gets `threads` threads (0: the idle cores, `engine.threads`).
    The model fingerprint includes the format, so prefix caches of one format are never restored
    into another. Raises ModelError with what to do."""
    import psutil

    from engine.threads import apply_threads

    began = time.perf_counter()
    source = resolve(spec)
    folder, fingerprint = _materialize(source)
    config = _config(folder)  # a type Halaman runs, before anything else reads the folder
    dev = resolve_device(device)
    used_threads = apply_threads(threads) if dev.type == "cpu" else 0
    dtype = compute_dtype_for(dev)
    # Made once: "auto" asks whether the folder streams, the int4 load reads it, the count trusts its head check.
    plan, unplanned = None, None
    if dev.type == "cpu" and weights in ("auto", "int4"):
        try:
            plan = plan_stream(folder, config)
        except Exception as exc:  # noqa: BLE001 - said below if int4 is chosen: the whole load would hide it
            unplanned = exc
    full_bytes = full_weight_bytes(folder, dtype, config, plan)
    try:
        held = choose_weights(weights, dev.type, full_bytes, psutil.virtual_memory().total, streams=plan is not None)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if held == "int4" and unplanned is not None:
        raise ModelError(f"could not load the model in {folder.name}: {type(unplanned).__name__}: {unplanned}")
    bf16_matmuls = held == "int4" and dense_chunks()
    bf16_bytes = full_bytes // dtype.itemsize * 2
    copy, int8_steps = keeps_reading_copy(held, bf16_matmuls, bf16_bytes), keeps_step_copy(held, bf16_matmuls)
    model, tokenizer, parameters = _load_folder(folder, config, dev, dtype, held, (copy, int8_steps), plan)
    tokenizer_fp = hashlib.sha256(
        tokenizer.backend_tokenizer.to_str().encode() + (tokenizer.chat_template or "").encode()
    ).hexdigest()
    # int4 chunks on a CPU with AVX-512 BF16 run in bfloat16 (the copy or the unpacked weights): so does their attention (fused)
    attention_dtype = torch.bfloat16 if bf16_matmuls else None
    weights_mode = str(dtype) if held == "full" else f"{held}-{dtype}"
    if held == "full":
        held = str(dtype).removeprefix("torch.")
    return LoadedModel(
        decoder=CompressedDecoder(model, attention_dtype=attention_dtype, int8_steps=int8_steps),
        tokenizer=tokenizer,
        profile=ModelProfile.from_config(model.config),
        label=source.label,
        model_fingerprint=hashlib.sha256(f"{fingerprint}:{weights_mode}".encode()).hexdigest(),
        tokenizer_fingerprint=tokenizer_fp,
        weight_bytes=weight_bytes(model),
        device=dev,
        load_seconds=time.perf_counter() - began,
        weights=held,
        threads=used_threads,
        parameters=parameters,
        reading="unpacked to bfloat16" if bf16_matmuls and not copy else "",
    )


def profile_for(spec: str) -> ModelProfile:
    """The KV-relevant shape of a model from its config alone (no weights are loaded).

    Raises ModelError when the model cannot be found or its config read.
    """
    from transformers import AutoConfig

    source = resolve(spec)
    try:
        if source.kind == "gguf":
            path = Path(source.path)
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
        elif source.kind == "folder":
            config = AutoConfig.from_pretrained(source.path, trust_remote_code=False)
        else:
            from huggingface_hub import hf_hub_download

            config = AutoConfig.from_pretrained(str(Path(hf_hub_download(source.path, "config.json")).parent), trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - offline, missing file, bad JSON
        raise ModelError(f"could not read the config of {spec} ({type(exc).__name__}); check the name or path") from None
    return ModelProfile.from_config(config)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes held by parameters and buffers, counting a 4-bit layer's packed codes and its
    quantization state (absmax per block, code book) — what the weights really occupy. A CPU
    low-bit layer's codes, scales and zeros are buffers (`engine.models.int4_cpu`)."""
    total = 0
    seen: set[int] = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in seen:  # tied embeddings are one tensor
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
        state = getattr(tensor, "quant_state", None)
        if state is not None:
            total += sum(t.nbytes for t in (state.absmax, state.code) if t is not None)
            if getattr(state, "state2", None) is not None:
                total += sum(t.nbytes for t in (state.state2.absmax, state.state2.code) if t is not None)
    return total


def _materialize(source: ModelSource) -> tuple[Path, str]:
    """A local HF folder for `source` and a fingerprint of the exact weights."""
    if source.kind == "gguf":
        path = Path(source.path)
        return converted_folder(path), file_sha256(path)
    if source.kind == "folder":
        folder = Path(source.path)
        return folder, folder_fingerprint(folder)
    return _download(source.path)


def _download(repo_id: str) -> tuple[Path, str]:
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=list(ALLOW_PATTERNS)))
    except Exception as exc:  # noqa: BLE001 - offline, 404, auth: all end the same way for the user
        raise ModelError(
            f"could not download {repo_id} ({type(exc).__name__}); check the id and your connection, or pick a local model"
        ) from None
    return folder, folder_fingerprint(folder)


def _load_folder(folder: Path, config, device: torch.device, dtype: torch.dtype, held: str, copies: tuple[bool, bool],
                 plan: StreamPlan | None):
    """The model of `folder` (its `_config`) held as `held` ("nf4", "int4" or "full"), its tokenizer, and its parameter count
    outside the embeddings (4-bit ones unpacked). int4 streams the safetensors into int4 layers
    (`engine.models.stream_load` with `plan`; `copies`: the reading copy and the LM head's step copy), or, for a
    folder it cannot stream (no `plan`), loads the float32 model and quantizes it in place."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = None
    if held == "nf4":
        # bitsandbytes tries to fetch an optional CPU kernel from the Hugging Face hub and logs a
        # warning when it cannot; its built-in kernel is used instead, so the warning is noise.
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
    try:
        with no_transformers_bars():
            tokenizer = _tokenizer(folder)
            if held == "int4" and plan is not None:
                model, parameters = load_int4(plan, dense=copies[0], step_copy=copies[1])
                return model, tokenizer, parameters
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, quantization_config=quant, device_map={"": str(device)}, trust_remote_code=False
            )
    except torch.cuda.OutOfMemoryError:
        raise ModelError(f"not enough GPU memory to load {folder.name}; choose a smaller model or the CPU") from None
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"could not load the model in {folder.name}: {type(exc).__name__}: {exc}") from None
    model.eval()
    parameters = model.num_parameters(exclude_embeddings=True)  # before int4 packs them into buffers
    if held == "int4":
        quantize_for_cpu(model, dense=copies[0], step_copy=copies[1])
    if held == "nf4" and device.type == "cpu":
        _use_portable_cpu_4bit_kernel(model)
    return model, tokenizer, parameters


def _config(folder: Path):
    """The folder's transformers config, read only once its config.json is a JSON object naming a
    model type Halaman runs. Raises ModelError saying which of these it is not."""
    from transformers import AutoConfig

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelError(f"the config.json of {folder} could not be read ({exc.strerror or type(exc).__name__})") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"the config.json of {folder} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise ModelError(f"the config.json of {folder} is not UTF-8 text") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        what = f"a {model_type!r} model" if model_type else "a model of no type (config.json names no model_type)"
        raise ModelError(f"{folder.name} is {what}; Halaman runs {', '.join(SUPPORTED_MODEL_TYPES)} models")
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - a value transformers refuses
        raise ModelError(f"the config.json of {folder} is not a valid {model_type} config ({type(exc).__name__})") from None


def _tokenizer(folder: Path):
    """The folder's tokenizer. Raises ModelError in one line when it has none that loads (transformers'
    own message lists every tokenizer class it tried, over several lines)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - missing or damaged tokenizer files end the same way for the user
        has = [name for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model") if (folder / name).exists()]
        found = f"it has {', '.join(has)}, which did not load" if has else "it has no tokenizer.json"
        raise ModelError(f"{folder.name} has no usable tokenizer ({found}; {type(exc).__name__})") from None


def _use_portable_cpu_4bit_kernel(model: torch.nn.Module) -> None:
    """Keep bitsandbytes on its dequantize-then-matmul CPU path.

    On CPUs with AVX512-BF16, bitsandbytes 0.50 repacks NF4 weights on the first eval-mode call and
    switches to a fused kernel that rounds activations to bfloat16 (logits then differ from the
    compute dtype's by ~0.7) and killed our process with SIGFPE once during a chunked prefill. The
    portable path computes in the configured dtype and was as fast or faster for chunks here.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
