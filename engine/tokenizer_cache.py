"""A model's tokenizer without its weights: what `halaman find` needs to count a document's tokens
and place its spans, read in a fraction of a second.

`halaman find` used to load (and, the first time, convert and de-quantize) the whole model only to
get its tokenizer: 12–73 s a question (issue 42). Here the tokenizer is built once per model file
with transformers (from the GGUF's metadata, or from the model folder's tokenizer files: the same
call the model's load makes, so the ids are the same) and kept in the cache folder as JSON:

    tokenizers/<key>.json   {"format", "label", "tokenizer": the `tokenizers` library's JSON,
                             "chat": the chat template cut at its sentinels (`engine.prompt.ChatLayout`),
                             "profile": `ModelProfile`'s fields (max_positions sizes the recall budget)}

Key: SHA-256 of the model file's bytes (a folder: of its tokenizer, config and weight files; both
remembered per size and mtime, `engine.models.source`), the transformers version that built it and
this file's FORMAT. Later calls read the JSON with the `tokenizers` library alone: neither torch
nor transformers is imported (about 7 s on two busy cores). A hub id not downloaded yet has no
file to key by and is built each time. A damaged entry is built again; one that cannot be written
costs the next call its build, never an error. A model loaded by the window or by `halaman ask`
keeps its tokenizer here as well (`keep_loaded`, from `engine.workspace.load_for`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from importlib import metadata
from pathlib import Path

from engine import paths
from engine.errors import ModelError
from engine.models.profile import ModelProfile
from engine.models.source import ModelSource, file_sha256, folder_fingerprint, resolve
from engine.prompt import ChatLayout, chat_layout

log = logging.getLogger(__name__)

CACHE_FOLDER = "tokenizers"
FORMAT = 2  # 2: the profile keeps hidden_size and intermediate_size (they size the reading budget)


class TextTokenizer:
    """The part of a Hugging Face fast tokenizer that `engine.prompt.encode_document` calls: `__call__`
    with `add_special_tokens`, `split_special_tokens` and `return_offsets_mapping`, over the
    `tokenizers` library's `Tokenizer` that the fast tokenizer wraps (transformers calls the same
    `encode` with the same flags, so ids and offsets are equal). `layout`: the model's chat
    template pieces; `profile`: its shape; `label`: its name for people; `key`: what it is kept
    under (None when it is not: a hub id), which names what is kept of its work too."""

    is_fast = True  # it gives character offsets (encode_document asks for them only then)

    def __init__(self, backend, layout: ChatLayout, profile: ModelProfile, label: str, key: str | None = None) -> None:
        self.backend = backend
        self.layout = layout
        self.profile = profile
        self.label = label
        self.key = key

    def __call__(self, text: str, *, add_special_tokens: bool = True, split_special_tokens: bool = False,
                 return_offsets_mapping: bool = False) -> dict[str, list]:
        """{"input_ids": [ids], "offset_mapping": [(start, end) characters of each]} (offsets only
        when asked). `split_special_tokens`: "<|im_end|>" in `text` is ordinary text."""
        self.backend.encode_special_tokens = split_special_tokens
        encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        found: dict[str, list] = {"input_ids": list(encoding.ids)}
        if return_offsets_mapping:
            found["offset_mapping"] = list(encoding.offsets)
        return found


def text_tokenizer(spec: str) -> TextTokenizer:
    """The tokenizer of the model `spec` ('default', a .gguf file, a model folder or a hub id), from
    the cache folder when this model file's was built before (module docstring), else built with
    transformers and kept. Raises ModelError when the model cannot be found or has no usable
    tokenizer or chat template."""
    source = resolve(spec)
    entry = _entry(source)
    if entry is not None:
        cached = _read(entry, source.label)
        if cached is not None:
            return cached
    built = _build(source)
    if entry is not None:
        remember(entry, built)
        built.key = entry.stem
    return built


def keep_loaded(spec: str, tokenizer, profile: ModelProfile) -> None:
    """Keep the tokenizer of a model just loaded (`engine.workspace.load_for`), so that a
    later `find` reads it instead of building it (transformers and torch imported, 10–50 s on two
    busy cores). `tokenizer`: the loaded Hugging Face fast tokenizer. Does nothing when it is kept
    already, has no chat template or no fast backend; never raises (a load must not fail here)."""
    try:
        source = resolve(spec)
        entry = _entry(source)
        if entry is None or entry.is_file() or not getattr(tokenizer, "is_fast", False):
            return
        remember(entry, TextTokenizer(tokenizer.backend_tokenizer, chat_layout(tokenizer), profile, source.label))
    except Exception as error:  # noqa: BLE001 - an optional shortcut: the next find builds it instead
        log.info("tokenizer of %s not kept at load: %s", spec, error)


def remember(entry: Path, tokenizer: TextTokenizer) -> None:
    """Keep `tokenizer` at `entry` (atomically); a failure is logged, never raised."""
    data = {"format": FORMAT, "label": tokenizer.label, "tokenizer": tokenizer.backend.to_str(),
            "chat": dataclasses.asdict(tokenizer.layout), "profile": dataclasses.asdict(tokenizer.profile)}
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        paths.write_text_atomic(entry, json.dumps(data, ensure_ascii=False))
    except OSError as error:
        log.info("tokenizer of %s not kept: %s", tokenizer.label, error)


def _entry(source: ModelSource) -> Path | None:
    """Where `source`'s tokenizer is kept; None for a hub id not downloaded (nothing to key by)."""
    if source.kind == "hub":
        return None
    try:
        identity = file_sha256(Path(source.path)) if source.kind == "gguf" else folder_fingerprint(Path(source.path))
        built_by = metadata.version("transformers")
    except (OSError, metadata.PackageNotFoundError):  # unreadable now: the build says why
        return None
    key = hashlib.sha256(f"{FORMAT}\0{identity}\0{built_by}".encode()).hexdigest()[:32]
    return paths.cache_dir() / CACHE_FOLDER / f"{key}.json"


