"""Check that a downloaded model file is what its name says, before the download is marked complete.

A hub (or a mirror) that gives sizes but no hashes, or neither, cannot vouch for a file's bytes: a
zero-filled `model.safetensors`, a captive portal's login page saved under the weights' name, or a
truncated shard would otherwise be kept and fail later, at load time, as a SafetensorError
traceback. So every file is checked for what its format promises:

- `.safetensors` (the format's spec, huggingface/safetensors README): 8 bytes little-endian header
  length N, then N bytes of JSON {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}},
  optionally "__metadata__"; the data section is the rest of the file. Each tensor's bytes (its
  element count x the dtype's width) must equal end - begin, and the tensors must cover the data
  section exactly (the file size).
- `.json`: parses as JSON.
- any file: not an HTML page (what a login page or an error page sent with 200 OK is).

`check_against_config` compares the tensors' shapes with config.json where that is cheap: the
embedding's [vocab_size, hidden_size] and that every layer it names is there.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from engine.errors import ModelError

# Bytes per element of each safetensors dtype (the spec's list).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100 << 20  # safetensors itself refuses headers over 100 MB
HTML_START = re.compile(rb"^\s*(<!doctype\s+html|<html|<head|<body|<meta|<title)", re.I)
WEB_PAGE = ("the server sent a web page instead of the model file {name}: are you behind a login page "
            "(hotel or office Wi-Fi)? Open any web page in a browser to sign in, then pull again")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def looks_like_web_page(head: bytes) -> bool:
    """Whether the first bytes of a file are an HTML page (`head`: its first few hundred bytes)."""
    return bool(HTML_START.match(head[:1024]))


def check_file(path: Path, name: str) -> None:
    """Check the downloaded `path` (saved as `name`) for what its format promises (module docstring).
    Raises ModelError naming the file and what is wrong with it."""
    with path.open("rb") as handle:
        head = handle.read(1024)
    if looks_like_web_page(head):
        raise ModelError(WEB_PAGE.format(name=name))
    if name.endswith(".safetensors"):
        safetensors_shapes(path, name)
    elif name.endswith(".json"):
        try:
            json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelError(f"{name} is not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None


def safetensors_shapes(path: Path, name: str) -> dict[str, list[int]]:
    """Tensor name -> shape of the safetensors file `path`, after checking its header and that the
    tensors' byte sizes add up to the file's size. Raises ModelError naming `name` and the fault."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ModelError(f"{name} is not a safetensors file: it has only {size} bytes")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if not 2 <= header_bytes <= min(MAX_HEADER_BYTES, size - 8):
            guess = ("an empty or zero-filled file?" if header_bytes < 2 else
                     "its first bytes are not a header's length: another format, or random bytes?"
                     if header_bytes > MAX_HEADER_BYTES else "a file cut short?")
            raise ModelError(f"{name} is not a safetensors file: its header length ({header_bytes:,} bytes) "
                             f"does not fit its {size:,} bytes ({guess})")
        raw = handle.read(header_bytes)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ModelError(f"{name} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelError(f"{name} is not a safetensors file: its header is not a JSON object")
    shapes, covered, data_bytes = {}, 0, size - 8 - header_bytes
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        shapes[tensor] = _tensor_shape(name, tensor, entry, data_bytes)
        covered += entry["data_offsets"][1] - entry["data_offsets"][0]
    if covered != data_bytes:
        raise ModelError(f"{name}: its tensors hold {covered:,} bytes but the file has {data_bytes:,} bytes of data "
                         "(truncated or padded)")
    return shapes


def _tensor_shape(name: str, tensor: str, entry: object, data_bytes: int) -> list[int]:
    """One header entry's shape, after checking its dtype, offsets and byte size."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], [int(n) for n in entry["shape"]], entry["data_offsets"]
        begin, end = int(begin), int(end)
    except (TypeError, KeyError, ValueError):
        raise ModelError(f"{name}: the header entry of {tensor[:80]} is malformed") from None
    if dtype not in DTYPE_BYTES:
        raise ModelError(f"{name}: {tensor[:80]} has an unknown dtype {str(dtype)[:20]}")
    elements = 1
    for n in shape:
        elements *= n
    if not 0 <= begin <= end <= data_bytes or end - begin != elements * DTYPE_BYTES[dtype]:
        raise ModelError(f"{name}: {tensor[:80]} ({dtype} {shape}) does not match its bytes "
                         f"({begin:,}-{end:,} of {data_bytes:,})")
    return shape


def check_against_config(folder: Path) -> None:
    """Compare the folder's tensors with its config.json where cheap: the embedding's shape against
    [vocab_size, hidden_size] and that layers 0 … num_hidden_layers - 1 are all present. Raises ModelError
    naming the mismatch; does nothing without a config or those keys."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_bytes())
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        shapes.update(safetensors_shapes(path, path.name))
    vocab, hidden, layers = config.get("vocab_size"), config.get("hidden_size"), config.get("num_hidden_layers")
    embedding = next((shape for tensor, shape in shapes.items() if tensor.endswith("embed_tokens.weight")), None)
    if embedding is not None and isinstance(vocab, int) and isinstance(hidden, int) and embedding != [vocab, hidden]:
        raise ModelError(f"the weights' embedding is {embedding} but config.json says [{vocab}, {hidden}] "
                         "(vocab_size, hidden_size): the weights are not this model's")
    found = {int(m.group(1)) for tensor in shapes if (m := _LAYER.search(tensor))}
    # Only missing layers are a fault: some models keep extra ones (a multi-token-prediction layer
    # after the last, a vision tower's own numbering).
    if found and isinstance(layers, int) and not set(range(layers)) <= found:
        raise ModelError(f"the weights hold {len(found & set(range(layers)))} of the {layers} layers config.json names "
                         "(num_hidden_layers): a shard is missing or the weights are not this model's")
