"""Where a decode step reads the held tokens from: their dequantized, rotated keys and values.

Dequantizing and rotating a whole budget of keys per layer and step was ~60 % of a CPU decode step,
so while a conversation decodes, `LayerKV` keeps them (sinks + quantized tokens) in one of these,
appends a flush to it and compacts it on eviction. Two forms, with the same methods:

- `DenseWorkspace`: the compute dtype (float32 on a CPU, 16-bit on a GPU).
- `Bf16Int8Workspace`: keys in bfloat16 and each token's value rounded to int8 with one absmax
  scale per token and head, read by torch's int8 weight-only matmul (`aten._weight_int8pack_mm`,
  the kernel torchao's int8 weight-only path uses on a CPU): 3/8 of float32's bytes. At a
  4,096-token budget a decode step is bound by reading them (6 MB per layer in float32): on this
  project's 2-core Xeon a decode step over 4k held tokens took 41 ms with a float32 workspace,
  ~33 with bfloat16 keys and values, ~31 with int8 values. Int8 keys through the same kernel
  (one call per KV head; it has no batched form) were slower in the engine than one batched
  bfloat16 product. Used where prefill attention runs in bfloat16 on a CPU (int4 weights,
  AVX-512 BF16).
- `Int8Workspace`: keys as int8 rows too, each KV head's q·kᵀ one call of the same kernel. On a
  CPU without AVX-512 BF16 a bfloat16 batched product ran 50x slower than float32 (8.9 ms per
  layer against 0.17), so keys cannot go to bfloat16 there, while a decode step reads the float32
  workspace at ~13 GB/s (two threads): 30 layers of a 4,096-token budget, 189 MB, were 14.7 ms of a
  48 ms step, int8 keys and values 9.3 ms (AMD EPYC without AVX-512). Used where int4 weights run
  without AVX-512 BF16 (`engine.models.weight_format.keeps_step_copy`).
"""

from __future__ import annotations

import torch

from engine.kvcache import key_layout

KERNEL_BLOCK_TOKENS = 16
"""`aten._weight_int8pack_mm` reads its reduction dimension (here: tokens) in blocks of 16; with
any other length it read past the operand (wrong results, or a crash; torch 2.13), so the values
are held zero-padded to a multiple of it."""


def _pad_tokens(x: torch.Tensor) -> torch.Tensor:
    """`x` `[..., n]` zero-padded to a multiple of `KERNEL_BLOCK_TOKENS` along its last dim (contiguous)."""
    extra = -x.shape[-1] % KERNEL_BLOCK_TOKENS
    return torch.nn.functional.pad(x, (0, extra)) if extra else x.contiguous()


class DenseWorkspace:
    """Rotated keys and values `[kv_heads, n, head_dim]` in one dtype, in buffers with room for the
    flushes until the next eviction (no re-allocation per flush). Keys are held transposed
    (`[kv_heads, head_dim, capacity]`): a decode step's q·kᵀ then reads them as a plain matrix
    product, ~25 % faster than through a transposed operand."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, *, room: int) -> None:
        h, n, d = keys.shape
        self._kbuf = keys.new_empty((h, d, n + room))
        self._vbuf = values.new_empty((h, n + room, d))
        self._kbuf[:, :, :n] = keys.transpose(1, 2)
        self._vbuf[:, :n] = values
        self._room = room
        self._resize(n)

    def _resize(self, n: int) -> None:
        if n > self._vbuf.shape[1]:
            h, d, held = self._vbuf.shape[0], self._vbuf.shape[2], self.n
            kbuf, vbuf = self._kbuf.new_empty((h, d, n + self._room)), self._vbuf.new_empty((h, n + self._room, d))
            kbuf[:, :, :held], vbuf[:, :held] = self._kbuf[:, :, :held], self._vbuf[:, :held]
            self._kbuf, self._vbuf = kbuf, vbuf
        self.n = n
        self.keys, self.values = self._kbuf[:, :, :n].transpose(1, 2), self._vbuf[:, :n]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append `m` tokens' rotated keys and values `[kv_heads, m, head_dim]`."""
        first = self.n
        self._resize(first + keys.shape[1])
        self._kbuf[:, :, first : self.n] = keys.transpose(1, 2)
        self._vbuf[:, first : self.n] = values

    def keep(self, slots: torch.Tensor, keys: torch.Tensor | None = None) -> None:
        """Keep `slots` `[kv_heads, k]` (ascending), in place; `keys` `[kv_heads, k, head_dim]`:
        their keys rotated anew (compact positions), else each keeps its own."""
        d = self._vbuf.shape[2]
        values = torch.gather(self._vbuf[:, : self.n], 1, slots[..., None].expand(-1, -1, d))
        if keys is None:
            keys_t = torch.gather(self._kbuf[:, :, : self.n], 2, slots[:, None, :].expand(-1, d, -1))
        else:
            keys_t = keys.transpose(1, 2)
        k = slots.shape[1]
        self._kbuf[:, :, :k], self._vbuf[:, :k] = keys_t, values
        self._resize(k)

    def attention_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) `[kv_heads, n, head_dim]` as `chunk_attention` takes them (views)."""
        return self.keys, self.values

    @property
    def nbytes(self) -> int:
        return self._kbuf.nbytes + self._vbuf.nbytes


def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` `[..., d]` float as int8 codes `[..., d]` and a float32 scale `[...]` per row:
    x ≈ codes · scale with scale = max|x| / 127 (absmax, symmetric)."""
    scale = x.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return torch.round(x / scale[..., None]).to(torch.int8), scale


