"""Load a Hugging Face folder straight into int4 CPU weights (`engine.models.int4_cpu`), one tensor at
a time, never holding the float32 model.

`from_pretrained` materializes every weight at the compute dtype before `quantize_for_cpu` replaces
the linear layers: the 1.5B shape peaked at 8.1 GiB of RSS for 1.2 GiB of int4 weights (1.8 GiB
now; docs/BENCHMARKS.md §5i). Here the model is built without weights (accelerate's
`init_empty_weights`: parameters on the meta device, buffers such as the rotary frequencies real),
and each parameter is read from the safetensors file on its own (`safe_open`, which maps the file
and copies nothing until a tensor is touched), cast to float32 exactly as `from_pretrained` casts
it, and either kept (embeddings, norms, biases) or quantized at once into an `Int4Linear` /
`Int8Linear` whose float32 copy is then dropped. The model is the one `from_pretrained` +
`quantize_for_cpu` give, bit for bit (tests/test_stream_load.py).

`safe_open` hands out views of its mapping of the file, whose pages count in the RSS while a view
lives: each tensor is read through its own short-lived `safe_open` and copied out (also a float32
one), so a quantized layer's pages leave with its float32 weight, and no kept tensor pins the
cached file (Windows refuses to delete a mapped file).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelError
from engine.models.int4_cpu import Int4Linear, Int8Linear, fits

log = logging.getLogger("engine.models")


@dataclass
class StreamPlan:
    """What `load_int4` reads a folder with (`plan_stream`): the model built without weights (its
    parameters on the meta device, tied as `from_pretrained` ties them), the name of each parameter
    by id (tied ones: the first name) and the safetensors file holding each name. Used once: the
    load fills `model` in place."""

    folder: Path
    model: torch.nn.Module
    names: dict[int, str]
    files: dict[str, Path]


def load_int4(plan: StreamPlan, *, dense: bool, step_copy: bool) -> tuple[torch.nn.Module, int]:
    """The model `plan` reads (`plan_stream`) with int4 decoder layers and an 8-bit LM head as
    `quantize_for_cpu(model, dense=dense, step_copy=step_copy)` makes them, in eval mode, and its
    parameter count outside the embeddings (`num_parameters(exclude_embeddings=True)`, the 4-bit
    ones unpacked). Raises ModelError when a tensor's shape differs from the model's or a parameter
    was never read."""
    model, names, files = plan.model, plan.names, plan.files
    skeleton = list(model.parameters())  # kept alive, so the ids in `names` stay unique while loading
    parameters = model.num_parameters(exclude_embeddings=True)
    _fill(model, names, lambda name: _read(files[name], name), dense=dense, step_copy=step_copy)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelError(f"could not load the model in {plan.folder.name}: {left[0]} was never read")
    del skeleton
    model.config.name_or_path = str(plan.folder)
    _generation_config(model, plan.folder)
    model.eval()
    return model, parameters


def stored_head_is_embedding(folder: Path) -> bool:
    """Whether the folder's safetensors store `lm_head.weight` as an exact copy of
    `model.embed_tokens.weight` (Qwen3-0.6B's checkpoint does): a config that ties them then holds
    one tensor, as `from_pretrained` does. False when either is missing or they differ (transformers
    5 then does not tie them, whatever the config says). Reads both matrices (mapped, ~0.3 s for a
    151,936 x 1,024 embedding). Raises nothing."""
    try:
        files = _tensor_files(folder)
        if "lm_head.weight" not in files or "model.embed_tokens.weight" not in files:
            return False
        return _same_stored(files, "lm_head.weight", "model.embed_tokens.weight")
    except Exception:  # noqa: BLE001 - an unreadable file: the load itself reports it
        return False


def _same_stored(files: dict[str, Path], first: str, second: str) -> bool:
    from safetensors import safe_open

    with safe_open(str(files[first]), framework="pt") as a, safe_open(str(files[second]), framework="pt") as b:
        x, y = a.get_tensor(first), b.get_tensor(second)
        return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def plan_stream(folder: Path, config) -> StreamPlan | None:
    """How `load_int4` reads `folder` (its transformers `config`), or None where it cannot: the
    config names a quantization (transformers' own quantizer reads those), a parameter's name is in
    no safetensors file (none there, or names transformers renames while loading), or the config
    ties an LM head the files store with other values than the embedding (`from_pretrained` keeps
    both apart then). Reads the safetensors' headers (and, for a stored tied head, both matrices)
    and builds the model without weights: ~0.1 s for a 3B shape. Raises what reading a file or
    building the model raises (OSError, safetensors' errors, transformers' ValueError)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    if getattr(config, "quantization_config", None) is not None:
        return None
    files = _tensor_files(folder)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    model.tie_weights()  # as `from_pretrained` does after loading (a tied LM head is the embedding)
    names = {id(p): name for name, p in model.named_parameters()}
    missing = sorted(set(names.values()) - set(files))
    if missing:
        log.info("%s: %d parameters not in its safetensors under the model's names (first: %s); it cannot stream",
                 folder.name, len(missing), missing[0])
        return None
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is embedding.weight and "lm_head.weight" in files \
            and not _same_stored(files, "lm_head.weight", names[id(embedding.weight)]):
        # transformers 5 keeps a stored head that differs from the embedding, tied config or not
        log.info("%s: its stored LM head differs from the embedding its config ties it to; it cannot stream", folder.name)
        return None
    return StreamPlan(folder, model, names, files)


def _fill(model: torch.nn.Module, names: dict[int, str], read: Callable[[str], torch.Tensor], *,
          dense: bool, step_copy: bool) -> None:
    """Give every meta parameter of `model` its tensor from `read(name)`, replacing each linear
    layer `fits` takes by its int4 layer (the LM head by an 8-bit one) as soon as its weight is read.
    Modules in their order (embeddings, layer by layer, norm, head) and lazily, so the float32
    layers replaced are dropped at once: one module's float32 weights exist at a time. Tied
    parameters are read once and shared, as `from_pretrained` ties them. `names`: the name of each
    meta parameter by id (the skeleton's parameters stay alive while `model` does, so ids are unique)."""
    head = model.get_output_embeddings()
    kept: dict[int, torch.nn.Parameter] = {}

    def tensor_for(meta: torch.nn.Parameter) -> torch.Tensor:
        return kept[id(meta)] if id(meta) in kept else _checked(read(names[id(meta)]), meta)

    for parent in model.modules():  # a generator: it walks into the int4 layers put in place below
        if isinstance(parent, Int4Linear):
            continue
        for key, meta in list(parent._parameters.items()):
            if meta is not None and meta.is_meta:
                kept[id(meta)] = torch.nn.Parameter(tensor_for(meta), requires_grad=meta.requires_grad)
                parent._parameters[key] = kept[id(meta)]
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and fits(child):
                float_layer = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                float_layer.weight = torch.nn.Parameter(tensor_for(child.weight), requires_grad=False)
                if child.bias is not None:
                    float_layer.bias = torch.nn.Parameter(tensor_for(child.bias), requires_grad=False)
                quantized = Int8Linear(float_layer, step_copy=step_copy) if child is head else Int4Linear(float_layer, dense=dense)
                setattr(parent, child_name, quantized)
                del float_layer, quantized
                _return_freed_memory()


def _return_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc's `malloc_trim`; elsewhere nothing).
    A layer's float32 weight and temporaries (1-40 MB each) come from the heap, below glibc's
    mmap threshold, between the int4 buffers that stay: without trimming the 1.5B shape ended its
    load holding ~0.6 GiB of freed memory (docs/BENCHMARKS.md §5i)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None  # musl has none
    except OSError:
        return None


_LIBC = _glibc()


def _checked(tensor: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    if tensor.shape != meta.shape:
        raise ModelError(f"a weight of shape {tuple(tensor.shape)} in the model file should be {tuple(meta.shape)}; "
                         "the config and the weights do not match")
    return tensor


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of `folder` that holds it (headers only)."""
    from safetensors import safe_open

    files: dict[str, Path] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            files.update(dict.fromkeys(handle.keys(), path))
    return files


def _read(path: Path, name: str) -> torch.Tensor:
    """Tensor `name` of the safetensors file `path` as float32 in the process's own memory (a copy,
    also of a float32 tensor: the mapping is released when the file closes and the view dies)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.get_tensor(name).to(torch.float32, copy=True)


def _generation_config(model: torch.nn.Module, folder: Path) -> None:
    """The folder's generation_config.json (its end-of-turn ids), or one from config.json, as
    `from_pretrained` sets it (transformers' own `adjust_generation_fn`)."""
    if model.can_generate():
        model.adjust_generation_fn(generation_config=None, from_auto_class=True, from_pipeline=None,
                                   pretrained_model_name_or_path=str(folder), cache_dir=None, force_download=False,
                                   proxies=None, local_files_only=True, token=None, revision=None, subfolder="",
                                   trust_remote_code=False)
