"""The archive: every token's K/V of a document, group-quantized on disk, with per-block key bounds.

The compressed cache keeps ~3 % of a book, chosen before any question exists. The archive keeps
the rest so that a question can recall what it needs (`engine.kvcache.recall`). It is written while
the document is prefilled, one chunk at a time straight into its final place in a preallocated
file (nothing but the chunk being written is held in memory), and read memory-mapped.

File format: safetensors (https://github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then
the raw bytes. The writer lays the header out itself, because the tensors are written piece by
piece during a prefill of unknown duration instead of from memory at the end; any safetensors
reader (`safetensors.safe_open`) reads the result. Tensors, per layer `l` (n = document tokens,
H = KV heads, D = head dim, b = ceil(n / block_tokens) blocks):

    layer{l}.k.codes / .k.scale / .k.zero   [n, H, ...]  keys before RoPE, `KVFormat(bits, group)`
    layer{l}.v.codes / .v.scale / .v.zero   [n, H, ...]  values, same format
    layer{l}.key_min / layer{l}.key_max     [b, H, D]    float16, per-channel min / max of the keys
                                                         *after* RoPE at their original positions
    digests.blocks                          [L, b, 2, 16] uint8: BLAKE2b-128 of each block's key
                                                         fields (0) and value fields (1), per layer
    digests.bounds                          [L, 16]      uint8: BLAKE2b-128 of a layer's key bounds

Token-major rows keep one block of all heads of a layer contiguous (a recalled block is one small
read). The bounds are Quest's block summary (Tang et al. 2024, arXiv 2406.10774): for a query q,
Σ_c max(q_c·min_c, q_c·max_c) bounds q·k for every key k of the block. They are rounded outward
to float16, so the bound holds for what is stored. Metadata (`__metadata__`) names the format,
bits, group size, block size, token count and shape; `Archive.open` checks it.

Integrity: the writer hashes each block as it writes it (the chunk is in memory then) and stores the
digests in the file; its *digest* (`ArchiveWriter.finish`) is the SHA-256 of the header and the
digest tables, a few MiB for a book. Opening checks that digest only; `read` and `bounds` check each
block (or a layer's bounds) against its table entry the first time they touch it. A book's archive
(about 1 GiB) is thus never read whole to be opened, and a damaged block is still found before its
bytes are used.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.kvcache.attention import RotaryTable, rotate
from engine.kvcache.quant import KVFormat, round_fp16
from engine.kvcache.sizes import DIGEST_BYTES

ARCHIVE_FORMAT = "halaman-archive-2"  # 2: per-block digests
ARCHIVE_BITS = (2, 4)
_DTYPES = {torch.uint8: ("U8", np.uint8), torch.float16: ("F16", np.float16)}


def _digest() -> hashlib.blake2b:
    """BLAKE2b-128: fast, and 1 MiB of digests per 32k blocks is ample against damage (not an adversary's
    choice of bytes: the file's owner could rewrite the tables too)."""
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


class ArchiveError(ValueError):
    """An archive file is missing, damaged (a digest differs) or made for another model or format."""


@dataclass(frozen=True)
class ArchiveLayout:
    """Shape of one document's archive: `n_tokens` tokens of `num_layers` × `kv_heads` heads."""

    num_layers: int
    kv_heads: int
    head_dim: int
    n_tokens: int
    block_tokens: int
    bits: int
    group_size: int

    @property
    def fmt(self) -> KVFormat:
        return KVFormat(bits=self.bits, group_size=self.group_size)

    @property
    def n_blocks(self) -> int:
        return -(-self.n_tokens // self.block_tokens)

    def validate(self) -> None:
        """Raise ArchiveError for bits outside (2, 4) or a group size that does not divide head_dim."""
        if self.bits not in ARCHIVE_BITS:
            raise ArchiveError(f"archive bits must be one of {ARCHIVE_BITS}, got {self.bits}")
        if self.block_tokens < 1 or self.n_tokens < 1:
            raise ArchiveError("archive needs at least one token and one token per block")
        try:
            self.fmt.validate(self.head_dim)
        except ValueError as error:
            raise ArchiveError(str(error)) from None

    def tensor_specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """name -> (shape, dtype) of every tensor in the file, in file order."""
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        fields = self.fmt.field_specs(self.head_dim)
        for layer in range(self.num_layers):
            for kv in "kv":
                for name, (trailing, dtype) in fields.items():
                    specs[f"layer{layer}.{kv}.{name}"] = ((self.n_tokens, self.kv_heads, *trailing), dtype)
            for bound in ("key_min", "key_max"):
                specs[f"layer{layer}.{bound}"] = ((self.n_blocks, self.kv_heads, self.head_dim), torch.float16)
        specs["digests.blocks"] = ((self.num_layers, self.n_blocks, 2, DIGEST_BYTES), torch.uint8)
        specs["digests.bounds"] = ((self.num_layers, DIGEST_BYTES), torch.uint8)
        return specs

    def field_names(self, layer: int, kind: str) -> list[str]:
        """Tensor names of `layer`'s keys (`kind` "k") or values ("v"), in the order a block digest hashes them."""
        return [f"layer{layer}.{kind}.{name}" for name in self.fmt.field_specs(self.head_dim)]

    @property
    def file_bytes(self) -> int:
        """The archive file's size in bytes, header included."""
        return _end(_header(self)[1])

    def metadata(self) -> dict[str, str]:
        return {"format": ARCHIVE_FORMAT, "layout": json.dumps(self.__dict__, sort_keys=True)}


def _header(layout: ArchiveLayout) -> tuple[bytes, dict[str, tuple[int, tuple[int, ...], torch.dtype]]]:
    """safetensors header bytes (length prefix included) and name -> (absolute offset, shape, dtype)."""
    entries: dict = {}
    places = {}
    offset = 0
    for name, (shape, dtype) in layout.tensor_specs().items():
        size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        entries[name] = {"dtype": _DTYPES[dtype][0], "shape": list(shape), "data_offsets": [offset, offset + size]}
        places[name] = (offset, shape, dtype)
        offset += size
    entries["__metadata__"] = layout.metadata()
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)  # data starts 8-byte aligned
    start = 8 + len(header)
    return struct.pack("<Q", len(header)) + header, {n: (start + o, s, d) for n, (o, s, d) in places.items()}


class ArchiveWriter:
    """Writes one document's archive while it is prefilled, chunk by chunk, into `path`.

    `append(layer, start, key, value)` takes the chunk's keys and values before RoPE,
    `[kv_heads, chunk, head_dim]`, whose first token is stream position `start`; `start` must be a
    multiple of `block_tokens` (prefill chunks are). The file is created at its full size at once
    (its blocks reserved where the OS can), so a full disk fails at the start, not after an hour.
    Each block is hashed as it is written (see the module docstring). `finish()` checks every
    token was written, writes the digest tables, fsyncs and returns (digest hex, size in bytes);
    `abort()` deletes the file. Raises OSError from the file system, ArchiveError for a bad layout.

    A read stopped half-way can go on in another process (`engine.read_checkpoint`): between two
    chunks `flush()` makes the file durable and `digests()` says what it holds; `close()` keeps the
    file, and `ArchiveWriter.resume` reopens it, hashing its written part again.
    """

    def __init__(self, path: Path, layout: ArchiveLayout, rope: RotaryTable) -> None:
        self._setup(path, layout, rope)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(self._fd, self._header)
            if hasattr(os, "posix_fallocate"):  # reserve the blocks: a full disk fails here, not mid-read
                os.posix_fallocate(self._fd, 0, self.size_bytes)
            else:
                os.ftruncate(self._fd, self.size_bytes)
        except OSError:
            self.abort()
            raise

    def _setup(self, path: Path, layout: ArchiveLayout, rope: RotaryTable) -> None:
        """State of a writer that has written nothing yet, its file not open."""
        layout.validate()
        self.path = Path(path)
        self.layout = layout
        self.rope = rope
        self._header, self._places = _header(layout)
        self._fd = -1
        self._written = [0] * layout.num_layers
        self._block_digests = np.zeros(layout.tensor_specs()["digests.blocks"][0], dtype=np.uint8)
        # The bounds are hashed as they arrive, in order: one running hash per layer and bound.
        self._bound_hashes = [(_digest(), _digest()) for _ in range(layout.num_layers)]

    @property
    def size_bytes(self) -> int:
        """The file's size, the same from its creation on (it is preallocated)."""
        return _end(self._places)

    @property
    def written_tokens(self) -> int:
        """Tokens written in every layer (between two prefill chunks, all layers hold the same)."""
        return min(self._written)

    def digests(self) -> dict[str, torch.Tensor]:
        """The digests of what is written so far, for a checkpoint of the read (`resume` checks the
        file against them): "blocks" `[L, b, 2, 16]` uint8, the block digests of the b blocks of
        `written_tokens`; "bounds" `[L, 2, 16]` uint8, the running hashes of each layer's key_min and
        key_max so far (their digests: a hash object cannot be saved). Raises ArchiveError when the
        layers hold different token counts or a partial block (a read stopped inside a chunk)."""
        written = self.written_tokens
        if any(n != written for n in self._written) or written % self.layout.block_tokens:
            raise ArchiveError("the archive is not at a chunk boundary: no checkpoint can describe it")
        # A view, not a copy (this runs after every chunk): the blocks before `written` never change again.
        blocks = self._block_digests[:, : written // self.layout.block_tokens]
        return {"blocks": torch.from_numpy(blocks), "bounds": torch.from_numpy(self._bound_digests())}

    def _bound_digests(self) -> np.ndarray:
        """`[L, 2, 16]` uint8: the digests of the running key_min / key_max hashes now."""
        return np.array([[np.frombuffer(h.digest(), dtype=np.uint8) for h in pair] for pair in self._bound_hashes],
                        dtype=np.uint8)

    @classmethod
    def resume(cls, path: Path, layout: ArchiveLayout, rope: RotaryTable, written_tokens: int,
               digests: dict[str, torch.Tensor]) -> ArchiveWriter:
        """Go on writing the archive at `path`, of which the first `written_tokens` tokens of every
        layer were written (a read stopped there and saved a checkpoint with `digests()`).

        The running hashes cannot be saved, so the written part is read back and hashed again
        (every block and the bounds so far: about the share of the file written, at the hash's
        speed), and checked against `digests`: `finish` then gives the digest a read in one go gives.
        Raises ArchiveError when the file does not fit `layout`, `written_tokens` is not a whole
        number of blocks inside the document, or the written part differs from `digests` (damaged);
        OSError from the file system.
        """
        writer = object.__new__(cls)
        writer._setup(path, layout, rope)
        lay, blocks = layout, written_tokens // layout.block_tokens
        if written_tokens % lay.block_tokens or not 0 < written_tokens < lay.n_tokens:
            raise ArchiveError(f"cannot resume an archive at token {written_tokens} (blocks of {lay.block_tokens})")
        expected = {"blocks": (lay.num_layers, blocks, 2, DIGEST_BYTES), "bounds": (lay.num_layers, 2, DIGEST_BYTES)}
        if {name: tuple(digests[name].shape) for name in expected if name in digests} != expected:
            raise ArchiveError("the checkpoint's archive digests do not fit the archive")
        with open(writer.path, "rb") as handle:
            if handle.read(len(writer._header)) != writer._header or os.fstat(handle.fileno()).st_size != writer.size_bytes:
                raise ArchiveError("the archive being resumed was made for another layout, or is truncated")
        data = np.memmap(writer.path, dtype=np.uint8, mode="r")
        for layer in range(lay.num_layers):
            for i, kind in enumerate("kv"):
                views = [_view(data, writer._places[name]) for name in lay.field_names(layer, kind)]
                for block in range(blocks):
                    digest = _digest()
                    for view in views:
                        digest.update(view[block * lay.block_tokens:(block + 1) * lay.block_tokens])
                    writer._block_digests[layer, block, i] = np.frombuffer(digest.digest(), dtype=np.uint8)
            # The bounds were hashed chunk by chunk in block order: one update over their rows is the same hash.
            for hashed, name in zip(writer._bound_hashes[layer], ("key_min", "key_max"), strict=True):
                hashed.update(_view(data, writer._places[f"layer{layer}.{name}"])[:blocks])
        if not (np.array_equal(writer._block_digests[:, :blocks], digests["blocks"].numpy())
                and np.array_equal(writer._bound_digests(), digests["bounds"].numpy())):
            raise ArchiveError("the archive being resumed differs from its checkpoint's digests (damaged file)")
        writer._written = [written_tokens] * lay.num_layers
        writer._fd = os.open(writer.path, os.O_RDWR)
        return writer

    def append(self, layer: int, start: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Write the chunk `[kv_heads, chunk, head_dim]` (keys before RoPE) of `layer` at `start`."""
        lay = self.layout
        chunk = key.shape[1]
        if start % lay.block_tokens or start != self._written[layer] or start + chunk > lay.n_tokens:
            raise ArchiveError(f"archive chunk at {start} (+{chunk}) out of order for layer {layer}")
        # Keys and values quantized in one call (the groups are per token: the same codes as two calls;
        # this runs 30 times per chunk of a read, so its op count shows in the read's speed).
        fields = lay.fmt.encode(torch.stack((key, value)))
        first_block = start // lay.block_tokens
        n_blocks = -(-chunk // lay.block_tokens)
        for i, kv in enumerate("kv"):
            rows = [self._put(f"layer{layer}.{kv}.{name}", start, tensor[i].transpose(0, 1))
                    for name, tensor in fields.items()]
            for b in range(n_blocks):
                digest = _digest()
                for data in rows:  # [chunk, H, ...] C-contiguous: a block's rows are one slice
                    digest.update(data[b * lay.block_tokens:(b + 1) * lay.block_tokens])
                self._block_digests[layer, first_block + b, i] = np.frombuffer(digest.digest(), dtype=np.uint8)
        # Block bounds of the keys rotated at their original positions (what scoring compares with).
        rotated = rotate(key.float(), self.rope.joint(rows=slice(start, start + chunk)))  # [H, chunk, D]
        pad = n_blocks * lay.block_tokens - chunk
        low = torch.nn.functional.pad(rotated, (0, 0, 0, pad), value=float("inf")) if pad else rotated
        high = torch.nn.functional.pad(rotated, (0, 0, 0, pad), value=float("-inf")) if pad else rotated
        shape = (lay.kv_heads, n_blocks, lay.block_tokens, lay.head_dim)
        key_min = round_fp16(low.view(shape).amin(dim=2), toward=float("-inf"))
        key_max = round_fp16(high.view(shape).amax(dim=2), toward=float("inf"))
        for hashed, name, bound in zip(self._bound_hashes[layer], ("key_min", "key_max"), (key_min, key_max), strict=True):
            hashed.update(self._put(f"layer{layer}.{name}", first_block, bound.transpose(0, 1)))
        self._written[layer] = start + chunk

    def _put(self, name: str, first_row: int, rows: torch.Tensor) -> np.ndarray:
        """Write `rows` at row `first_row` of tensor `name`; returns the bytes written as an array."""
        offset, shape, dtype = self._places[name]
        data = rows.detach().to("cpu", dtype).contiguous().numpy()  # written from its buffer, no bytes copy
        os.pwrite(self._fd, data, offset + first_row * _row_bytes(shape, dtype))
        return data

    def finish(self) -> tuple[str, int]:
        """Write the digest tables and close the file; returns (the archive's digest: SHA-256 hex of
        the header and the digest tables, size in bytes). Nothing is read back.

        Raises ArchiveError if some layer did not receive every token (the prefill stopped early).
        """
        if any(n != self.layout.n_tokens for n in self._written):
            self.abort()
            raise ArchiveError("archive incomplete: the prefill did not reach the end of the document")
        bounds = np.stack([np.frombuffer(_combine(low, high), dtype=np.uint8) for low, high in self._bound_hashes])
        os.pwrite(self._fd, self._block_digests, self._places["digests.blocks"][0])
        os.pwrite(self._fd, bounds, self._places["digests.bounds"][0])
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        return archive_digest(self._header, self._block_digests, bounds), self.path.stat().st_size

    def flush(self) -> None:
        """Make what is written durable (fsync), before a checkpoint says how far it goes. Raises OSError."""
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file and keep it: a checkpoint of the read refers to it (`resume` goes on). Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def abort(self) -> None:
        """Close and delete the file (a cancelled or failed prefill)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


def _row_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(np.prod(shape[1:])) * torch.empty((), dtype=dtype).element_size()


def _end(places: dict) -> int:
    """File size: where the last tensor ends."""
    return max(offset + shape[0] * _row_bytes(shape, dtype) for offset, shape, dtype in places.values())


def _view(data: np.ndarray, place: tuple[int, tuple[int, ...], torch.dtype]) -> np.ndarray:
    """The tensor at `place` (absolute offset, shape, dtype) of the mapped file `data`, as an array."""
    offset, shape, dtype = place
    size = shape[0] * _row_bytes(shape, dtype)
    return data[offset : offset + size].view(_DTYPES[dtype][1]).reshape(shape)


def _combine(key_min: hashlib.blake2b, key_max: hashlib.blake2b) -> bytes:
    """A layer's bounds digest from the running hashes of its key_min and key_max tensors."""
    digest = _digest()
    digest.update(key_min.digest() + key_max.digest())
    return digest.digest()


def archive_digest(header: bytes, block_digests: np.ndarray, bound_digests: np.ndarray) -> str:
    """SHA-256 hex of an archive's header bytes (length prefix included) and its digest tables:
    what the prefix store keeps and `Archive.open` checks."""
    digest = hashlib.sha256(header)
    digest.update(np.ascontiguousarray(block_digests))
    digest.update(np.ascontiguousarray(bound_digests))
    return digest.hexdigest()


class Archive:
    """A finished archive, memory-mapped read-only. Open with `Archive.open`.

    `bounds(layer)` -> (key_min, key_max) float32 `[n_blocks, kv_heads, head_dim]`;
    `read(layer, tokens)` -> the K/V fields of `tokens` `[kv_heads, m]` (token indices per head) as
    `{"k.codes": [kv_heads, m, ...], ...}`; `decode` turns those into K and V tensors. Both check
    what they touch against the digest tables once per opening and raise ArchiveError for a
    damaged block. `bytes_hashed` counts the bytes hashed so far (opening: the header and the tables).
    """

    def __init__(self, path: Path, layout: ArchiveLayout, places: dict, data: np.memmap, bytes_hashed: int) -> None:
        self.path = path
        self.layout = layout
        self._places = places
        self._data = data
        self.bytes_hashed = bytes_hashed
        self._block_digests = self._view("digests.blocks")   # [L, b, 2, 16]
        self._bound_digests = self._view("digests.bounds")   # [L, 16]
        self._checked = np.zeros(self._block_digests.shape[:3], dtype=bool)  # [L, b, 2]: blocks hashed already
        self._bounds_checked = np.zeros(layout.num_layers, dtype=bool)

    @classmethod
    def open(cls, path: Path, *, sha256: str | None = None, expect: ArchiveLayout | None = None) -> Archive:
        """Map `path`; check its digest (`ArchiveWriter.finish`) against `sha256` (if given) and its
        layout against `expect` (if given). Reads the header and the digest tables, never the whole
        file. Raises ArchiveError naming what is wrong: missing, damaged, other format.
        """
        path = Path(path)
        try:
            with open(path, "rb") as handle:
                prefix = handle.read(8)
                (header_len,) = struct.unpack("<Q", prefix)
                header_bytes = prefix + handle.read(header_len)
            header = json.loads(header_bytes[8:])
            meta = header.get("__metadata__") or {}
            if meta.get("format") != ARCHIVE_FORMAT:
                raise ArchiveError(f"archive format {meta.get('format')!r}, expected {ARCHIVE_FORMAT}")
            layout = ArchiveLayout(**json.loads(meta["layout"]))
            data = np.memmap(path, dtype=np.uint8, mode="r")
        except ArchiveError:
            raise
        except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
            raise ArchiveError(f"archive unreadable ({type(error).__name__}: {error})") from None
        if expect is not None and layout != expect:
            raise ArchiveError("archive was made for another model shape, length or format")
        expected_header, places = _header(layout)
        if json.loads(expected_header[8:]) != header:
            raise ArchiveError("archive header does not match its layout")
        if data.shape[0] != _end(places):
            raise ArchiveError(f"archive has {data.shape[0]} bytes, its header needs {_end(places)}")
        archive = cls(path, layout, places, data, bytes_hashed=0)
        if sha256 is not None:
            tables = (archive._block_digests, archive._bound_digests)
            archive.bytes_hashed = len(header_bytes) + sum(t.nbytes for t in tables)
            if archive_digest(header_bytes, *tables) != sha256:
                raise ArchiveError("archive digest mismatch (damaged file)")
        return archive

    def _view(self, name: str) -> np.ndarray:
        return _view(self._data, self._places[name])

    def _check_blocks(self, layer: int, blocks: np.ndarray, kinds: str) -> None:
        """Hash `layer`'s `blocks` (block indices) for `kinds` not checked yet; ArchiveError on a mismatch."""
        lay = self.layout
        for i, kv in enumerate("kv"):
            if kv not in kinds:
                continue
            todo = blocks[~self._checked[layer, blocks, i]]
            if not len(todo):
                continue
            views = [self._view(name) for name in lay.field_names(layer, kv)]
            for block in todo.tolist():
                digest = _digest()
                for view in views:
                    rows = view[block * lay.block_tokens:(block + 1) * lay.block_tokens]
                    digest.update(rows)
                    self.bytes_hashed += rows.nbytes
                if digest.digest() != self._block_digests[layer, block, i].tobytes():
                    raise ArchiveError(f"archive block {block} of layer {layer} is damaged ({'keys' if kv == 'k' else 'values'} "
                                       "differ from their digest)")
            self._checked[layer, todo, i] = True

    def bounds(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_min, key_max) of `layer` as float32 `[n_blocks, kv_heads, head_dim]`. Raises
        ArchiveError when they differ from their digest."""
        views = [self._view(f"layer{layer}.{b}") for b in ("key_min", "key_max")]
        if not self._bounds_checked[layer]:
            hashes = []
            for view in views:
                hashed = _digest()
                hashed.update(view)
                hashes.append(hashed)
                self.bytes_hashed += view.nbytes
            if _combine(*hashes) != self._bound_digests[layer].tobytes():
                raise ArchiveError(f"archive key bounds of layer {layer} are damaged (they differ from their digest)")
            self._bounds_checked[layer] = True
        return tuple(torch.from_numpy(view.astype(np.float32)) for view in views)

    def read(self, layer: int, tokens: torch.Tensor, kinds: str = "kv") -> dict[str, torch.Tensor]:
        """Fields of `tokens` `[kv_heads, m]` (token index per head): name -> `[kv_heads, m, ...]`,
        for keys ("k.codes", ...) and / or values as `kinds` says ("k", "v" or "kv"). Raises
        ArchiveError when a block they lie in differs from its digest."""
        heads = torch.arange(self.layout.kv_heads)[:, None].expand_as(tokens).numpy()
        rows = tokens.cpu().numpy()
        self._check_blocks(layer, np.unique(rows // self.layout.block_tokens), kinds)
        out = {}
        for kv in kinds:
            for name in self.layout.fmt.field_specs(self.layout.head_dim):
                view = self._view(f"layer{layer}.{kv}.{name}")
                out[f"{kv}.{name}"] = torch.from_numpy(np.ascontiguousarray(view[rows, heads]))
        return out

    def decode_one(self, fields: dict[str, torch.Tensor], kind: str, dtype: torch.dtype) -> torch.Tensor:
        """Keys (before RoPE, `kind` "k") or values ("v") `[kv_heads, m, head_dim]` in `dtype`."""
        prefix = kind + "."
        return self.layout.fmt.decode({n[len(prefix):]: t for n, t in fields.items() if n.startswith(prefix)}, dtype)

    def decode(self, fields: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys before RoPE, values), each `[kv_heads, m, head_dim]` in `dtype`, from `read` output."""
        return self.decode_one(fields, "k", dtype), self.decode_one(fields, "v", dtype)

    def close(self) -> None:
        """Drop the mapping (the file stays)."""
        self._data = None