class Bf16Int8Workspace:
    """Rotated keys in bfloat16 and values as int8 rows with a float32 scale per token and head
    (module docstring): keys for a batched bfloat16 q·kᵀ, held one row per token `[kv_heads, n,
    head_dim]` and read through a transposed view, or transposed `[kv_heads, head_dim, n]`,
    whichever this CPU runs faster for the model's shape (`engine.kvcache.key_layout`; `group`:
    query heads per KV head); values transposed `[kv_heads, head_dim, n']` (n' = n zero-padded to
    `KERNEL_BLOCK_TOKENS`) for the int8 kernel, whose products the scales enter by weighting the
    attention probabilities.
    Every tensor is exactly as long as the tokens it holds (torch's CPU bfloat16 batched matmul
    copies an operand that is a view into a larger buffer, and the int8 kernel takes contiguous
    operands only), so each flush and eviction re-allocates it. Each token is rounded on its own:
    a workspace appended to and compacted holds what one built at once holds.

    Passed to `chunk_attention` as its own part (`attention_parts`): `logits(q)` and
    `weighted_values(p)` for a decode step, `dense()` for a longer chunk.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, group: int = 1) -> None:
        self._group = group
        self._hold_keys(keys)
        codes, scale = int8_rows(values.float())
        self._hold_values(_pad_tokens(codes.transpose(1, 2)), scale)
        # Unit per-output scales for the kernel (the real ones weight the probabilities instead).
        self._ones = torch.ones(values.shape[2], dtype=torch.bfloat16, device=values.device)

    @property
    def n(self) -> int:
        return self._value_scale.shape[1]

    @property
    def shape(self) -> tuple[int, int, int]:
        """`(kv_heads, n, head_dim)`, as a keys part's shape."""
        return (self._value_scale.shape[0], self.n, self._values_t.shape[1])

    @property
    def device(self) -> torch.device:
        return self._value_scale.device

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append `m` tokens' rotated keys and values `[kv_heads, m, head_dim]` (float)."""
        held = self.n
        self._append_keys(keys)
        codes, scale = int8_rows(values.float())
        self._hold_values(_pad_tokens(torch.cat((self._values_t[..., :held], codes.transpose(1, 2)), 2)),
                          torch.cat((self._value_scale, scale), 1))

    def keep(self, slots: torch.Tensor, keys: torch.Tensor | None = None) -> None:
        """As `DenseWorkspace.keep`."""
        if keys is None:
            self._keep_keys(slots)
        else:
            self._hold_keys(keys)
        columns = slots[:, None, :].expand(-1, self._values_t.shape[1], -1)
        self._hold_values(_pad_tokens(torch.gather(self._values_t, 2, columns)), torch.gather(self._value_scale, 1, slots))

    def attention_parts(self) -> tuple[Bf16Int8Workspace, Bf16Int8Workspace]:
        return self, self

    def logits(self, q: torch.Tensor) -> torch.Tensor:
        """q·kᵀ `[kv_heads, rows, n]` (bfloat16) for queries `q` `[kv_heads, rows, head_dim]`."""
        return torch.bmm(q.to(torch.bfloat16), self._keys if self._transposed else self._keys.transpose(1, 2))

    def weighted_values(self, probs: torch.Tensor) -> torch.Tensor:
        """p·v `[kv_heads, rows, head_dim]` (bfloat16) for probabilities `probs` `[kv_heads, rows, n]`."""
        weights, pairs = self._kernel_operands(probs.shape[1])
        # The product rounds to bfloat16 as it is stored, as `.to` would; the padding stays zero.
        torch.mul(probs, self._value_scale[:, None], out=weights[..., : self.n])
        return torch.stack([torch.ops.aten._weight_int8pack_mm(w, v, self._ones) for w, v in pairs])

    def _hold_values(self, values_t: torch.Tensor, scale: torch.Tensor) -> None:
        """Hold value codes `[kv_heads, head_dim, n']` (padded) and their scales `[kv_heads, n]`."""
        self._values_t, self._value_scale = values_t, scale
        self._operands: dict[int, tuple] = {}

    def _kernel_operands(self, rows: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """A zeroed bfloat16 buffer `[kv_heads, rows, n']` for the weighted probabilities and each KV
        head's (buffer rows, value codes) pair: made once per held set and row count (a decode step
        calls this once per layer; drafts' chunks have a few row counts; a flush or eviction holds
        new values and drops them)."""
        if rows not in self._operands:
            h, padded = self._values_t.shape[0], self._values_t.shape[2]
            weights = torch.zeros((h, rows, padded), dtype=torch.bfloat16, device=self.device)
            self._operands[rows] = (weights, [(weights[i], self._values_t[i]) for i in range(h)])
        return self._operands[rows]

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) `[kv_heads, n, head_dim]` float32, decoded (for a chunk too long for a step)."""
        values = self._values_t[..., : self.n].transpose(1, 2).float() * self._value_scale[..., None]
        return self._dense_keys(), values

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self._key_tensors(), self._values_t, self._value_scale))

    # The keys: bfloat16, in `key_layout`'s layout. `Int8Workspace` holds them its own way through these (it never
    # times the layouts: its keys are int8 rows).
    def _hold_keys(self, keys: torch.Tensor) -> None:
        """Hold rotated keys `[kv_heads, n, head_dim]` (float), replacing any held."""
        self._transposed = key_layout.transposed_keys(keys.shape[0], self._group, keys.shape[2], keys.device)
        self._keys = self._as_held(keys).contiguous()

    def _as_held(self, keys: torch.Tensor) -> torch.Tensor:
        keys = keys.to(torch.bfloat16)
        return keys.transpose(1, 2) if self._transposed else keys

    def _append_keys(self, keys: torch.Tensor) -> None:
        self._keys = torch.cat((self._keys, self._as_held(keys)), 2 if self._transposed else 1)

    def _keep_keys(self, slots: torch.Tensor) -> None:
        if self._transposed:
            self._keys = torch.gather(self._keys, 2, slots[:, None, :].expand(-1, self._keys.shape[1], -1))
        else:
            self._keys = torch.gather(self._keys, 1, slots[..., None].expand(-1, -1, self._keys.shape[2]))

    def _dense_keys(self) -> torch.Tensor:
        return (self._keys.transpose(1, 2) if self._transposed else self._keys).float()

    def _key_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self._keys,)


class Int8Workspace(Bf16Int8Workspace):
    """`Bf16Int8Workspace` with the keys as int8 rows too, a float32 absmax scale per token and
    head (module docstring): keys `[kv_heads, n, head_dim]` int8 (the kernel's weight layout: one
    row per token, so q·kᵀ needs no transpose and its scales enter the logits afterwards), values
    as in `Bf16Int8Workspace`. Each token is rounded on its own, as there."""

    def logits(self, q: torch.Tensor) -> torch.Tensor:
        """q·kᵀ `[kv_heads, rows, n]` float32 for queries `q` `[kv_heads, rows, head_dim]` (the kernel
        sums in float32 and rounds to bfloat16; the key scales multiply afterwards, in float32)."""
        qb = q.to(torch.bfloat16)
        ones = self._key_scale.new_ones(self.n, dtype=torch.bfloat16)
        products = torch.stack([torch.ops.aten._weight_int8pack_mm(qb[h], self._key_codes[h], ones)
                                for h in range(qb.shape[0])])
        return products.float() * self._key_scale[:, None]

    def _hold_keys(self, keys: torch.Tensor) -> None:
        self._key_codes, self._key_scale = int8_rows(keys.float())

    def _append_keys(self, keys: torch.Tensor) -> None:
        codes, scale = int8_rows(keys.float())
        self._key_codes = torch.cat((self._key_codes, codes), 1)
        self._key_scale = torch.cat((self._key_scale, scale), 1)

    def _keep_keys(self, slots: torch.Tensor) -> None:
        self._key_codes = torch.gather(self._key_codes, 1, slots[..., None].expand(-1, -1, self._key_codes.shape[2]))
        self._key_scale = torch.gather(self._key_scale, 1, slots)

    def _dense_keys(self) -> torch.Tensor:
        return self._key_codes.float() * self._key_scale[..., None]

    def _key_tensors(self) -> tuple[torch.Tensor, ...]:
        return (self._key_codes, self._key_scale)
