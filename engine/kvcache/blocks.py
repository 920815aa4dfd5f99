"""Paged storage for one layer's quantized tokens: a block pool and a per-head block table.

PagedAttention (Kwon et al. 2023, arXiv 2309.06180): token slots live in fixed-size blocks taken
from a pool; a block table maps each KV head's logical slots to physical blocks. The pool grows by
the blocks that arriving tokens need (capped at `max_blocks`; nothing is reserved for the model's
maximum context) and blocks freed by eviction go back to its free list for the next tokens.

Every KV head of a layer holds the same number of tokens (the budget is per head), but *which*
tokens differ per head (H2O selects per KV head), so the table is `[kv_heads, blocks_per_head]`.
"""

from __future__ import annotations

import torch

FieldSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]


class BlockPool:
    """Physical blocks of `block_tokens` token slots for the fields in `specs`.

    `storage[name]` is `[capacity_blocks, block_tokens, *trailing_shape]`. Raises RuntimeError if
    more than `max_blocks` blocks are asked for (the caller's budget arithmetic is wrong).
    """

    def __init__(self, specs: FieldSpecs, *, block_tokens: int, max_blocks: int, device: torch.device) -> None:
        self.specs = specs
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self.device = device
        self.storage = {
            name: torch.empty((0, block_tokens, *shape), dtype=dtype, device=device)
            for name, (shape, dtype) in specs.items()
        }
        self.free: list[int] = []
        # True while `storage`'s tensors may be another pool's too (`fork`): copied before a write.
        self.shared = False

    def fork(self) -> BlockPool:
        """A pool with this one's blocks that shares their storage until either pool writes to it
        (copy-on-write: `writable`); each keeps its own free list."""
        twin = object.__new__(BlockPool)
        twin.__dict__.update(self.__dict__)
        twin.storage, twin.free = dict(self.storage), list(self.free)
        self.shared = twin.shared = True
        return twin

    def writable(self) -> dict[str, torch.Tensor]:
        """`storage`, copied first if it may be shared, so that writes reach this pool only."""
        if self.shared:
            self.storage = {name: t.clone() for name, t in self.storage.items()}
            self.shared = False
        return self.storage

    @property
    def capacity_blocks(self) -> int:
        return next(iter(self.storage.values())).shape[0]

    def allocate(self, count: int) -> list[int]:
        """Take `count` blocks from the free list, growing the storage if it runs short."""
        if count > len(self.free):
            self._grow(count - len(self.free))
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def release(self, block_ids: list[int]) -> None:
        """Return blocks to the free list (their contents are left as garbage)."""
        self.free.extend(block_ids)
        # Lowest ids first keeps the used part of the storage compact.
        self.free.sort()

    def _grow(self, missing: int) -> None:
        # Grow by exactly what is missing: after the first chunks, eviction frees as many blocks
        # as the next chunk needs, so the pool settles at budget + one chunk without slack.
        old = self.capacity_blocks
        new = old + missing
        if new > self.max_blocks:
            raise RuntimeError(f"block pool exhausted: {old} blocks held, {missing} more needed, cap {self.max_blocks}")
        for name, (shape, dtype) in self.specs.items():
            extra = torch.empty((new - old, self.block_tokens, *shape), dtype=dtype, device=self.device)
            self.storage[name] = torch.cat((self.storage[name], extra))
        self.shared = False  # the concatenation is a new tensor
        self.free.extend(range(old, new))

    def nbytes(self) -> int:
        """Bytes held by the storage tensors (used and free blocks)."""
        return sum(t.nbytes for t in self.storage.values())

    def bytes_per_block(self) -> int:
        """Bytes one block holds across all fields."""
        return sum(self.block_tokens * torch.empty(shape, dtype=dtype).nbytes for shape, dtype in self.specs.values())