def _read(entry: Path, label: str) -> TextTokenizer | None:
    """The tokenizer kept at `entry`; None when there is none or it is damaged (built again)."""
    from tokenizers import Tokenizer

    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            return None
        return TextTokenizer(Tokenizer.from_str(data["tokenizer"]), ChatLayout(**data["chat"]),
                             ModelProfile(**data["profile"]), label, entry.stem)
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - damaged JSON, missing keys, the tokenizers library's own errors
        log.info("kept tokenizer %s not used: %s", entry.name, error)
        return None


def _build(source: ModelSource) -> TextTokenizer:
    """Build the tokenizer with transformers, as `engine.models.loader` does for the model (the
    converted folder of a GGUF converted before, else the GGUF's own metadata, without converting
    the weights). Raises ModelError."""
    from transformers import AutoConfig, AutoTokenizer

    from engine.models.gguf_convert import converted_path, no_transformers_bars

    folder, options = Path(source.path), {}
    if source.kind == "gguf":
        converted = converted_path(folder)
        folder, options = (converted, {}) if converted is not None else (folder.parent, {"gguf_file": folder.name})
    where = str(folder) if source.kind != "hub" else source.path
    try:
        with no_transformers_bars():
            # as the loader: a folder's own Python code (its config's auto_map) is never run
            tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False, **options)
            config = AutoConfig.from_pretrained(where, trust_remote_code=False, **options)
        layout = chat_layout(tokenizer)
    except ValueError as error:  # no chat template
        raise ModelError(f"{source.label}: {error}") from None
    except Exception as error:  # noqa: BLE001 - offline, missing or unreadable files: one line for the user
        raise ModelError(f"could not read the tokenizer of {source.label} ({type(error).__name__}); "
                         "check the model name or path") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{source.label} has no fast tokenizer: its spans cannot be found without loading it")
    return TextTokenizer(tokenizer.backend_tokenizer, layout, ModelProfile.from_config(config), source.label)


__all__ = ["TextTokenizer", "keep_loaded", "remember", "text_tokenizer"]
