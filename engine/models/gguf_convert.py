"""Convert a GGUF file once into a Hugging Face model folder kept in the user cache dir.

transformers reads GGUF by dequantizing every tensor (about 15 s for the 98 MB default model on
two CPU cores) and refuses `save_pretrained` on the result, so the state dict is written with
safetensors next to the config and tokenizer. The folder is keyed by the file's SHA-256; later
starts load it directly, and then quantize to 4-bit like any other folder.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import filelock

from engine import paths
from engine.errors import ModelError
from engine.models.source import file_sha256

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_DONE_MARKER = "halaman-converted.txt"
log = logging.getLogger("engine.models")


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file. Raises ModelError if it is not a readable GGUF."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        raise ModelError(f"{path.name} is not a readable GGUF file ({type(exc).__name__}); check the download") from None


LOCK_POLL_S = 0.5
"""How often a process waiting for another one's conversion checks the lock (and logs once)."""


def _target(sha: str) -> Path:
    return paths.cache_dir() / "models" / sha[:32]


def is_converted(gguf_path: Path) -> bool:
    """Whether `converted_folder(gguf_path)` returns at once: this file was converted before (its
    hash is remembered, so asking again costs a stat)."""
    return (_target(file_sha256(gguf_path)) / _DONE_MARKER).is_file()


def converted_path(gguf_path: Path) -> Path | None:
    """The HF folder `gguf_path` was converted into, None when it was not converted yet (converts nothing)."""
    target = _target(file_sha256(gguf_path))
    return target if (target / _DONE_MARKER).is_file() else None


def converted_folder(gguf_path: Path) -> Path:
    """The HF folder for `gguf_path`, converting it first if this file was never converted.

    Raises ModelError for an unsupported architecture (checked before the slow conversion,
    transformers #32577 / Qwen3 #1454) or a conversion failure. The conversion writes into a
    temporary folder that is renamed into place, so a crash never leaves a half-converted model.

    Safe with several Halaman processes (the window and a `halaman ask`, a double double-click):
    the conversion runs under a file lock (`filelock`, `<target>.lock` beside it), a second
    process waits for it and then uses the finished folder, and a folder with its marker (one that
    a process may be loading from) is never deleted or replaced.
    """
    sha = file_sha256(gguf_path)
    target = _target(sha)
    if (target / _DONE_MARKER).is_file():
        return target
    arch = gguf_architecture(gguf_path)
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelError(
            f"{gguf_path.name} is a {arch!r} model; Halaman runs {', '.join(SUPPORTED_GGUF_ARCHITECTURES)} models"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        if (target / _DONE_MARKER).is_file():
            return target  # another process converted it while this one waited
        _convert_into(gguf_path, target, sha)
    return target


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    lock = filelock.FileLock(target.with_name(f"{target.name}.lock"))
    waited = False
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            break
        except filelock.Timeout:
            if not waited:
                log.info("another Halaman process is converting %s; waiting for it", target.name)
                waited = True
    try:
        yield
    finally:
        lock.release()


def _convert_into(gguf_path: Path, target: Path, sha: str) -> None:
    """Convert into a temporary folder and rename it to `target`; called under the lock, with no
    finished folder at `target` (a folder there is a leftover without its marker)."""
    # A process killed while converting (a first start closed early) left its temporary folder, hundreds
    # of MB; only the lock's holder writes one, so every one there now is a leftover.
    for leftover in target.parent.glob(f"{glob.escape(target.name)}.*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        _convert(gguf_path, tmp)
        (tmp / _DONE_MARKER).write_text(f"converted from {gguf_path.name}\nsha256 {sha}\n")
        shutil.rmtree(target, ignore_errors=True)  # unfinished, so no process is loading from it
        os.replace(tmp, target)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers raises many types here
        raise ModelError(f"could not convert {gguf_path.name}: {type(exc).__name__}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf_path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    out.mkdir(parents=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    logging.getLogger("gguf").setLevel(logging.ERROR)
    try:
        with no_transformers_bars():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shared with embed_tokens; safetensors refuses aliases
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF "quantization" is gone once dequantized
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """Without transformers' own tqdm bars ("Converting and de-quantizing GGUF tensors", "Loading
    weights"): on stderr they cut through the CLI's progress line and the window's terminal, and our
    progress events already say the model is loading."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # The GGUF reader's bar is a plain tqdm, which that switch does not reach (transformers 5.24).
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        bar = gguf_utils.tqdm
    except (ImportError, AttributeError):  # another transformers: its bar, if any, stays
        gguf_utils = None
    else:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if gguf_utils is not None:
            gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()