class PagedTokens:
    """The quantized tokens of one layer: a `BlockPool` plus a block table `[kv_heads, blocks]`.

    Logical slot `s` of head `h` lives in block `table[h, s // block_tokens]` at offset
    `s % block_tokens`. `n_tokens` slots are valid per head. Tokens are kept in arrival order.
    """

    def __init__(self, specs: FieldSpecs, *, kv_heads: int, block_tokens: int, max_tokens: int, device: torch.device) -> None:
        blocks_per_head = -(-max_tokens // block_tokens)
        self.kv_heads = kv_heads
        self.pool = BlockPool(specs, block_tokens=block_tokens, max_blocks=kv_heads * blocks_per_head, device=device)
        self.table = torch.empty((kv_heads, 0), dtype=torch.long, device=device)
        self.n_tokens = 0

    @property
    def block_tokens(self) -> int:
        return self.pool.block_tokens

    def gather(self, name: str, start: int = 0) -> torch.Tensor:
        """Field `name` of the valid slots from `start` on: `[kv_heads, n_tokens - start, *trailing_shape]`
        (only the blocks holding them are read)."""
        first = start // self.block_tokens
        data = self.pool.storage[name][self.table[:, first:]]  # [H, blocks, block_tokens, ...]
        return data.flatten(1, 2)[:, start - first * self.block_tokens : self.n_tokens - first * self.block_tokens]

    def append(self, fields: dict[str, torch.Tensor]) -> None:
        """Append `m` tokens per head; each field is `[kv_heads, m, *trailing_shape]`."""
        m = next(iter(fields.values())).shape[1]
        if m == 0:
            return
        self._ensure_blocks(self.n_tokens + m)
        self._write(self.n_tokens, fields)
        self.n_tokens += m

    def keep(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keep only `slots` `[kv_heads, k]` (ascending per head); free the blocks left empty.
        Returns the kept tokens' fields, `[kv_heads, k, *trailing_shape]` each (what `gather`
        would now return)."""
        k = slots.shape[1]
        # Read only the kept slots, each field's storage seen as one row per physical slot.
        rows = self._rows(slots)
        kept = {name: _slot_rows(t)[rows] for name, t in self.pool.storage.items()}
        needed = -(-k // self.block_tokens)
        surplus = self.table[:, needed:]
        self.table = self.table[:, :needed]
        self.pool.release(surplus.flatten().tolist())
        self.n_tokens = 0
        if k:
            self._write(0, kept)
        self.n_tokens = k
        return kept

    def _rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Physical rows (block · block_tokens + offset) of logical `slots` `[kv_heads, k]`."""
        return torch.gather(self.table, 1, slots // self.block_tokens) * self.block_tokens + slots % self.block_tokens

    def load(self, storage: dict[str, torch.Tensor], table: torch.Tensor, n_tokens: int) -> None:
        """Replace the contents with persisted `storage` (`[blocks, block_tokens, ...]`) and `table`.

        Raises ValueError when the shapes, dtypes or block ids do not fit this store (a file made
        for another cache, or a corrupt one that passed its checksum).
        """
        used = table.numel()
        if table.dim() != 2 or table.shape[0] != self.kv_heads or used > self.pool.max_blocks:
            raise ValueError("persisted block table does not fit this cache's shape")
        if not 0 <= n_tokens <= table.shape[1] * self.block_tokens or n_tokens <= (table.shape[1] - 1) * self.block_tokens and used:
            raise ValueError("persisted token count does not match the block table")
        for name, (shape, dtype) in self.pool.specs.items():
            t = storage.get(name)
            if t is None or t.dtype != dtype or tuple(t.shape) != (used, self.block_tokens, *shape):
                raise ValueError(f"persisted pool field {name} does not match this cache's format")
        if used and (int(table.min()) < 0 or int(table.max()) >= used):
            raise ValueError("persisted block table points outside the pool")
        self.pool.storage = {name: storage[name].to(self.pool.device) for name in self.pool.specs}
        self.pool.free, self.pool.shared = [], False
        self.table = table.to(self.pool.device, torch.long)
        self.n_tokens = n_tokens

    def shrink(self) -> None:
        """Drop free blocks from the pool (renumbering the used ones), e.g. before a snapshot."""
        storage, table = self.export()
        self.pool.storage, self.pool.free, self.pool.shared = storage, [], False
        self.table = table

    def fork(self) -> PagedTokens:
        """A copy sharing this one's blocks until either writes to them (`BlockPool.fork`)."""
        twin = object.__new__(PagedTokens)
        twin.__dict__.update(self.__dict__)
        twin.pool = self.pool.fork()
        return twin

    def export(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Used blocks only, renumbered `0..n-1` in table order, and the matching table."""
        order = self.table.flatten()
        storage = {name: t[order].contiguous() for name, t in self.pool.storage.items()}
        table = torch.arange(order.numel(), device=order.device).reshape(self.table.shape)
        return storage, table

    def nbytes(self) -> int:
        """Bytes held: pool storage (used and free blocks) plus the block table."""
        return self.pool.nbytes() + self.table.nbytes

    def used_blocks(self) -> int:
        return self.table.numel()

    def _ensure_blocks(self, n_tokens: int) -> None:
        needed = -(-n_tokens // self.block_tokens) - self.table.shape[1]
        if needed > 0:
            fresh = self.pool.allocate(needed * self.kv_heads)
            fresh_t = torch.tensor(fresh, dtype=torch.long, device=self.table.device).reshape(self.kv_heads, needed)
            self.table = torch.cat((self.table, fresh_t), dim=1)

    def _write(self, start: int, fields: dict[str, torch.Tensor]) -> None:
        m = next(iter(fields.values())).shape[1]
        rows = self._rows(torch.arange(start, start + m, device=self.table.device).expand(self.kv_heads, m))
        storage = self.pool.writable()
        for name, values in fields.items():
            _slot_rows(storage[name])[rows] = values


def _slot_rows(storage: torch.Tensor) -> torch.Tensor:
    """A field's storage `[blocks, block_tokens, ...]` as one row per physical slot, a view (raises
    rather than copying, so writes through it always reach the storage)."""
    return storage.view(-1, *storage.shape[2:])
